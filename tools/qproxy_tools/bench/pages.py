"""The pages the benchmarks write into benches/: RESULTS.md's sections
between their markers, the facts of a run, and figures as the tables show
them."""

import datetime
import os
import platform
import re

from .. import ROOT
from ..repository import git

BENCHES = os.path.join(ROOT, "benches")
RESULTS = os.path.join(BENCHES, "RESULTS.md")


def fmt(v, unit="", digits=1):
    if v is None:
        return "–"
    return f"{v:,.{digits}f}{unit}"


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


def between_markers(text, section, begin, end):
    """`text` with what lies between `begin` and `end` (both included)
    replaced by `section`, or `section` added at its end."""
    if begin in text and end in text:
        return text[: text.index(begin)] + section + text[text.index(end) + len(end) :]
    return text.rstrip() + "\n\n" + section + "\n"


def write_section(path, section, begin, end):
    """Puts `section` between the markers `begin` and `end` of the page at
    `path` (`between_markers`)."""
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(between_markers(text, section, begin, end))
