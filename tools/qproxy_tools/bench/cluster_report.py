"""What the cluster benchmark reports: results.md's tables of each
queue-proxy's throughput and CPU by path, and of its cold starts."""

from .stats import median, p90

# The queue-proxy images compared (`scripts/cluster use`), and the paths
# measured with each.
IMAGES = ("go", "qproxy")
PATHS = ("app", "qp", "activator")


def summary(rounds, tries):
    """The table of each image's paths (medians of the rounds) and the
    table of its cold starts, as results.md holds them."""
    lines = [
        "| queue-proxy | path | req/s | p50 ms | p90 ms | p99 ms | app µs/req | queue-proxy µs/req | "
        "activator µs/req | queue-proxy ÷ app CPU | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for image in IMAGES:
        for path in PATHS:
            rs = [r for r in rounds if r["image"] == image and r["path"] == path]
            if not rs:
                continue
            m = {
                k: median([r[k] for r in rs])
                for k in ("rps", "p50", "p90", "p99", "cpu_us_app", "cpu_us_qp", "cpu_us_activator")
            }
            ratio = m["cpu_us_qp"] / m["cpu_us_app"] if m["cpu_us_app"] and path != "app" else None
            lines.append(
                f"| {image} | {path} | {m['rps']:,.0f} | {m['p50'] * 1e3:.2f} | {m['p90'] * 1e3:.2f} | "
                f"{m['p99'] * 1e3:.2f} | {m['cpu_us_app']:.0f} | "
                f"{m['cpu_us_qp']:.0f} | {m['cpu_us_activator']:.0f} | "
                f"{'' if ratio is None else f'{ratio:.2f}'} | {sum(r['errors'] for r in rs)} |"
            )
    lines += ["", "| queue-proxy | cold starts | median s | p90 s | not 200 |", "|---|---|---|---|---|"]
    for image in IMAGES:
        ts = [t for t in tries if t["image"] == image]
        if ts:
            secs = [t["seconds"] for t in ts if t["seconds"] is not None]
            lines.append(
                f"| {image} | {len(ts)} | {median(secs):.2f} | {p90(secs):.2f} | {sum(t['code'] != 200 for t in ts)} |"
            )
    return "\n".join(lines) + "\n"
