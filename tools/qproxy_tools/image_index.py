"""Checks a multi-platform image archive as a registry tool reads it.

`skopeo` (not this project's packer) opens the archive: its image index
must list exactly the platforms asked for, each platform's image must say
its architecture, its one compressed layer must stay under a bound, and
the binary in that layer must be a statically linked ELF for that
architecture's machine (`readelf`).

Usage: python3 -m qproxy_tools.image_index ARCHIVE --platforms amd64,arm64,ppc64le
                                           [--binary qproxy] [--max-mib 6]
"""

import argparse
import json
import os
import sys
import tarfile
import tempfile

from . import oci_image
from .commands import PhaseError, run

INDEX_TYPES = (
    oci_image.INDEX_TYPE,
    "application/vnd.docker.distribution.manifest.list.v2+json",
)

# readelf -h's "Machine:" for each OCI architecture.
MACHINES = {
    "amd64": "Advanced Micro Devices X86-64",
    "arm64": "AArch64",
    "ppc64le": "PowerPC64",
}


def platforms(raw):
    """The architectures an image index lists (skopeo inspect --raw), in
    its order; arm64 must carry the variant v8, as Docker and containerd
    name it. Raises ValueError for anything but an index of linux images."""
    index = json.loads(raw)
    if index.get("mediaType") not in INDEX_TYPES:
        raise ValueError(f"not an image index: {index.get('mediaType')}")
    arches = []
    for entry in index.get("manifests", []):
        p = entry.get("platform", {})
        if p.get("os") != "linux":
            raise ValueError(f"a platform that is not linux: {p}")
        if p.get("architecture") == "arm64" and p.get("variant") != "v8":
            raise ValueError(f"arm64 without the variant v8: {p}")
        arches.append(p.get("architecture"))
    return arches


def architecture(inspected, arch):
    """Checks that a platform's image (skopeo inspect --override-arch ARCH)
    says it is for ARCH."""
    said = json.loads(inspected).get("Architecture")
    if said != arch:
        raise ValueError(f"asked for {arch}, the image says {said}")


def layer(manifest, arch):
    """The digest and compressed size of the one layer of a platform's
    image manifest (as skopeo copy writes it)."""
    layers = json.loads(manifest).get("layers") or []
    if len(layers) != 1:
        raise ValueError(f"{arch}: {len(layers)} layers, one expected")
    return layers[0]["digest"].split(":", 1)[1], int(layers[0]["size"])


def binary_problems(headers, program_headers, arch):
    """What is wrong with a binary, from readelf -h and readelf -lW: another
    machine than ARCH's, or a program interpreter (a dynamic loader, which
    an empty base lacks)."""
    problems = []
    machine = next(
        (line.split(":", 1)[1].strip() for line in headers.splitlines() if line.strip().startswith("Machine:")),
        None,
    )
    if machine != MACHINES.get(arch):
        problems.append(f"{arch}: the binary is for {machine}, not {MACHINES.get(arch)}")
    if "Data:" in headers and "little endian" not in headers:
        problems.append(f"{arch}: the binary is not little-endian")
    if "INTERP" in program_headers:
        problems.append(f"{arch}: the binary asks for a dynamic loader")
    return problems


def variant(arch):
    return ["--override-variant", "v8"] if arch == "arm64" else []


def check(archive, expected, binary, max_bytes, skopeo="skopeo", readelf="readelf"):
    """Every problem of `archive` (see the module's doc); returns the
    problems and each platform's compressed layer size."""
    reference = f"oci-archive:{archive}"
    problems = []
    listed = platforms(run([skopeo, "inspect", "--raw", reference], capture=True))
    if sorted(listed) != sorted(expected):
        problems.append(f"the index lists {listed}, not {expected}")
    sizes = {}
    for arch in listed:
        pick = ["--override-os", "linux", "--override-arch", arch] + variant(arch)
        architecture(run([skopeo, "inspect"] + pick + [reference], capture=True), arch)
        with tempfile.TemporaryDirectory() as work:
            copy = os.path.join(work, "image")
            run([skopeo, "copy", "--quiet"] + pick + [reference, f"dir:{copy}"], capture=True)
            with open(os.path.join(copy, "manifest.json")) as f:
                digest, size = layer(f.read(), arch)
            sizes[arch] = size
            if size > max_bytes:
                problems.append(f"{arch}: the layer is {size} bytes compressed, over {max_bytes}")
            with tarfile.open(os.path.join(copy, digest)) as tar:
                tar.extract(binary, work, filter="data")
            path = os.path.join(work, binary)
            problems += binary_problems(
                run([readelf, "-h", path], capture=True), run([readelf, "-lW", path], capture=True), arch
            )
    return problems, sizes


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("archive")
    parser.add_argument("--platforms", required=True, help="the architectures it must hold, comma-separated")
    parser.add_argument("--binary", default="qproxy", help="the binary's path in the layer")
    parser.add_argument("--max-mib", type=float, default=6, help="the bound on each compressed layer")
    args = parser.parse_args(argv)
    expected = [a.removeprefix("linux/") for a in args.platforms.split(",") if a]
    try:
        problems, sizes = check(args.archive, expected, args.binary, int(args.max_mib * 1024 * 1024))
    except (PhaseError, ValueError, KeyError, OSError) as e:
        print(f"image_index: {args.archive}: {e}", file=sys.stderr)
        return 1
    for arch, size in sizes.items():
        print(f"{arch}: {size / 1024 / 1024:.1f} MiB compressed")
    for problem in problems:
        print(f"image_index: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
