"""The loads: wrk, h2load and vegeta runs and what their reports say, and
the loads of the benchmark method by name."""

import csv
import os
import re
import subprocess

from .. import ROOT
from .procs import pin
from .stats import percentile

# Load 12's script (wrk's Lua).
EVENTS_SCRIPT = os.path.join(ROOT, "benches", "loads", "events.lua")


def parse_duration(s):
    m = re.match(r"([\d.]+)(us|ms|s|m)", s)
    if not m:
        return None
    v = float(m.group(1))
    return v * {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}[m.group(2)]


def wrk_argv(wrk, url, conns, seconds, threads=1, headers=(), script=None):
    """wrk's command line: `conns` connections on `threads` threads for
    `seconds`, with the latency distribution, each header of `headers` and
    the Lua `script` if given."""
    extra = [a for h in headers for a in ("-H", h)] + (["-s", script] if script else [])
    return [wrk, f"-t{threads}", f"-c{conns}", f"-d{seconds}s", "--latency", *extra, url]


def run_wrk(bins, port, path, conns, seconds, client_cpu, scheme="http", headers=(), script=None):
    url = f"{scheme}://127.0.0.1:{port}{path}"
    out = subprocess.run(
        pin(client_cpu, wrk_argv(bins["wrk"], url, conns, seconds, headers=headers, script=script)),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {**parse_wrk(out), "seconds": seconds}


def parse_wrk(out):
    """What wrk's report (with --latency) says: requests, their rate, the
    p50 and p99, errors (answers not 2xx or 3xx, and socket errors) and the
    bytes per second read."""
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    pct = {m.group(1): parse_duration(m.group(2)) for m in re.finditer(r"^\s+(50|90|99)%\s+(\S+)", out, re.M)}
    errors = 0
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if m:
        errors += int(m.group(1))
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if m:
        errors += sum(int(x) for x in m.groups())
    tr = re.search(r"Transfer/sec:\s+([\d.]+)([KMG]?B)", out)
    bytes_per_s = float(tr.group(1)) * {"B": 1, "KB": 1024, "MB": 1024**2, "GB": 1024**3}[tr.group(2)] if tr else 0
    return {
        "requests": requests,
        "rps": rate,
        "p50": pct.get("50"),
        "p90": pct.get("90"),
        "p99": pct.get("99"),
        "errors": errors,
        "bytes_per_s": bytes_per_s,
        "non2xx": errors,
    }


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
        pin(client_cpu, [bins["h2load"], "-c10", "-m10", "-D", str(seconds), *extra, f"http://127.0.0.1:{port}{path}"]),
        capture_output=True,
        text=True,
    ).stdout
    return parse_h2load(out)


def parse_h2load(out):
    """What h2load's report says: the requests that succeeded, their rate,
    the others as errors, and the mean time for a request (h2load gives no
    percentiles over a duration); a report that cannot be read is one
    error."""
    m = re.search(r"requests: (\d+) total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored", out)
    rate = re.search(r"finished in [\d.]+\w+, ([\d.]+) req/s", out)
    if not m or not rate:
        return {"requests": 0, "rps": 0, "errors": 1, "p50": None, "p99": None}
    done, ok = int(m.group(2)), int(m.group(3))
    mean = re.search(r"time for request:\s+\S+\s+\S+\s+(\S+)", out)
    return {
        "requests": ok,
        "rps": float(rate.group(1)),
        "errors": done - ok,
        "p50": parse_duration(mean.group(1)) if mean else None,
        "p99": None,
    }


def run_vegeta(bins, port, url_path, rate, seconds, client_cpu):
    """`rate` requests a second for `seconds`, sent whatever the answers'
    latency; what came back (`parse_vegeta`)."""
    attack = subprocess.Popen(
        pin(
            client_cpu,
            [
                bins["vegeta"],
                "attack",
                f"-rate={max(1, round(rate))}/s",
                f"-duration={seconds}s",
                "-timeout=30s",
                "-max-body=0",
            ],
        ),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    encode = subprocess.Popen(
        [bins["vegeta"], "encode", "--to=csv"], stdin=attack.stdout, stdout=subprocess.PIPE, text=True
    )
    attack.stdin.write(f"GET http://127.0.0.1:{port}{url_path}\n".encode())
    attack.stdin.close()
    attack.stdout.close()
    out, _ = encode.communicate()
    attack.wait()
    if attack.returncode != 0 or encode.returncode != 0:
        raise RuntimeError(f"vegeta exited {attack.returncode}, its encoder {encode.returncode}")
    return {**parse_vegeta(out, seconds), "rate": rate}


def parse_vegeta(text, seconds):
    """vegeta's results as `encode --to=csv` writes them (one request a
    line: when it was sent in ns, code, latency in ns, bytes out, bytes in,
    error, ...): requests sent, 2xx answers per second over the time from
    the first request sent to the last answer (the run's seconds at least:
    a queue still draining after the last request stretches it), the 2xx
    answers' p50 and p99, the 503s and every other failure (another
    status, or no answer)."""
    codes, good, first, last = [], [], None, None
    for row in csv.reader(text.splitlines()):
        if len(row) < 3:
            continue
        sent, code, latency = int(row[0]), int(row[1]), int(row[2])
        codes.append(code)
        first = sent if first is None else min(first, sent)
        last = sent + latency if last is None else max(last, sent + latency)
        if 200 <= code < 300:
            good.append(latency / 1e9)
    good.sort()
    span = max(seconds, (last - first) / 1e9) if codes else seconds
    return {
        "sent": len(codes),
        "goodput": len(good) / span,
        "span": span,
        "p50": percentile(good, 0.50),
        "p99": percentile(good, 0.99),
        "shed": sum(c == 503 for c in codes),
        "errors": sum(not (200 <= c < 300) and c != 503 for c in codes),
    }


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
        loads[EVENTS_LOAD] = lambda b, c: lambda cpu: run_wrk(b, c.port, "/events", 70, d, cpu, script=EVENTS_SCRIPT)
    if 9 in args.loads:
        loads[TLS_KEEP_ALIVE] = lambda b, c: lambda cpu: run_wrk(b, c.tls_port, "/", 70, d, cpu, "https")
    if 10 in args.loads:
        loads[TLS_HANDSHAKES] = lambda b, c: (
            lambda cpu: run_wrk(b, c.tls_port, "/", 70, d, cpu, "https", ["Connection: close"])
        )
    return loads
