"""The side-by-side benchmark: qproxy against the app alone (direct),
Knative's Go queue-proxy v0.42.2, nginx, HAProxy and Envoy, on loopback, same
app, same loads, same run. See benches/README.md.

    benches/harness.py              # everything; writes benches/side-by-side.md and RESULTS.md's section
    benches/harness.py --smoke      # one short round of load 1, qproxy and direct

Needs: cargo, go, taskset; installs from Debian (as root) what it runs and lacks: wrk, h2load, nginx, haproxy,
valgrind (the instruction counts);
for the TLS loads, openssl, and root with unshare for the Go queue-proxy
(its certificate path is fixed: it gets a mount namespace of its own).
"""

import os
import resource
import subprocess
import sys
import time

from .. import ROOT, arguments, plotting
from .binaries import build
from .callgrind import run_instructions
from .contenders import Contender
from .cost import measured
from .loads import TLS_HANDSHAKES, TLS_KEEP_ALIVE, run_wrk, throughput_loads
from .pages import BENCHES, run_facts
from .plots import instructions_picture, load_picture
from .procs import TICK, check_app_answers, cpu_ticks, rss_kib, start_app, stop
from .report import picture_link, report, svg_name, write
from .scale import IDLE_FOR, open_idle, run_scale
from .scale import report_lines as scale_lines
from .tunnel import report_lines, run_tunnel


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
                            print(
                                "  go-qp skipped on the TLS loads: its certificate path needs a mount namespace (root)",
                                flush=True,
                            )
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
                        print(
                            f"  {variant:9} {load_name:18} {name:17} round {rnd + 1}: "
                            f"{r['rps']:10.0f} req/s  errors {r['errors']}"
                            + (f"  {r['cpu_us']:.1f} µs CPU/req" if r.get("cpu_us") else "")
                            + f"  steal {r['steal'] * 100:.0f}%",
                            flush=True,
                        )
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
                print(
                    f"  cc={cc:<3} {name:17} {r['rps']:8.0f} req/s (ideal {cc * 100}), non-2xx {r['non2xx']}",
                    flush=True,
                )
    finally:
        stop(app)
    return results


def run_footprint(args, bins):
    """Loads 6 to 8: memory idle and with 1,000 and 10,000 connections
    (each answered once, then idle for IDLE_FOR seconds), start-up, idle CPU."""
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
                time.sleep(IDLE_FOR)
                busy_rss = rss_kib(c.pids())
                rss_10000 = None
                # nginx and HAProxy are configured for 4,096 connections.
                if name.startswith("qproxy") or name == "go-qp":
                    socks += open_idle(c.port, 9000)
                    time.sleep(IDLE_FOR)
                    rss_10000 = rss_kib(c.pids())
                for s in socks:
                    s.close()
            finally:
                c.stop()
            results[name] = {
                "startup_ms": startup * 1e3,
                "idle_rss": idle_rss,
                "rss_1000": busy_rss,
                "rss_10000": rss_10000,
                "idle_cpu_ms": idle_cpu * 1e3,
            }
            print(
                f"  {name:17} start {startup * 1e3:.1f} ms, RSS idle {idle_rss} KiB, "
                f"with 1000 conns {busy_rss} KiB, idle CPU {idle_cpu * 1e3:.0f} ms/{args.idle_seconds}s",
                flush=True,
            )
    finally:
        stop(app)
    return results


def run_allocations():
    """Allocations per proxied request, counted in-process (from the
    workspace's source, not --qproxy-bin): benches/allocations.rs."""
    out = subprocess.run(
        ["cargo", "bench", "-p", "qproxy", "--bench", "allocations", "--locked"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return parse_allocations(out)


def parse_allocations(out):
    """The counts benches/allocations.rs printed, one a line after
    "allocations per request: "."""
    return [line.split(": ", 1)[1] for line in out.splitlines() if line.startswith("allocations per request: ")]


def parse_args(argv=None):
    """The command line (`argv`, sys.argv's by default), its lists split;
    the smoke's one short round in place of what was asked."""
    ap = arguments.parser("benches/harness.py", __doc__)
    ap.add_argument(
        "--smoke", action="store_true", help="one short round of load 1, qproxy and direct; nothing written"
    )
    ap.add_argument("--qproxy-bin", help="use this qproxy binary instead of building --release")
    ap.add_argument(
        "--base-bin",
        help="a second qproxy binary, the contender qproxy-base: a change measured "
        "against the build before it, side by side",
    )
    ap.add_argument(
        "--qproxy-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set in the environment of the contender qproxy only (not qproxy-base): a setting "
        "measured against its default",
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--idle-seconds", type=int, default=30)
    ap.add_argument("--contenders", default="direct,qproxy,qproxy-nometrics,go-qp,nginx,haproxy,envoy")
    ap.add_argument("--loads", default="1,2,3,11,12,4,5,6,9,10,13,14")
    ap.add_argument("--variants", default="pinned,unpinned")
    ap.add_argument(
        "--instructions",
        type=int,
        default=20000,
        metavar="N",
        help="count each proxy's instructions per request under callgrind over N and 2N requests (0: not at all)",
    )
    args = ap.parse_args(argv)
    if args.smoke:
        args.rounds, args.seconds, args.contenders, args.loads, args.variants = 1, 2, "direct,qproxy", "1", "unpinned"
    args.contenders = args.contenders.split(",")
    if args.base_bin and "qproxy-base" not in args.contenders:
        args.contenders.append("qproxy-base")
    args.loads = [int(x) for x in args.loads.split(",")]
    args.variants = args.variants.split(",")
    return args


def main():
    args = parse_args()
    # The commit and the machine as the run begins: what it measures.
    facts = run_facts()
    if not args.smoke:
        # Before any load runs: the pictures need matplotlib, and getting
        # it may start this script again.
        plotting.with_matplotlib(sys.argv[0])

    # Load 14's 18,000 connections, in this process and the proxies it
    # starts.
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
    tunnel = None
    if 13 in args.loads:
        print("== load 13", flush=True)
        tunnel = run_tunnel(args, bins)
    scale = None
    if 14 in args.loads:
        print("== load 14", flush=True)
        scale = run_scale(args, bins)
    allocations = instructions = None
    if not args.smoke:
        print("== allocations", flush=True)
        allocations = run_allocations()
    if not args.smoke and args.instructions:
        print("== instructions", flush=True)
        instructions = run_instructions(args, bins)
    table = report(args, throughput, concurrency, footprint, allocations, instructions)
    if tunnel:
        table += "\n" + "\n".join(report_lines(tunnel))
    if scale:
        table += "\n" + "\n".join(scale_lines(scale))
    print(table)
    failed = [k for k, rounds in throughput.items() if any(r["errors"] for r in rounds)]
    if args.smoke:
        sys.exit(1 if failed else 0)

    command = "benches/harness.py " + " ".join(sys.argv[1:])
    pictures = []
    for load in throughput_loads(args):
        pictures.append(picture_link(load))
        load_picture(args, throughput, load, os.path.join(BENCHES, svg_name(load)))
    if instructions and instructions_picture(instructions, os.path.join(BENCHES, "instructions.svg")):
        pictures.append("[instructions by part](instructions.svg)")
    write(args, command, facts, table, throughput, pictures)
    print("written: benches/side-by-side.md, RESULTS.md's section and a picture per load")
