"""qproxy's adaptive-concurrency option under overload, side by side: the
app alone (direct), qproxy as Knative runs a revision without
containerConcurrency (no limit), and the same with the option on, in front
of an app whose CPU per request grows with the requests it holds
(`/contended` of benches/app). See benches/README.md.

    benches/adaptive.py     # writes its section of benches/RESULTS.md and benches/adaptive.svg

Needs what benches/harness.py needs for load 1: cargo, go, taskset, wrk.
"""

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

from .. import ROOT, plotting
from . import procs
from .contenders import Contender
from .installs import DEBIAN_PACKAGES, install_debian, tool_path
from .loads import run_wrk
from .report import BENCHES, between_markers

CONTENDERS = ("direct", "qproxy", "qproxy-adaptive")
RESULTS = os.path.join(BENCHES, "RESULTS.md")
BEGIN, END = "<!-- adaptive:begin -->", "<!-- adaptive:end -->"
LIMIT = "qproxy_adaptive_concurrency_limit{"


def build(args):
    bins = {}
    if args.qproxy_bin:
        bins["qproxy"] = args.qproxy_bin
    else:
        subprocess.run(["cargo", "build", "--release", "-p", "qproxy", "--locked"], cwd=ROOT, check=True)
        bins["qproxy"] = os.path.join(ROOT, "target", "release", "qproxy")
    app = os.path.join(ROOT, "target", "bench", "app")
    subprocess.run(["go", "build", "-o", app, "."], cwd=os.path.join(BENCHES, "app"), check=True)
    bins["app"] = app
    if not tool_path("wrk"):
        install_debian([DEBIAN_PACKAGES["wrk"]])
    bins["wrk"] = tool_path("wrk") or sys.exit("adaptive: wrk is not installed (Debian: wrk)")
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


def run(args, bins):
    """{contender: [round results]}, and the limit's trace of the first
    round with the option."""
    app, app_port = procs.start_app(bins, "pinned")
    path = f"/contended?work={args.work}&knee={args.knee}"
    results, trace = {}, None
    try:
        for rnd in range(args.rounds):
            turn = rnd % len(CONTENDERS)
            for name in CONTENDERS[turn:] + CONTENDERS[:turn]:
                c, metrics = contender(bins, name)
                c.start(app_port)
                try:
                    tracer = LimitTrace(metrics) if metrics else None
                    if tracer:
                        tracer.start()
                    # The first seconds, the limit learning, are measured
                    # too: a revision's pods meet their load cold.
                    r = run_wrk(bins, c.port, path, args.connections, args.seconds, 0)
                    if tracer:
                        points = tracer.stop()
                        r["limit"] = points[-1][1] if points else None
                        trace = trace or points
                finally:
                    c.stop()
                results.setdefault(name, []).append(r)
                print(
                    f"  {name:16} round {rnd + 1}: {r['rps']:8.0f} req/s  p50 {ms(r['p50'])}  "
                    f"p99 {ms(r['p99'])}  errors {r['errors']}" + (f"  limit {r['limit']}" if r.get("limit") else ""),
                    flush=True,
                )
    finally:
        procs.stop(app)
    return results, trace


def ms(seconds):
    return f"{seconds * 1e3:.1f} ms" if seconds is not None else "–"


def med(rounds, key):
    values = [r[key] for r in rounds if r.get(key) is not None]
    return statistics.median(values) if values else None


def section(args, results):
    off, on = results["qproxy"], results["qproxy-adaptive"]
    lines = [
        BEGIN,
        "## Adaptive concurrency under overload (`benches/adaptive.py`)",
        "",
        f"The app (`benches/app`'s `/contended?work={args.work}&knee={args.knee}`) does "
        f"{args.work:,} rounds of arithmetic per request, times (1 + held/{args.knee}), held being "
        "the requests inside it at arrival, yielding as threads would: its CPU per request grows "
        "with what it holds, as an app's does under contention. It runs alone on CPU 1; qproxy "
        f"and `wrk` share CPU 0; {args.connections} connections, each sending its next request "
        f"once answered, {args.seconds} s per round, the first seconds (the limit learning) "
        f"included; median of {args.rounds} rounds, each round starting one contender later. "
        "`qproxy` is a revision without `containerConcurrency` as Knative runs it (no limit); "
        "`qproxy-adaptive` the same with `qproxy-adaptive-concurrency` on.",
        "",
        "| contender | goodput (2xx/s) | p50 | p99 | errors | limit at the end |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name in CONTENDERS:
        rounds = results[name]
        good = statistics.median((r["requests"] - r["errors"]) / r["seconds"] for r in rounds)
        limit = med(rounds, "limit")
        lines.append(
            f"| `{name}` | {good:,.0f} | {ms(med(rounds, 'p50'))} | {ms(med(rounds, 'p99'))} | "
            f"{sum(r['errors'] for r in rounds)} | {f'{limit:.0f}' if limit else '–'} |"
        )
    good = [statistics.median((r["requests"] - r["errors"]) / r["seconds"] for r in x) for x in (off, on)]
    lines += [
        "",
        f"With the option, goodput is {good[1] / good[0]:.2f}× and p99 "
        f"{med(on, 'p99') / med(off, 'p99'):.2f}× what they are without it.",
        "",
        "![goodput, latency and the limit](adaptive.svg)",
        END,
    ]
    return "\n".join(lines) + "\n"


def picture(results, trace, path):
    plt = plotting.pyplot()
    colour = plotting.colours(CONTENDERS)
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    xs = range(len(CONTENDERS))
    axes[0].bar(
        xs,
        [statistics.median((r["requests"] - r["errors"]) / r["seconds"] for r in results[n]) for n in CONTENDERS],
        color=[colour[n] for n in CONTENDERS],
    )
    axes[0].set_title("goodput (2xx per second)", fontsize=10)
    width = 0.38
    for i, (key, label) in enumerate((("p50", "p50"), ("p99", "p99"))):
        axes[1].bar(
            [x + (i - 0.5) * width for x in xs],
            [(med(results[n], key) or 0) * 1e3 for n in CONTENDERS],
            width,
            label=label,
            color=[colour[n] for n in CONTENDERS],
            alpha=1.0 if i else 0.55,
        )
    axes[1].set_title("latency (ms; light p50, dark p99)", fontsize=10)
    for ax in axes[:2]:
        ax.set_xticks(list(xs), list(CONTENDERS), fontsize=8)
    if trace:
        axes[2].plot([t for t, _ in trace], [limit for _, limit in trace], color=colour["qproxy-adaptive"])
    axes[2].set_title("qproxy-adaptive's limit, first round", fontsize=10)
    axes[2].set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(path, metadata={"Date": None})
    plt.close(fig)


def write(text):
    with open(RESULTS) as f:
        old = f.read()
    with open(RESULTS, "w") as f:
        f.write(between_markers(old, text.rstrip("\n"), BEGIN, END))


def main():
    ap = argparse.ArgumentParser(
        prog="benches/adaptive.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--qproxy-bin", help="use this qproxy binary instead of building --release")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--connections", type=int, default=200)
    ap.add_argument("--work", type=int, default=100000)
    ap.add_argument("--knee", type=int, default=64)
    ap.add_argument("--smoke", action="store_true", help="one short round; nothing written")
    args = ap.parse_args()
    if args.smoke:
        args.rounds, args.seconds = 1, 3
    else:
        plotting.with_matplotlib(sys.argv[0])
    bins = build(args)
    results, trace = run(args, bins)
    if args.smoke:
        return
    picture(results, trace, os.path.join(BENCHES, "adaptive.svg"))
    write(section(args, results))
    print(f"written: {RESULTS} and benches/adaptive.svg")
