"""What the dashboard's every query returned after the cluster's load
(TestDashboardQueriesAfterALoad), with Knative's queue-proxy and with
qproxy: compared, and drawn.

  tests/cluster/dashboard compare DIR
      DIR holds go/results.json and qproxy/results.json (tests/cluster/run
      writes them to target/cluster/dashboard-<release>/). Prints, as a
      Markdown table, each Knative panel's figure during the load with each
      queue-proxy, and fails if one differs beyond the load's noise; then
      qproxy's own panels' figures.
  tests/cluster/dashboard draw [--out FOLDER]
      Draws every panel from its query's results, qproxy's and Knative's
      queue-proxy's on the same axes, one picture per Knative release that
      has both: FOLDER/<release>.svg (docs/dashboard/ by default).

A panel's figure is, for a time series, the mean of its samples while the
load ran (after the first rate window) and, for a stat panel, its value;
a series is named by its legend, its pod left out (pods' names differ
from run to run) and the highest of its pods kept. Two figures agree when
they differ by at most a quarter of the larger and a little more for the
unit's resolution: a request a second, 50 ms, ten requests, two requests
in the queue.
"""

import json
import math
import os
import re
import sys

from .. import ROOT, arguments, plotting

# What two figures may differ by beyond a quarter of the larger, by unit.
SLACK = {"reqps": 1.0, "s": 0.05, "none": 10.0, "short": 2.0}
ROLES = ("queue", "adaptive")


def load(path):
    with open(path) as f:
        return json.load(f)


def name(legend, metric):
    """A series' name from its panel's legend, the pod left out."""
    legend = legend.replace("{{pod}}", "").strip()
    return re.sub(r"\{\{(\w+)\}\}", lambda m: metric.get(m.group(1), ""), legend)


def number(v):
    """Whether a sample's value is a number: the test writes a quantile of
    no requests (NaN) as null."""
    return v is not None and not math.isnan(v) and not math.isinf(v)


def rate_window(record):
    return float(record["rate_interval"].rstrip("s"))


def figures(record):
    """{(role, panel, series name): figure} of one run."""
    out = {}
    for role, results in record["results"].items():
        run = record["loads"][role]
        start, end = run["start"] + rate_window(record), run["end"]
        for r in results:
            for series in r["series"] or []:
                if r["kind"] == "stat":
                    values = [v for _, v in series["values"]]
                else:
                    values = [v for t, v in series["values"] if start <= t <= end]
                values = [v for v in values if number(v)]
                if not values:
                    continue
                figure = values[-1] if r["kind"] == "stat" else sum(values) / len(values)
                key = (role, r["panel"], name(r["legend"], series["metric"]))
                out[key] = max(out.get(key, figure), figure)
    return out


def panel_facts():
    """{panel title: unit} and {panel title: source}, in the dashboard's
    order."""
    from . import panels

    every = panels.panels()
    return {p.title: p.unit for p in every}, {p.title: p.source for p in every}


def agree(a, b, unit):
    return abs(a - b) <= 0.25 * max(abs(a), abs(b)) + SLACK.get(unit, 0.0)


def compare(go, qproxy):
    """The table's lines and whether every Knative panel agrees."""
    unit_of, source_of = panel_facts()
    fg, fq = figures(go), figures(qproxy)
    lines = [
        "| revision | panel | series | Knative's queue-proxy | qproxy | |",
        "|---|---|---|---:|---:|---|",
    ]
    ok = True
    order = {title: i for i, title in enumerate(source_of)}
    keys = sorted(
        set(fg) | set(fq), key=lambda k: (ROLES.index(k[0]) if k[0] in ROLES else 9, order.get(k[1], 99), k[2])
    )
    knative = [k for k in keys if source_of.get(k[1]) == "knative"]
    own = [k for k in keys if source_of.get(k[1]) == "qproxy"]
    for key in knative:
        role, panel, series = key
        a, b = fg.get(key), fq.get(key)
        if a is None or b is None:
            # A series one run has and the other not: a status code seen
            # by one only (a handful), or a panel empty with one.
            small = (a or b or 0) <= SLACK.get(unit_of.get(panel), 0.0)
            verdict = "within noise" if small else "**only one has it**"
            ok = ok and small
        else:
            same = agree(a, b, unit_of.get(panel))
            verdict = "agree" if same else "**differ**"
            ok = ok and same
        lines.append(f"| {role} | {panel} | {series} | {fmt(a)} | {fmt(b)} | {verdict} |")
    for key in own:
        role, panel, series = key
        stray = fg.get(key) is not None
        ok = ok and not stray
        verdict = "**served by Knative's queue-proxy**" if stray else "qproxy's own"
        lines.append(f"| {role} | {panel} | {series} | {fmt(fg.get(key))} | {fmt(fq.get(key))} | {verdict} |")
    return lines, ok


def fmt(v):
    if v is None:
        return "none"
    if v == 0 or abs(v) >= 100:
        return f"{v:.0f}"
    return f"{v:.3g}"


def draw(records, out):
    """One picture of every panel: each run's series on the same axes,
    time from the start of the load."""
    from . import panels as dashboard

    plt = plotting.pyplot()
    colours = {"qproxy": plotting.QPROXY_COLOURS, "go": plotting.OTHER_COLOURS}
    cells = [(role, p) for role in ROLES for row in dashboard.ROWS for p in row.panels if shown(records, role, p.title)]
    cols = 3
    lines_of = (len(cells) + cols - 1) // cols
    fig, axes = plt.subplots(lines_of, cols, figsize=(cols * 5.2, lines_of * 3.1), squeeze=False)
    for ax in axes.flat[len(cells) :]:
        ax.set_visible(False)
    for ax, (role, panel) in zip(axes.flat, cells, strict=False):
        ax.set_title(f"{panel.title}\n({ROLE_NAMES[role]})", fontsize=8)
        ax.tick_params(labelsize=7)
        if panel.kind == "stat":
            draw_stat(ax, records, role, panel, colours)
        else:
            draw_series(ax, records, role, panel, colours)
        ax.set_ylabel(UNIT_NAMES.get(panel.unit, ""), fontsize=7)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=6, frameon=False)
    fig.tight_layout()
    fig.savefig(out, metadata={"Date": None})
    plt.close(fig)


ROLE_NAMES = {
    "queue": "containerConcurrency 1, 20 requests/s of 0.2 s",
    "adaptive": "adaptive concurrency, 10 requests/s of 0.1 s",
}
UNIT_NAMES = {"reqps": "requests/s", "s": "seconds", "none": "requests", "short": "requests"}
WHO = {"qproxy": "qproxy", "go": "Knative's"}


def shown(records, role, title):
    return any(r["panel"] == title and r["series"] for rec in records.values() for r in rec["results"].get(role, []))


def draw_series(ax, records, role, panel, colours):
    for who, record in records.items():
        zero = record["loads"][role]["start"]
        palette = iter(colours[who] * 4)
        for r in record["results"].get(role, []):
            if r["panel"] != panel.title:
                continue
            for series in r["series"] or []:
                points = [(t - zero, v) for t, v in series["values"] if number(v)]
                if not points:
                    continue
                series_name = name(r["legend"], series["metric"])
                ax.plot(
                    [t for t, _ in points],
                    [v for _, v in points],
                    color=next(palette),
                    linewidth=1.2,
                    linestyle="-" if who == "qproxy" else "--",
                    label=f"{WHO[who]}: {series_name}" if series_name else WHO[who],
                )
    ax.set_xlabel("seconds from the load's start", fontsize=7)


def draw_stat(ax, records, role, panel, colours):
    codes = sorted(
        {
            s["metric"].get("code", "")
            for rec in records.values()
            for r in rec["results"].get(role, [])
            if r["panel"] == panel.title
            for s in r["series"] or []
        }
    )
    width = 0.8 / max(1, len(records))
    for i, (who, record) in enumerate(records.items()):
        counts = {}
        for r in record["results"].get(role, []):
            if r["panel"] == panel.title:
                for s in r["series"] or []:
                    counts[s["metric"].get("code", "")] = s["values"][0][1]
        ax.bar(
            [j + i * width for j in range(len(codes))],
            [counts.get(c, 0) for c in codes],
            width,
            color=colours[who][0],
            label=WHO[who],
        )
    ax.set_xticks([j + width * (len(records) - 1) / 2 for j in range(len(codes))], codes)
    ax.set_xlabel("status code", fontsize=7)


def releases(base):
    """{release: {"go": record, "qproxy": record}} for every release whose
    both runs are under `base` (target/cluster)."""
    out = {}
    for entry in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        if not entry.startswith("dashboard-") or not os.path.isdir(os.path.join(base, entry)):
            continue
        runs = {}
        for who in ("qproxy", "go"):
            path = os.path.join(base, entry, who, "results.json")
            if os.path.exists(path):
                runs[who] = load(path)
        if len(runs) == 2:
            out[entry[len("dashboard-") :]] = runs
    return out


def main():
    parser = arguments.parser("tests/cluster/dashboard", __doc__)
    verbs = parser.add_subparsers(dest="verb", required=True)
    p = verbs.add_parser("compare", help="compare the two queue-proxies' runs")
    p.add_argument("dir")
    p = verbs.add_parser("draw", help="draw every panel")
    p.add_argument("--out", default=os.path.join(ROOT, "docs", "dashboard"))
    args = parser.parse_args()
    if args.verb == "compare":
        try:
            go = load(os.path.join(args.dir, "go", "results.json"))
            qproxy = load(os.path.join(args.dir, "qproxy", "results.json"))
        except (OSError, ValueError) as error:
            print(f"tests/cluster/dashboard: {error}", file=sys.stderr)
            return 2
        lines, ok = compare(go, qproxy)
        print("\n".join(lines))
        if not ok:
            print("\nKnative's panels differ between the queue-proxies beyond the load's noise", file=sys.stderr)
        return 0 if ok else 1
    found = releases(os.path.join(ROOT, "target", "cluster"))
    if not found:
        print("tests/cluster/dashboard: no release has both runs under target/cluster/dashboard-*/", file=sys.stderr)
        return 2
    plotting.with_matplotlib(sys.argv[0])
    os.makedirs(args.out, exist_ok=True)
    for release, runs in found.items():
        path = os.path.join(args.out, f"{release}.svg")
        draw(runs, path)
        print(os.path.relpath(path, ROOT))
    return 0
