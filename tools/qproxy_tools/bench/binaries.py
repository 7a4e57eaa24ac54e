"""What the harness runs, built or installed: qproxy, the app, Knative's Go
queue-proxy, the proxies and load generators, the TLS pair, the eBPF
accelerator's agent."""

import atexit
import os
import shutil
import subprocess
import sys
import tempfile

from .. import ROOT
from .callgrind import COUNTED
from .installs import envoy_bin, require_tools
from .loads import TLS_LOAD_NUMBERS


def qproxy(given):
    """The qproxy binary `given` (--qproxy-bin), or the workspace's, built
    --release."""
    if given:
        return given
    subprocess.run(["cargo", "build", "--release", "-p", "qproxy", "--locked"], cwd=ROOT, check=True)
    return os.path.join(ROOT, "target", "release", "qproxy")


def app():
    """benches/app, built."""
    out = os.path.join(ROOT, "target", "bench", "app")
    subprocess.run(["go", "build", "-o", out, "."], cwd=os.path.join(ROOT, "benches", "app"), check=True)
    return out


def build(args):
    """Paths of the binaries, building what is missing."""
    out = {"qproxy": qproxy(args.qproxy_bin), "qproxy-env": args.qproxy_env, "app": app()}
    if args.base_bin:
        out["qproxy-base"] = args.base_bin
    if "go-qp" in args.contenders:
        go_qp = os.path.join(ROOT, "target", "oracle", "queue-v0.42.2")
        subprocess.run([os.path.join(ROOT, "tests", "oracle", "build.sh"), "v0.42.2", go_qp], check=True)
        out["go-qp"] = go_qp
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
    if "haproxy-splice" in args.contenders and "haproxy" not in proxies:
        proxies.append("haproxy")
    tools = (
        ["wrk"]
        + (["h2load"] if 3 in args.loads or 11 in args.loads or counted else [])
        + (["valgrind", "callgrind_control"] if counted else [])
        + (["openssl"] if tls else [])
        + proxies
    )
    out.update(require_tools(tools, "harness"))
    if tls:
        out["certs"] = make_certs(os.path.join(ROOT, "target", "bench", "certs"))
    return out


def make_certs(folder):
    """A self-signed ECDSA P-256 pair for Knative's data-plane name, as
    tls.crt and tls.key in `folder` (Knative's certificates are ECDSA
    P-256 too); the folder's path."""
    os.makedirs(folder, exist_ok=True)
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            os.path.join(folder, "tls.key"),
            "-out",
            os.path.join(folder, "tls.crt"),
            "-days",
            "2",
            "-subj",
            "/CN=data-plane.knative.dev",
            "-addext",
            "subjectAltName=DNS:data-plane.knative.dev,DNS:kn-user-default",
        ],
        check=True,
        capture_output=True,
    )
    return folder


def accel_setup():
    """The eBPF accelerator's agent (built with its programs), a cgroup for
    the qproxy-accel contender's app and qproxy, and a bpffs of the run's
    own for the agent's pins; removed when the harness exits."""
    if os.geteuid() != 0:
        sys.exit("harness: the qproxy-accel contender loads BPF programs: run as root")
    subprocess.run(
        ["cargo", "build", "--release", "-p", "qproxy-accel", "--features", "bpf", "--locked"], cwd=ROOT, check=True
    )
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
    return {
        "agent": os.path.join(ROOT, "target", "release", "qproxy-accel"),
        "cgroup": cgroup,
        "pins": os.path.join(pins, "qproxy-accel"),
    }
