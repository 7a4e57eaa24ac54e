"""What a harness run reports: every table (benches/side-by-side.md), the
short section RESULTS.md keeps between its markers, and the names of its
pictures (drawn by `plots`)."""

import os
import re

from .callgrind import COUNTED_REQUESTS, PARTS
from .loads import TLS_HANDSHAKES, TLS_KEEP_ALIVE, throughput_loads
from .pages import BENCHES, RESULTS, fmt, write_section
from .stats import med

BEGIN, END = "<!-- harness:begin -->", "<!-- harness:end -->"


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
    write_section(RESULTS, section, BEGIN, END)


def svg_name(load):
    """The picture's file for a load: load1.svg for "1 keep-alive c70"."""
    return (
        f"load{load.split()[0]}"
        + ("-" + re.sub(r"[^a-z0-9]+", "-", load.split(" ", 1)[1].lower()).strip("-") if load.split()[0] == "4" else "")
        + ".svg"
    )


def picture_link(load):
    """A load's picture as side-by-side.md links it: "[1](load1.svg)",
    load 4's with its size."""
    return f"[{load.split()[0]}{' ' + load.split()[1] if load.split()[0] == '4' else ''}]({svg_name(load)})"
