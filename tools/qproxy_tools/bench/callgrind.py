"""Instructions per request, counted by callgrind: each proxy started
under valgrind, counting from when it serves, over N and 2N requests; the
difference, divided, leaves start-up and shutdown out."""

import os
import re
import shutil
import signal
import subprocess
import tempfile

from .contenders import Contender
from .loads import GRPC_HEADERS, GRPC_PATH
from .procs import start_app, stop

# The contenders whose instructions are counted: the proxies that run
# under valgrind (not Go's runtime).
COUNTED = ("qproxy", "qproxy-base", "qproxy-nometrics", "nginx", "haproxy", "envoy")


# The requests whose instructions are counted: load 1's (HTTP/1.1 keep-alive
# `GET /`) and load 11's gRPC unary call over h2c.
COUNTED_REQUESTS = ("load 1", "gRPC unary")


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
                    (t1, p1), (t2, p2) = [
                        count_instructions(name, bins, app_port, n, request)
                        for n in (args.instructions, 2 * args.instructions)
                    ]
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
            subprocess.run(
                [bins["callgrind_control"], "--instr=on", str(c.procs[0].pid)],
                capture_output=True,
                text=True,
                check=True,
                timeout=60,
            )
            if request == "gRPC unary":
                load = [
                    "-d",
                    bins["grpc-request"],
                    *(a for h in GRPC_HEADERS for a in ("-H", h)),
                    f"http://127.0.0.1:{c.h2_port}{GRPC_PATH}",
                ]
            else:
                load = ["--h1", f"http://127.0.0.1:{c.port}/"]
            done = subprocess.run(
                [bins["h2load"], "-n", str(n), "-c", "4", *load], capture_output=True, text=True, check=True
            ).stdout
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
# not every line of its concern. The body framing both roles share
# (qproxy_transport::wire::framing) counts where each half of it is used on
# the counted requests: its encoder with the response written, its decoder
# with the exchange that reads the app's response body.
PARTS = (
    ("the client's head read and parsed", r"qproxy_transport::server::parse|httparse::|http::header::name|http::uri::"),
    (
        "the response head written",
        r"qproxy_transport::server::encode|qproxy_transport::wire::framing::Encoder|qproxy_transport::wire::title_case|"
        r"qproxy_transport::wire::date",
    ),
    ("header maps", r"http::header::map"),
    (
        "the exchange with the app",
        r"qproxy_transport::client|qproxy_transport::connector|qproxy_transport::wire::framing::Decoder|"
        r"qproxy_transport::pool|qproxy::proxy::",
    ),
    ("request metrics", r"metrics_exporter_prometheus|metrics::|quanta::|qproxy_observe::request_metrics"),
    (
        "the layers",
        r"qproxy::layers::|qproxy::stack|qproxy_breaker::|qproxy_core::|qproxy_observe::|"
        r"qproxy_autoscaler_client::",
    ),
    ("the connections' loops", r"qproxy_transport::|qproxy::server::"),
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
    text = subprocess.run(
        [annotate, "--threshold=100", "--auto=no", "--inclusive=no", out], capture_output=True, text=True
    ).stdout
    return parts_of(text)


def parts_of(annotated):
    """{part: instructions} of `callgrind_annotate --inclusive=no`'s
    report: each function's own instructions, in the first part of PARTS
    whose pattern its name matches, or "other"."""
    parts = {}
    for line in annotated.splitlines():
        m = re.match(r"^\s*([\d,]+)\s+(?:\(\s*[\d.]+%\)\s+)?\S*?:(.*?)( \[.*\])?$", line)
        if not m or "PROGRAM TOTALS" in line:
            continue
        function = m.group(2)
        part = next((p for p, pattern in PARTS if re.search(pattern, function)), "other")
        parts[part] = parts.get(part, 0) + int(m.group(1).replace(",", ""))
    return parts
