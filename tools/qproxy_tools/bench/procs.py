"""The processes a benchmark runs and what it reads of them: ports (free,
and those a load left in TIME-WAIT), waits, CPU time and memory from
/proc, CPU pinning, the app."""

import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.request

TICK = os.sysconf("SC_CLK_TCK")
HELLO = b"Hello World!\n"
# The TIME-WAIT connections below which the next open load starts.
TIME_WAIT_SETTLED = 1000


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def time_wait_sockets():
    """The machine's TCP connections in TIME-WAIT."""
    out = subprocess.run(["ss", "-Htan", "state", "time-wait"], capture_output=True, text=True).stdout
    return len(out.splitlines())


def ports_settled(timeout=120):
    """Waits until the connections an open load closed have left TIME-WAIT
    (a load above capacity holds thousands at once, each through qproxy to
    the app: two loopback ports each), so that the next run finds ports to
    bind and to connect from."""
    deadline = time.monotonic() + timeout
    while time_wait_sockets() > TIME_WAIT_SETTLED:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{time_wait_sockets()} connections still in TIME-WAIT after {timeout} s")
        time.sleep(1)


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


def check_app_answers(port):
    status, body = get(port)
    if status != 200 or body != HELLO:
        raise RuntimeError(f"wrong answer through port {port}: {status} {body!r}")


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


def pin(cpu, argv):
    return ["taskset", "-c", str(cpu)] + argv if cpu is not None else argv


def in_cgroup(cgroup, argv):
    """`argv` in `cgroup` from its first instruction (its sockets are the
    cgroup's), keeping its PID."""
    return ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', cgroup] + argv


def with_knative_certs(certs, argv):
    """`argv` in a mount namespace of its own where `certs` is mounted
    where Knative mounts the queue-proxy's certificate, which Knative's Go
    queue-proxy reads from that fixed path only (root; the process keeps
    its PID, so its CPU is counted as before)."""
    script = (
        "mount -t tmpfs tmpfs /var/lib && mkdir -p /var/lib/knative/certs && "
        f'cp {certs}/tls.crt {certs}/tls.key /var/lib/knative/certs/ && exec "$@"'
    )
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"] + argv


def start_app(bins, variant):
    port = free_port()
    cpu = 1 if variant == "pinned" else None
    p = subprocess.Popen(
        pin(cpu, [bins["app"], "-addr", f"127.0.0.1:{port}"]),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    wait_for("the app", lambda: get(port)[0] == 200)
    return p, port


def stop(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait()
