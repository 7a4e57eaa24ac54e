"""The benchmarks' pictures, drawn by matplotlib (`plotting`): the
harness's per load and its instructions by part, the adaptive benchmark's
goodput and limit, the cluster benchmark's throughput and cold starts."""

import os

from .. import plotting
from .adaptive_plan import CONTENDERS, knee_name
from .callgrind import PARTS
from .cluster_report import IMAGES, PATHS
from .stats import med, median


def load_picture(args, throughput, load, path):
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


def adaptive_picture(args, results, path_out):
    """benches/adaptive.svg: the closed load's goodput by knee, the
    adaptive limit's first trace, and the open load's goodput by rate."""
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


def cluster_pictures(out, rounds, tries):
    """throughput.svg (each path's rate, p90 and the queue-proxy's CPU
    against the app's) and coldstart.svg (every cold start), into `out`."""
    plt = plotting.pyplot()

    colours = {"go": "#8c8c8c", "qproxy": "#d9622b"}
    labels = {"app": "app port", "qp": "queue-proxy", "activator": "activator,\nqueue-proxy"}

    def mid(image, path, key):
        return median([r[key] for r in rounds if r["image"] == image and r["path"] == path]) or 0

    fig, axes = plt.subplots(1, 3, figsize=(12, 4))
    panels = (
        ("requests per second", PATHS, lambda i, p: mid(i, p, "rps")),
        ("p90 latency (ms)", PATHS, lambda i, p: mid(i, p, "p90") * 1e3),
        (
            "queue-proxy CPU ÷ app CPU, per request",
            PATHS[1:],
            lambda i, p: mid(i, p, "cpu_us_qp") / max(mid(i, p, "cpu_us_app"), 1e-9),
        ),
    )
    for ax, (title, shown, value) in zip(axes, panels, strict=False):
        for i, image in enumerate(IMAGES):
            ax.bar(
                [x + (i - 0.5) * 0.38 for x in range(len(shown))],
                [value(image, p) for p in shown],
                0.38,
                label=image,
                color=colours[image],
            )
        ax.set_xticks(range(len(shown)), [labels[p] for p in shown], fontsize=8)
        ax.set_title(title, fontsize=10)
    axes[2].axhline(1, color="black", linewidth=0.8, linestyle="--")
    axes[0].legend()
    fig.suptitle("helloworld, one pod, 70 connections (median of the rounds)")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "throughput.svg"), metadata={"Date": None})
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    data = [[t["seconds"] for t in tries if t["image"] == image and t["seconds"] is not None] for image in IMAGES]
    box = ax.boxplot(data, patch_artist=True, tick_labels=list(IMAGES), medianprops={"color": "black"})
    for i, (patch, image) in enumerate(zip(box["boxes"], IMAGES, strict=False)):
        patch.set_facecolor(colours[image])
        patch.set_alpha(0.5)
        # Every try, spread sideways so that equal times stay visible.
        ax.scatter(
            [i + 1 + 0.15 * ((k % 5) - 2) / 2 for k in range(len(data[i]))],
            data[i],
            s=12,
            color=colours[image],
            zorder=3,
        )
    ax.set_ylabel("first request to first byte (s)")
    ax.set_title("cold start from zero, through Traefik and the activator")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "coldstart.svg"), metadata={"Date": None})
    plt.close(fig)
