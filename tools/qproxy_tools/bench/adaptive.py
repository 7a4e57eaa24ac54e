"""qproxy's adaptive-concurrency option under overload, side by side: the
app alone (direct), qproxy as Knative runs a revision without
containerConcurrency (no limit), and the same with the option on, in front
of an app whose CPU per request grows with the requests it holds
(`/contended` of benches/app), or does not. See benches/README.md.

Two loads:

- closed: `--connections` connections, each sending its next request once
  answered (wrk), for each of the app's knees (`--knees`): what the
  option gains when an app slows under what it holds, and that it gains
  nothing when it does not (knee 0);
- open: requests at fixed rates (vegeta, whose rate does not wait on the
  answers), below, at and above the app's capacity, for knees 0 and 64:
  goodput, latency, and the `503`s once the queue behind the limit is full.

    benches/adaptive.py           # writes its section of benches/RESULTS.md and benches/adaptive.svg
    benches/adaptive.py --smoke   # one short round; fails on an error or a limit out of its bounds

Needs what benches/harness.py needs for load 1 (cargo, go, taskset, wrk);
installs vegeta from the Go module proxy into target/tools.
"""

import os
import sys

from .. import arguments, plotting
from . import binaries, procs
from .adaptive_plan import CAPACITY_CONNECTIONS, CONTENDERS, OPEN_KNEES, OVERFLOW, RATES, open_runs, path
from .adaptive_report import ms, problems, section, write
from .contenders import Contender
from .installs import require_tools, vegeta_bin
from .loads import run_vegeta, run_wrk
from .pages import BENCHES, RESULTS, run_facts
from .plots import adaptive_picture
from .scrape import Trace

# The adaptive limit's metric, as qproxy's metrics port serves it.
LIMIT = "qproxy_adaptive_concurrency_limit{"


def build(args):
    """What the benchmark runs: qproxy, the app, wrk and vegeta."""
    bins = {"qproxy": binaries.qproxy(args.qproxy_bin), "app": binaries.app()}
    bins.update(require_tools(["wrk"], "adaptive"))
    bins["vegeta"] = vegeta_bin()
    return bins


def contender(bins, name):
    """The harness's contender for `name`, and the port its limit is read
    on: both qproxys are the harness's `qproxy` (Knative's environment for a
    revision without containerConcurrency, as the image runs it), the
    option and a known metrics port set for the adaptive one."""
    if name == "direct":
        return Contender("direct", bins, "pinned"), None
    metrics = procs.free_port() if name == "qproxy-adaptive" else None
    env = [f"QPROXY_METRICS_PORT={metrics}", "QPROXY_OPTION_ADAPTIVE_CONCURRENCY=on"] if metrics else []
    return Contender("qproxy", {**bins, "qproxy-env": env}, "pinned"), metrics


def measured(bins, name, load):
    """Starts a fresh app and contender `name` in front of it, runs
    `load(port)` against it (the limit traced with the option), stops both;
    the load's result, with the limit at its end and its trace. The app is
    started afresh each time: one that was overloaded goes on with what it
    held after its clients gave up, and would slow the next measurement."""
    app, app_port = procs.start_app(bins, "pinned")
    c, metrics = contender(bins, name)
    try:
        c.start(app_port)
        tracer = Trace(metrics, LIMIT) if metrics else None
        if tracer:
            tracer.start()
        # The first seconds, the limit learning, are measured too: a
        # revision's pods meet their load cold.
        r = load(c.port)
        if tracer:
            points = tracer.stop()
            r["limit"] = points[-1][1] if points else None
            r["trace"] = points
    finally:
        c.stop()
        procs.stop(app)
    return r


def closed(args, bins, knee):
    """{contender: [round results]} of the closed load against `knee`."""
    results = {}
    for rnd in range(args.rounds):
        turn = rnd % len(CONTENDERS)
        for name in CONTENDERS[turn:] + CONTENDERS[:turn]:
            r = measured(
                bins,
                name,
                lambda port: run_wrk(bins, port, path(args, knee), args.connections, args.seconds, 0),
            )
            r["goodput"] = (r["requests"] - r["errors"]) / r["seconds"]
            results.setdefault(name, []).append(r)
            print(
                f"  closed, knee {knee:3}, {name:16} round {rnd + 1}: {r['goodput']:8.0f} 2xx/s  "
                f"p50 {ms(r['p50'])}  p99 {ms(r['p99'])}  errors {r['errors']}"
                + (f"  limit {r['limit']}" if r.get("limit") else ""),
                flush=True,
            )
    return results


def capacity(args, bins, knee):
    """The app's own rate at `knee`, with CAPACITY_CONNECTIONS at once,
    after a second of warming up: what the open load's rates are fractions
    of."""
    app, app_port = procs.start_app(bins, "pinned")
    try:
        run_wrk(bins, app_port, path(args, knee), CAPACITY_CONNECTIONS, 1, 0)
        r = run_wrk(bins, app_port, path(args, knee), CAPACITY_CONNECTIONS, args.seconds, 0)
    finally:
        procs.stop(app)
    return (r["requests"] - r["errors"]) / r["seconds"]


def open_loop(args, bins, knee, cap):
    """{(rate factor, contender): [round results]} of the open load."""
    results = {}
    for rnd in range(args.open_rounds):
        for factor, name in open_runs(args):
            procs.ports_settled()
            r = measured(
                bins,
                name,
                lambda port, factor=factor: run_vegeta(bins, port, path(args, knee), cap * factor, args.seconds, 0),
            )
            results.setdefault((factor, name), []).append(r)
            print(
                f"  open, knee {knee:3}, {factor:.1f}× capacity ({cap * factor:,.0f}/s), {name:16} round "
                f"{rnd + 1}: sent {r['sent'] / args.seconds:6.0f}/s, {r['goodput']:6.0f} 2xx/s  "
                f"p50 {ms(r['p50'])}  p99 {ms(r['p99'])}  "
                f"503 {r['shed']}  errors {r['errors']}" + (f"  limit {r['limit']}" if r.get("limit") else ""),
                flush=True,
            )
    return results


def run(args, bins):
    """Every load: {"closed": {knee: ...}, "capacity": {knee: ...}, "open": {knee: ...}}."""
    out = {"closed": {}, "capacity": {}, "open": {}}
    for knee in args.knees:
        out["closed"][knee] = closed(args, bins, knee)
    for knee in args.open_knees:
        out["capacity"][knee] = cap = capacity(args, bins, knee)
        print(f"  capacity, knee {knee}: {cap:,.0f} requests a second", flush=True)
        out["open"][knee] = open_loop(args, bins, knee, cap)
    return out


def parse_args(argv=None):
    """The command line (`argv`, sys.argv's by default), its knees as
    lists and the rates of its open load set; the smoke's one short round
    in place of what was asked."""
    ap = arguments.parser("benches/adaptive.py", __doc__)
    ap.add_argument("--qproxy-bin", help="use this qproxy binary instead of building --release")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--connections", type=int, default=200)
    ap.add_argument("--open-rounds", type=int, default=1, help="rounds of the open load")
    ap.add_argument("--work", type=int, default=1000000)
    ap.add_argument("--knees", default="0,256,64,16", help="the app's knees for the closed load (0: no growth)")
    ap.add_argument("--open-knees", default=",".join(map(str, OPEN_KNEES)), help="the knees of the open load")
    ap.add_argument("--smoke", action="store_true", help="one short round; nothing written")
    args = ap.parse_args(argv)
    args.knees = [int(k) for k in args.knees.split(",") if k]
    args.open_knees = [int(k) for k in args.open_knees.split(",") if k]
    if args.smoke:
        args.rounds, args.open_rounds, args.seconds, args.knees, args.open_knees = 1, 1, 3, [64], [64]
    # The smoke's open load stays below capacity, where no 503 may come.
    args.rates = (0.5,) if args.smoke else RATES
    args.overflow = None if args.smoke else OVERFLOW
    return args


def main():
    args = parse_args()
    # The commit and the machine as the run begins: what it measures.
    facts = run_facts()
    if not args.smoke:
        plotting.with_matplotlib(sys.argv[0])
    bins = build(args)
    results = run(args, bins)
    if args.smoke:
        found = problems(results)
        for problem in found:
            print(f"adaptive: {problem}", file=sys.stderr)
        return 1 if found else 0
    adaptive_picture(args, results, os.path.join(BENCHES, "adaptive.svg"))
    write(section(args, facts, results))
    print(f"written: {RESULTS} and benches/adaptive.svg")
    return 0
