"""What a harness run reports: every table (benches/side-by-side.md), the
short section RESULTS.md keeps between its markers, and a picture per
load."""

import datetime
import os
import platform
import re
import statistics

from .. import ROOT, plotting
from ..repository import git
from .callgrind import COUNTED_REQUESTS, PARTS
from .loads import TLS_HANDSHAKES, TLS_KEEP_ALIVE, throughput_loads

BENCHES = os.path.join(ROOT, "benches")
BEGIN, END = "<!-- harness:begin -->", "<!-- harness:end -->"


def med(rounds, key):
    vals = [r[key] for r in rounds if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def fmt(v, unit="", digits=1):
    if v is None:
        return "–"
    return f"{v:,.{digits}f}{unit}"


def report(args, throughput, concurrency, footprint, allocations=None, instructions=None):
    lines = []
    if allocations:
        lines.append("### Allocations per request (`crates/qproxy/benches/allocations.rs`)\n")
        lines.extend(f"- {a}" for a in allocations)
        lines.append("")
    if instructions:
        lines.append(
            f"### Instructions per request (callgrind, {args.instructions:,} and {2 * args.instructions:,} requests)\n"
        )
        lines.append(
            "| contender | " + " | ".join(f"{r}: user-space instructions per request" for r in COUNTED_REQUESTS) + " |"
        )
        lines.append("|---" * (1 + len(COUNTED_REQUESTS)) + "|")
        lines.extend(
            f"| {name} | " + " | ".join(fmt(by.get(r), digits=0) for r in COUNTED_REQUESTS) + " |"
            for name, by in instructions.items()
        )
        lines.append("")
        own = [n for n, by in instructions.items() if n.startswith("qproxy") and by.get("load 1 parts")]
        if own:
            lines.append("Load 1's request by part (each function's own instructions, by `PARTS` in the harness):\n")
            lines.append("| part | " + " | ".join(own) + " |")
            lines.append("|---" * (1 + len(own)) + "|")
            for part in [p for p, _ in PARTS] + ["other"]:
                lines.append(
                    f"| {part} | "
                    + " | ".join(fmt(instructions[n]["load 1 parts"].get(part), digits=0) for n in own)
                    + " |"
                )
            lines.append("")
    for variant in args.variants:
        lines.append(f"### Throughput and cost, {variant}\n")
        lines.append(
            "| load | contender | req/s | p50 (h2: mean) | p99 | errors | proxy CPU µs/req | ÷ app CPU | "
            "syscalls/req | switches/req | peak RSS |"
        )
        lines.append("|---|---|---|---|---|---|---|---|---|---|---|")
        for load_name in throughput_loads(args):
            for name in args.contenders:
                rounds = throughput.get((variant, load_name, name), [])
                if not rounds and load_name in (TLS_KEEP_ALIVE, TLS_HANDSHAKES):
                    continue  # direct, or the Go queue-proxy without root
                failed = any(r["errors"] for r in rounds)
                p50, p99 = med(rounds, "p50"), med(rounds, "p99")
                lines.append(
                    f"| {load_name} | {name} | {fmt(med(rounds, 'rps'), digits=0)}{' (FAILED)' if failed else ''} | "
                    f"{fmt(p50 and p50 * 1e6, ' µs', 0)} | {fmt(p99 and p99 * 1e6, ' µs', 0)} | "
                    f"{sum(r['errors'] for r in rounds)} | {fmt(med(rounds, 'cpu_us'))} | "
                    f"{fmt(med(rounds, 'vs_app'), '×', 2)} | {fmt(med(rounds, 'syscalls'))} | "
                    f"{fmt(med(rounds, 'switches'), digits=2)} | {fmt(med(rounds, 'peak_rss'), ' MiB')} |"
                )
        steal = sorted(r["steal"] for (v, _, _), rounds in throughput.items() if v == variant for r in rounds)
        if steal:
            lines.append(
                f"\nSteal (the hypervisor's share of this VM's CPU time) while these loads ran: "
                f"median {steal[len(steal) // 2] * 100:.1f}%, at most {steal[-1] * 100:.1f}%."
            )
        lines.append("")
    if concurrency:
        lines.append("### containerConcurrency against a 10 ms app (2×CC connections)\n")
        lines.append("| CC | contender | req/s | ideal | non-2xx |")
        lines.append("|---|---|---|---|---|")
        for (cc, name), r in sorted(concurrency.items()):
            lines.append(f"| {cc} | {name} | {r['rps']:.0f} | {cc * 100} | {r['non2xx']} |")
        lines.append("")
    if footprint:
        lines.append("### Footprint\n")
        lines.append(
            f"| contender | start-up to first 200 | RSS idle | RSS, 1,000 idle connections | "
            f"RSS, 10,000 | per idle connection | idle CPU over {args.idle_seconds} s |"
        )
        lines.append("|---|---|---|---|---|---|---|")
        for name, r in footprint.items():
            r10k = r["rss_10000"]
            # What each of the first 1,000 connections added, kept alive
            # after a request each.
            per_conn = (r["rss_1000"] - r["idle_rss"]) / 1000
            lines.append(
                f"| {name} | {r['startup_ms']:.1f} ms | {r['idle_rss'] / 1024:.1f} MiB | "
                f"{r['rss_1000'] / 1024:.1f} MiB | {fmt(r10k and r10k / 1024, ' MiB')} | "
                f"{per_conn:.1f} KiB | {r['idle_cpu_ms']:.0f} ms |"
            )
        lines.append("")
    return "\n".join(lines)


def compact(args, throughput):
    """The run's proxy CPU per request, one row per load and a column per
    contender (the variants side by side, `direct` in requests per second):
    the figures RESULTS.md shows."""
    variants = " / ".join(args.variants)
    lines = [
        f"Proxy CPU per request (µs), {variants}; `direct` in requests per second:",
        "",
        "| load | " + " | ".join(args.contenders) + " |",
        "|---" * (1 + len(args.contenders)) + "|",
    ]
    for load_name in throughput_loads(args):
        cells = []
        for name in args.contenders:
            key = "rps" if name == "direct" else "cpu_us"
            values = [med(throughput.get((variant, load_name, name), []), key) for variant in args.variants]
            digits = 0 if name == "direct" else 1
            cells.append("–" if all(v is None for v in values) else " / ".join(fmt(v, digits=digits) for v in values))
        lines.append(f"| {load_name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def run_facts():
    """The run's day, the commit it measured (and whether the tree had
    changes beside it) and the machine."""
    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    if git("status", "--porcelain", "--untracked-files=no"):
        commit += " with uncommitted changes"
    cpu = platform.processor()
    with open("/proc/cpuinfo") as f:
        m = re.search(r"model name\s*:\s*(.*)", f.read())
        cpu = m.group(1) if m else cpu
    return f"{datetime.date.today()}, commit {commit}, {os.cpu_count()} vCPU {cpu}, Linux {platform.release()}"


def run_line(args, command, facts):
    """The run's facts (`run_facts` as the run began), its command, rounds
    and seconds."""
    return f"{facts}: `{command.strip()}`, {args.rounds} rounds of {args.seconds} s, medians"


def write(args, command, facts, table, throughput, pictures):
    """Writes every table to benches/side-by-side.md and the short section
    between RESULTS.md's markers (added at its end when it has none)."""
    line = run_line(args, command, facts)
    method = (
        f"{args.rounds} rounds alternating contenders (each round starting one later), {args.seconds} s per "
        "load, medians; pinned: proxy on CPU 0, app and client on CPU 1 (Go queue-proxy with GOMAXPROCS=1, "
        "nginx one worker, HAProxy one thread); unpinned: no affinity. `qproxy` runs with Knative's default "
        "request metrics (Prometheus) on, `qproxy-nometrics` with them off; every qproxy with the image's "
        "environment (glibc's heap settings). Pictures (matplotlib), one per load, every contender: "
        f"{', '.join(pictures)}."
    )
    with open(os.path.join(BENCHES, "side-by-side.md"), "w") as f:
        f.write(f"# Side by side (`benches/harness.py`): every table of the run\n\n{line}.\n\n{method}\n\n{table}\n")
    section = (
        f"{BEGIN}\n## Side by side (`benches/harness.py`)\n\n{line}. Every table of the run: "
        f"[side-by-side.md](side-by-side.md).\n\n{compact(args, throughput)}\n{END}"
    )
    path = os.path.join(BENCHES, "RESULTS.md")
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(between_markers(text, section, BEGIN, END))


def between_markers(text, section, begin, end):
    """`text` with what lies between `begin` and `end` (both included)
    replaced by `section`, or `section` added at its end."""
    if begin in text and end in text:
        return text[: text.index(begin)] + section + text[text.index(end) + len(end) :]
    return text.rstrip() + "\n\n" + section + "\n"


def picture(args, throughput, load, path):
    """One figure for a load: every contender's throughput and proxy CPU
    per request, side by side, pinned and unpinned; qproxy set apart by
    colour."""
    plt = plotting.pyplot()
    names = [n for n in args.contenders if any(throughput.get((v, load, n)) for v in args.variants)]
    colour = plotting.colours(names)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    width = 0.8 / max(len(names), 1)
    panels = (("requests per second", "rps"), ("proxy CPU per request (µs)", "cpu_us"))
    for ax, (title, key) in zip(axes, panels, strict=False):
        for i, name in enumerate(names):
            values = [med(throughput.get((v, load, name), []), key) or 0 for v in args.variants]
            xs = [x + (i - (len(names) - 1) / 2) * width for x in range(len(args.variants))]
            ax.bar(xs, values, width, label=name, color=colour[name])
        ax.set_xticks(range(len(args.variants)), list(args.variants))
        ax.set_title(title, fontsize=10)
    axes[1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.suptitle(f"load {load} (median of the rounds)")
    fig.tight_layout()
    fig.savefig(path, metadata={"Date": None})
    plt.close(fig)


def instructions_picture(instructions, path):
    """Load 1's instructions per request: each qproxy build's as a stack
    of its parts (PARTS), every other proxy's total beside them, nginx's
    total drawn across."""
    plt = plotting.pyplot()
    names = [n for n, by in instructions.items() if by.get("load 1")]
    if not names:
        return False
    colour = plotting.colours(names)
    order = [p for p, _ in PARTS] + ["other"]
    shades = plt.get_cmap("tab20").colors
    fig, ax = plt.subplots(figsize=(11, 4.5))
    for y, name in enumerate(names):
        parts = instructions[name].get("load 1 parts") or {}
        if name.startswith("qproxy") and any(v > 0 for v in parts.values()):
            left = 0
            for i, part in enumerate(order):
                width = max(parts.get(part, 0), 0)
                ax.barh(y, width, left=left, color=shades[i % len(shades)], label=part if y == 0 else None)
                left += width
        else:
            ax.barh(y, instructions[name]["load 1"], color=colour[name])
    # Envoy's request costs several times the others': its bar is cut at
    # the frame, and every bar carries its total.
    totals = [instructions[n]["load 1"] for n in names]
    limit = 1.6 * sorted(totals)[len(totals) // 2]
    ax.set_xlim(0, limit)
    for y, total in enumerate(totals):
        ax.text(
            min(total, limit), y, f" {total:,.0f}", fontsize=8, va="center", ha="left" if total < limit else "right"
        )
    nginx = instructions.get("nginx", {}).get("load 1")
    if nginx:
        ax.axvline(nginx, color="black", linestyle="--", linewidth=1)
        ax.text(nginx, len(names) - 0.5, " nginx", fontsize=8, va="bottom")
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlabel("user-space instructions per request (callgrind, load 1's GET)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    fig.savefig(path, metadata={"Date": None})
    plt.close(fig)
    return True


def svg_name(load):
    """The picture's file for a load: load1.svg for "1 keep-alive c70"."""
    return (
        f"load{load.split()[0]}"
        + ("-" + re.sub(r"[^a-z0-9]+", "-", load.split(" ", 1)[1].lower()).strip("-") if load.split()[0] == "4" else "")
        + ".svg"
    )
