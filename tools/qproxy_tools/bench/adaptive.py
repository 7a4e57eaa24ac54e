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

import csv
import os
import subprocess
import sys
import threading
import time
import urllib.request

from .. import ROOT, arguments, plotting
from . import binaries, procs
from .contenders import Contender
from .installs import DEBIAN_PACKAGES, install_debian, tool_path
from .loads import run_wrk
from .report import BENCHES, between_markers, med, run_facts

CONTENDERS = ("direct", "qproxy", "qproxy-adaptive")
RESULTS = os.path.join(BENCHES, "RESULTS.md")
BEGIN, END = "<!-- adaptive:begin -->", "<!-- adaptive:end -->"
LIMIT = "qproxy_adaptive_concurrency_limit{"
# The limiter's bounds (docs/options.md).
LIMIT_BOUNDS = (1, 1000)
# The open load's rates, times the app's capacity, and the knees it runs
# against.
RATES = (0.5, 1.0, 1.5)
# A rate at which the queue behind the limit fills within a run (10,000
# requests more than the app serves): with the option only, since without
# it nothing queues in qproxy.
OVERFLOW = 4.0
OPEN_KNEES = (0, 64)
# The connections that measure the app's capacity: few enough that the
# app holds next to nothing, enough to keep its core busy.
CAPACITY_CONNECTIONS = 4
# The TIME-WAIT connections below which the next open run starts.
TIME_WAIT_SETTLED = 1000
VEGETA = "github.com/tsenart/vegeta/v12"
VEGETA_VERSION = "v12.13.0"


def build(args):
    bins = {"qproxy": binaries.qproxy(args.qproxy_bin), "app": binaries.app()}
    if not tool_path("wrk"):
        install_debian([DEBIAN_PACKAGES["wrk"]])
    bins["wrk"] = tool_path("wrk") or sys.exit("adaptive: wrk is not installed (Debian: wrk)")
    bins["vegeta"] = vegeta_bin()
    return bins


def vegeta_bin():
    """vegeta, built from the Go module proxy into target/tools once."""
    folder = os.path.join(ROOT, "target", "tools", f"vegeta-{VEGETA_VERSION}")
    binary = os.path.join(folder, "vegeta")
    if not os.path.exists(binary):
        print(f"adaptive: installing vegeta {VEGETA_VERSION} (Go module proxy) into {folder}", file=sys.stderr)
        subprocess.run(["go", "install", f"{VEGETA}@{VEGETA_VERSION}"], env={**os.environ, "GOBIN": folder}, check=True)
    return binary


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


def scrape_limit(metrics):
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=2) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(LIMIT):
                return int(float(line.rsplit(" ", 1)[1]))
    return None


class LimitTrace(threading.Thread):
    """The adaptive limit, read from the metrics port every 100 ms."""

    def __init__(self, metrics):
        super().__init__(daemon=True)
        self.metrics, self.points, self.done = metrics, [], threading.Event()

    def run(self):
        start = time.monotonic()
        while not self.done.wait(0.1):
            try:
                limit = scrape_limit(self.metrics)
            except OSError:
                continue
            if limit is not None:
                self.points.append((time.monotonic() - start, limit))

    def stop(self):
        self.done.set()
        self.join()
        return self.points


def path(args, knee):
    return f"/contended?work={args.work}&knee={knee}"


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
        tracer = LimitTrace(metrics) if metrics else None
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


def run_vegeta(bins, port, url_path, rate, seconds, client_cpu):
    """`rate` requests a second for `seconds`, sent whatever the answers'
    latency; what came back (`parse_vegeta`)."""
    attack = subprocess.Popen(
        procs.pin(
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


def percentile(ordered, q):
    """The `q` quantile of an ordered list (nearest rank), None if empty."""
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


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


def open_runs(args):
    """(rate factor, contender) of each open run, in order."""
    runs = [(factor, name) for factor in args.rates for name in ("qproxy", "qproxy-adaptive")]
    return runs + ([(args.overflow, "qproxy-adaptive")] if args.overflow else [])


def open_loop(args, bins, knee, cap):
    """{(rate factor, contender): [round results]} of the open load."""
    results = {}
    for rnd in range(args.open_rounds):
        for factor, name in open_runs(args):
            ports_settled()
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


def ms(seconds):
    return f"{seconds * 1e3:.1f} ms" if seconds is not None else "–"


def knee_name(knee):
    return "none" if knee == 0 else str(knee)


def problems(results):
    """What the smoke fails on: an error with any contender (a 503 past a
    full queue included, which no load below capacity may meet), or a
    limit that was never read or is out of the limiter's bounds."""
    found = []
    for knee, by_name in results["closed"].items():
        for name, rounds in by_name.items():
            for r in rounds:
                if r["errors"]:
                    found.append(f"closed, knee {knee}, {name}: {r['errors']} errors")
                if name == "qproxy-adaptive" and not (
                    r.get("limit") is not None and LIMIT_BOUNDS[0] <= r["limit"] <= LIMIT_BOUNDS[1]
                ):
                    found.append(f"closed, knee {knee}: the limit {r.get('limit')} is not within {LIMIT_BOUNDS}")
    for knee, by_load in results["open"].items():
        for (factor, name), rounds in by_load.items():
            for r in rounds:
                if r["errors"] or (factor < 1 and r["shed"]):
                    found.append(
                        f"open, knee {knee}, {factor}× capacity, {name}: {r['errors']} errors, {r['shed']} 503s"
                    )
    return found


def section(args, facts, results):
    lines = [
        BEGIN,
        "## Adaptive concurrency under overload (`benches/adaptive.py`)",
        "",
        f"{facts}: `benches/adaptive.py`, {args.rounds} rounds of {args.seconds} s per load, medians.",
        "",
        f"The app (`benches/app`'s `/contended?work={args.work}&knee=K`) does {args.work:,} rounds of arithmetic "
        "per request, times (1 + held/K), held being the requests inside it at arrival, yielding as threads "
        "would: its CPU per request grows with what it holds, as an app's does under contention, the more the "
        "smaller K is; with K none its cost does not grow. That growth is the premise: it is what a limit can "
        "win back, and without it there is nothing to win. The app runs alone on CPU 1; qproxy and the load "
        "share CPU 0. `qproxy` is a revision without `containerConcurrency` as Knative runs it (no limit); "
        "`qproxy-adaptive` the same with `qproxy-adaptive-concurrency` on. Each round starts one contender "
        "later; the first seconds (the limit learning) are measured.",
        "",
        f"**Closed loop**: {args.connections} connections, each sending its next request once answered (wrk). "
        "In a closed loop the clients wait for their answers, so latency is the connections over goodput "
        "(Little's law): p99 says little that goodput does not.",
        "",
        "| knee | contender | goodput (2xx/s) | p50 | p99 | errors | limit at the end |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    gains = []
    for knee, by_name in results["closed"].items():
        for name in CONTENDERS:
            rounds = by_name[name]
            limit = med(rounds, "limit")
            lines.append(
                f"| {knee_name(knee)} | `{name}` | {med(rounds, 'goodput'):,.0f} | {ms(med(rounds, 'p50'))} | "
                f"{ms(med(rounds, 'p99'))} | {sum(r['errors'] for r in rounds)} | "
                f"{f'{limit:.0f}' if limit else '–'} |"
            )
        off, on = med(by_name["qproxy"], "goodput"), med(by_name["qproxy-adaptive"], "goodput")
        limit = med(by_name["qproxy-adaptive"], "limit")
        # What the app's cost model alone predicts: every connection held
        # without the option, the limit's worth with it.
        model = (1 + args.connections / knee) / (1 + limit / knee) if knee and limit else 1.0
        gains.append(f"knee {knee_name(knee)}: {on / off:.2f}× (the model alone: {model:.2f}×)")
    lines += [
        "",
        "Goodput with the option against without it, " + "; ".join(gains) + ". Errors are wrk's: its 2 s "
        "timeout, after which the app still holds the request, so that where they are many the app holds more "
        "than the connections and the model's figure is a floor.",
        "",
    ]
    if results["open"]:
        caps = ", ".join(f"{results['capacity'][k]:,.0f} a second with knee {knee_name(k)}" for k in results["open"])
        lines += [
            "**Open loop**: requests at fixed rates, sent whatever the answers' latency (vegeta "
            f"{VEGETA_VERSION}, on CPU 0 with qproxy, 30 s timeout), at fractions of the app's capacity ({caps}: "
            f"the app alone, {CAPACITY_CONNECTIONS} connections), {args.open_rounds} round(s) of {args.seconds} s, "
            "each with a fresh app, once the last run's connections have left TIME-WAIT. `sent/s` is what the "
            "generator managed: below the rate asked, it fell behind "
            "(its core shared, thousands of requests in flight). Goodput is the 2xx answers over the time from the "
            "first request sent to the last answer (a queue still draining after the last request stretches it); "
            "latency is the 2xx answers'; `503` is Knative's "
            "breaker's answer once the queue behind the limit holds 10,000, which the last row, with the option "
            f"only, at {OVERFLOW:g}× capacity, sends enough to fill; other errors are mostly the 30 s timeout.",
            "",
            "| knee | rate asked | contender | sent/s | goodput (2xx/s) | p50 | p99 | 503 | other errors | "
            "limit at the end |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for knee, by_load in results["open"].items():
            cap = results["capacity"][knee]
            for factor, name in open_runs(args):
                rounds = by_load[(factor, name)]
                limit = med(rounds, "limit")
                lines.append(
                    f"| {knee_name(knee)} | {factor:.1f}× ({cap * factor:,.0f}/s) | `{name}` | "
                    f"{med(rounds, 'sent') / args.seconds:,.0f} | {med(rounds, 'goodput'):,.0f} | "
                    f"{ms(med(rounds, 'p50'))} | {ms(med(rounds, 'p99'))} | "
                    f"{sum(r['shed'] for r in rounds)} | {sum(r['errors'] for r in rounds)} | "
                    f"{f'{limit:.0f}' if limit else '–'} |"
                )
        lines.append("")
    lines += ["![goodput and the limit](adaptive.svg)", END]
    return "\n".join(lines) + "\n"


def picture(args, results, path_out):
    plt = plotting.pyplot()
    colour = plotting.colours(CONTENDERS)
    knees = list(results["closed"])
    panels = 2 + bool(results["open"])
    fig, axes = plt.subplots(1, panels, figsize=(4.5 * panels, 3.8))
    width = 0.8 / len(CONTENDERS)
    for i, name in enumerate(CONTENDERS):
        axes[0].bar(
            [x + (i - 1) * width for x in range(len(knees))],
            [med(results["closed"][k][name], "goodput") for k in knees],
            width,
            label=name,
            color=colour[name],
        )
    axes[0].set_xticks(range(len(knees)), [f"knee {knee_name(k)}" for k in knees], fontsize=8)
    axes[0].set_title("closed loop: goodput (2xx per second)", fontsize=10)
    axes[0].legend(fontsize=7)
    trace = next((r.get("trace") for k in knees for r in results["closed"][k]["qproxy-adaptive"] if r.get("trace")), [])
    if trace:
        axes[1].plot([t for t, _ in trace], [limit for _, limit in trace], color=colour["qproxy-adaptive"])
    axes[1].set_title(f"qproxy-adaptive's limit, knee {knee_name(knees[0])}, first round", fontsize=10)
    axes[1].set_xlabel("seconds")
    if results["open"]:
        for knee, by_load in results["open"].items():
            for name, style in (("qproxy", "--"), ("qproxy-adaptive", "-")):
                axes[2].plot(
                    args.rates,
                    [med(by_load[(f, name)], "goodput") / results["capacity"][knee] for f in args.rates],
                    style,
                    marker="o",
                    color=colour[name],
                    label=f"{name}, knee {knee_name(knee)}",
                )
        axes[2].plot(args.rates, args.rates, ":", color="black", linewidth=0.8, label="all answered")
        axes[2].set_xlabel("rate sent (× capacity)")
        axes[2].set_title("open loop: goodput (× capacity)", fontsize=10)
        axes[2].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path_out, metadata={"Date": None})
    plt.close(fig)


def write(text):
    with open(RESULTS) as f:
        old = f.read()
    with open(RESULTS, "w") as f:
        f.write(between_markers(old, text.rstrip("\n"), BEGIN, END))


def main():
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
    args = ap.parse_args()
    # The commit and the machine as the run begins: what it measures.
    facts = run_facts()
    args.knees = [int(k) for k in args.knees.split(",") if k]
    args.open_knees = [int(k) for k in args.open_knees.split(",") if k]
    if args.smoke:
        args.rounds, args.open_rounds, args.seconds, args.knees, args.open_knees = 1, 1, 3, [64], [64]
    else:
        plotting.with_matplotlib(sys.argv[0])
    # The smoke's open load stays below capacity, where no 503 may come.
    args.rates = (0.5,) if args.smoke else RATES
    args.overflow = None if args.smoke else OVERFLOW
    bins = build(args)
    results = run(args, bins)
    if args.smoke:
        found = problems(results)
        for problem in found:
            print(f"adaptive: {problem}", file=sys.stderr)
        return 1 if found else 0
    picture(args, results, os.path.join(BENCHES, "adaptive.svg"))
    write(section(args, facts, results))
    print(f"written: {RESULTS} and benches/adaptive.svg")
    return 0
