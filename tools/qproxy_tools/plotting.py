"""matplotlib for the benchmarks' pictures: installed from PyPI into
target/bench-venv when this Python lacks it, and set so that the same
figures make the same SVG."""

import os
import subprocess
import sys

from . import ROOT

VENV = os.path.join(ROOT, "target", "bench-venv")
MATPLOTLIB = "matplotlib==3.10.9"

# qproxy's builds in one colour, every other contender in greys and blues.
QPROXY_COLOURS = ("#d9622b", "#f0a070", "#a8431a", "#e88a50")
OTHER_COLOURS = ("#8c8c8c", "#4a7ab5", "#5d5d5d", "#9bb7d9", "#2f4f75", "#bdbdbd")


def with_matplotlib(script, say=lambda message: print(message, file=sys.stderr, flush=True)):
    """Runs `script` again under target/bench-venv, with matplotlib
    installed there from PyPI, unless this Python already has it."""
    try:
        import matplotlib  # noqa: F401

        return
    except ImportError:
        pass
    python = os.path.join(VENV, "bin", "python3")
    if sys.executable == python:
        raise SystemExit("bench: matplotlib is missing from target/bench-venv")
    if not os.path.exists(python):
        say(f"installing {MATPLOTLIB} into target/bench-venv (PyPI)")
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
    subprocess.run([python, "-m", "pip", "install", "-q", MATPLOTLIB], check=True)
    os.execv(python, [python, os.path.abspath(script), *sys.argv[1:]])


def pyplot():
    """matplotlib's pyplot, writing SVG with text as text and no date."""
    import matplotlib

    matplotlib.use("svg")
    matplotlib.rcParams["svg.hashsalt"] = "qproxy"
    matplotlib.rcParams["svg.fonttype"] = "none"
    import matplotlib.pyplot as plt

    return plt


def colours(names):
    """A colour for each contender: qproxy's builds set apart."""
    own, other, out = iter(QPROXY_COLOURS), iter(OTHER_COLOURS), {}
    for name in names:
        out[name] = next(own, QPROXY_COLOURS[0]) if name.startswith("qproxy") else next(other, OTHER_COLOURS[0])
    return out
