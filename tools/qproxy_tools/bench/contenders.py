"""The contenders: each proxy (or none) in front of the app, started per
measurement. Each proxy's configuration is a file of its own in
benches/contenders/, its fields in braces filled in here."""

import json
import os
import resource
import shutil
import signal
import subprocess
import tempfile

from .. import ROOT, oci_image
from .procs import free_port, get, get_tls, in_cgroup, pin, stop, wait_for, with_knative_certs

CONFIGS = os.path.join(ROOT, "benches", "contenders")


def config(name):
    """A contender's configuration template, from benches/contenders/."""
    with open(os.path.join(CONFIGS, name)) as f:
        return f.read()


def knative_env(user_port, main_port, cc=0, metrics=True):
    """A default Knative revision's sidecar environment (the file qproxy's
    tests and the conformance runner read), on the harness's ports."""
    with open(os.path.join(ROOT, "crates", "core", "knative-env.json")) as f:
        file = json.load(f)
    env = {**file["common"], **file["classic"]}
    env.update(
        {
            "SERVING_POD": "hello-00001-deployment-bench",
            "QUEUE_SERVING_PORT": str(main_port),
            "QUEUE_SERVING_TLS_PORT": str(free_port()),
            "USER_PORT": str(user_port),
            "CONTAINER_CONCURRENCY": str(cc),
            "SERVING_READINESS_PROBE": json.dumps(
                {"tcpSocket": {"port": user_port, "host": "127.0.0.1"}, "successThreshold": 1}, separators=(",", ":")
            ),
            "SERVING_REQUEST_METRICS_BACKEND": "prometheus" if metrics else "",
            "PATH": os.environ.get("PATH", ""),
        }
    )
    return env


def descriptor_cap():
    """The most descriptors a process started from here may open: the
    limit's hard cap (which root cannot raise on these machines)."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)[1]


class Contender:
    """One proxy (or none) in front of the app; started per measurement."""

    def __init__(self, name, bins, variant, cc=0, tls=False, connections=4096):
        self.name, self.bins, self.variant, self.cc, self.tls = name, bins, variant, cc, tls
        # The connections nginx and HAProxy are configured to take (the
        # others take as many as their descriptors allow).
        self.connections = connections
        self.procs, self.tmp = [], None
        self.port = self.h2_port = self.tls_port = None
        # A command the proxy runs under (callgrind, for its instructions);
        # nginx then runs as one process, its master serving.
        self.wrap = []
        # The qproxy-accel contender runs an app of its own, in the
        # accelerator's cgroup, and the agent beside it.
        self.app, self.agent, self.agent_log = None, None, None

    def capacity(self):
        """The most connections the contender is set to take: those asked
        for, but for HAProxy, which refuses to start unless two descriptors
        a connection (and some to spare) fit under the cap."""
        if self.name in ("haproxy", "haproxy-splice"):
            return min(self.connections, (descriptor_cap() - 100) // 2)
        return self.connections

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
            env.update(
                QPROXY_ADMIN_PORT="0", QPROXY_STATS_PORT="0", QPROXY_METRICS_PORT="0", QPROXY_DRAIN_QUIET_SECONDS="0"
            )
            # As the image runs it (glibc's heap settings).
            env.update(kv.split("=", 1) for kv in oci_image.IMAGES["qproxy"].get("env", []))
            if self.tls:
                env.update(QUEUE_SERVING_TLS_PORT=str(self.tls_port), QPROXY_CERT_DIR=self.bins["certs"])
            if name == "qproxy":
                env.update(kv.split("=", 1) for kv in self.bins.get("qproxy-env", []))
            if name == "qproxy-nosplice":
                env["QPROXY_OPTION_NO_SPLICE"] = "on"
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
            tls = config("nginx-tls.conf").format(tls_port=self.tls_port, certs=self.bins["certs"]) if self.tls else ""
            text = config("nginx.conf").format(
                tmp=self.tmp,
                port=self.port,
                h2_port=self.h2_port,
                app=app_port,
                tls=tls,
                connections=self.connections,
                files=descriptor_cap(),
            )
            if self.wrap:
                text = text.replace("master_process on;", "master_process off;")
            with open(conf, "w") as f:
                f.write(text)
            argv, env = [self.bins["nginx"], "-c", conf, "-p", self.tmp], dict(os.environ)
        elif name in ("haproxy", "haproxy-splice"):
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
                tls = config("haproxy-tls.cfg").format(tls_port=self.tls_port, pem=pem)
            conf = os.path.join(self.tmp, "haproxy.cfg")
            with open(conf, "w") as f:
                splice = "    option splice-auto" if name == "haproxy-splice" else ""
                f.write(
                    config("haproxy.cfg").format(
                        port=self.port,
                        h2_port=self.h2_port,
                        app=app_port,
                        tls=tls,
                        splice=splice,
                        connections=self.capacity(),
                        files=descriptor_cap(),
                    )
                )
            argv, env = [self.bins["haproxy"], "-db", "-f", conf], dict(os.environ)
        elif name == "envoy":
            self.tmp = tempfile.mkdtemp(prefix="qproxy-bench-envoy-")
            tls = config("envoy-tls.yaml").format(tls_port=self.tls_port, certs=self.bins["certs"]) if self.tls else ""
            conf = os.path.join(self.tmp, "envoy.yaml")
            text = config("envoy.yaml").format(port=self.port, app=app_port, tls=tls)
            with open(conf, "w") as f:
                f.write(text)
            # One worker, as the other proxies run one; no hot restart, so
            # that runs side by side share no memory segment.
            argv = [
                self.bins["envoy"],
                "-c",
                conf,
                "--concurrency",
                "1",
                "--disable-hot-restart",
                "--log-level",
                "critical",
            ]
            env = dict(os.environ)
        else:
            raise ValueError(name)
        p = subprocess.Popen(
            pin(cpu, self.wrap + argv),
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
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
        self.app = subprocess.Popen(
            in_cgroup(acc["cgroup"], pin(cpu, [self.bins["app"], "-addr", f"127.0.0.1:{port}"])),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_for("the accelerated app", lambda: get(port)[0] == 200)
        self.agent_log = tempfile.NamedTemporaryFile(prefix="qproxy-bench-agent-", suffix=".log")
        # This machine's kernel fails the self-test's fionread-tcp and
        # blocking-read checks (benches/README.md): accepted here, as the
        # Go app never asks FIONREAD and never reads a blocking socket.
        self.agent = subprocess.Popen(
            [
                acc["agent"],
                "--cgroup",
                acc["cgroup"],
                "--pin-dir",
                acc["pins"],
                "--metrics-addr",
                "127.0.0.1:0",
                "--scan-interval",
                "0.1",
                "--allow-failed-check",
                "fionread-tcp",
                "--allow-failed-check",
                "blocking-read",
            ],
            stdout=subprocess.DEVNULL,
            stderr=self.agent_log,
            start_new_session=True,
        )
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
