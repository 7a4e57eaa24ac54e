"""The fuzz corpus kept in the repository, chosen from the full one.

The long fuzz runs grow each target's corpus to thousands of inputs; the
machine keeps them all in its cache (CACHE, as it keeps its builds), and
`scripts/test fuzz` starts from them. The repository keeps, per target, at
most `--budget` inputs: those that reach the most of the target's code
(branches, as libFuzzer counts its edges), so that a fresh clone on a
fresh machine starts from most of what the long runs reached.

How: libFuzzer's merge (what `cargo fuzz cmin` runs) goes through every
input of the cache and the repository, smallest first, and writes in its
control file which new edges each one reached; the inputs that reached the
most are kept. What the kept inputs reach together, counted by a merge of
their own, is printed against what the whole corpus reaches.

    fuzz/minimize [--budget 40] [TARGET...]

Needs the targets built as `scripts/test fuzz` builds them.
"""

import os
import shutil
import subprocess
import tempfile

from . import ROOT, arguments

FUZZ = os.path.join(ROOT, "fuzz")
BINARIES = os.path.join(FUZZ, "target", "x86_64-unknown-linux-gnu", "release")
CACHE = os.environ.get(
    "QPROXY_FUZZ_CORPUS",
    os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "qproxy", "fuzz-corpus"),
)


def credits(control):
    """{input path: new edges it reached} from a merge control file (only
    the inputs the merge finished; each edge is credited to the first input
    that reached it)."""
    lines = control.splitlines()
    count = int(lines[0])
    files = lines[2 : 2 + count]
    reached = {}
    for line in lines[2 + count :]:
        words = line.split()
        if len(words) >= 2 and words[0] == "COV":
            reached[files[int(words[1])]] = len(words) - 2
    return reached


def choose(reached, budget):
    """The inputs that reached the most new edges, at most `budget` of them,
    none that reached nothing; ties go to the earlier name."""
    ranked = sorted((path for path, n in reached.items() if n > 0), key=lambda p: (-reached[p], p))
    return ranked[:budget]


def merge(target, folders):
    """Runs the target's merge over `folders`; its control file's text."""
    binary = os.path.join(BINARIES, target)
    if not os.path.exists(binary):
        raise SystemExit(f"fuzz/minimize: {binary} is missing: build the targets first (scripts/test fuzz)")
    with tempfile.TemporaryDirectory(prefix="qproxy-fuzz-merge-") as scratch:
        control = os.path.join(scratch, "control")
        out = os.path.join(scratch, "out")
        os.mkdir(out)
        done = subprocess.run(
            [
                binary,
                "-merge=1",
                "-use_counters=0",
                f"-merge_control_file={control}",
                "-rss_limit_mb=2048",
                "-timeout=10",
                out,
                *folders,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        if done.returncode != 0:
            raise SystemExit(f"fuzz/minimize: {target}'s merge failed:\n{done.stderr[-2000:]}")
        with open(control) as f:
            return f.read()


def minimize(target, budget):
    """Replaces fuzz/corpus/TARGET with the inputs chosen from the cache's
    corpus and the repository's; returns (kept, of, edges the kept reach,
    edges the whole reaches)."""
    kept_dir = os.path.join(FUZZ, "corpus", target)
    folders = [d for d in (os.path.join(CACHE, target), kept_dir) if os.path.isdir(d)]
    with tempfile.TemporaryDirectory(prefix="qproxy-fuzz-all-") as everything:
        # Each input once: libFuzzer names an input by its SHA-1.
        for folder in folders:
            for name in os.listdir(folder):
                if not os.path.exists(os.path.join(everything, name)):
                    os.symlink(os.path.join(folder, name), os.path.join(everything, name))
        if not os.listdir(everything):
            return 0, 0, 0, 0
        reached = credits(merge(target, [everything]))
        chosen = choose(reached, budget)
        with tempfile.TemporaryDirectory(prefix="qproxy-fuzz-kept-") as staging:
            for path in chosen:
                shutil.copy(path, os.path.join(staging, os.path.basename(path)))
            shutil.rmtree(kept_dir, ignore_errors=True)
            shutil.copytree(staging, kept_dir)
    # What the kept inputs reach together, counted by a merge of their own.
    kept_reach = sum(credits(merge(target, [kept_dir])).values()) if chosen else 0
    return len(chosen), len(reached), kept_reach, sum(reached.values())


def targets():
    return sorted(
        name[: -len(".rs")] for name in os.listdir(os.path.join(FUZZ, "fuzz_targets")) if name.endswith(".rs")
    )


def main():
    parser = arguments.parser("fuzz/minimize", __doc__)
    parser.add_argument("--budget", type=int, default=40, help="inputs kept per target (default: %(default)s)")
    parser.add_argument("targets", nargs="*", help="default: every target")
    args = parser.parse_args()
    for target in args.targets or targets():
        kept, of, edges, total = minimize(target, args.budget)
        share = f"{100 * edges / total:.1f}%" if total else "–"
        print(f"{target:22} kept {kept:3} of {of:5} inputs, reaching {edges:5} of their {total:5} edges ({share})")
    return 0
