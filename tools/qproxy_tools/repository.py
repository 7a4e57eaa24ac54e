"""The repository the tools run from, as git sees it."""

import subprocess

from . import ROOT


def git(*args):
    """What `git ARGS`, run at the repository's root, printed, but its last
    newline (a status line starts with a space that says the index is
    unchanged)."""
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.rstrip("\n")
