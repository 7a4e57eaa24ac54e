"""Pack a static binary into a container image archive, no daemon needed.

The archive is an OCI image layout in a tar (what `skopeo` calls
`oci-archive:`) that also carries Docker's `manifest.json`, so `docker load`,
`kind load image-archive`, `ctr images import` and `skopeo copy` all read it.

Two images, by `--image`:

- `qproxy` (the default): the sidecar at /qproxy, run as 65532:65532 (the
  `nonroot` user of deploy/rootfs's /etc/passwd and /etc/group), declaring
  qproxy's ports.
- `qproxy-accel`: the node agent at /qproxy-accel, run as root (it loads BPF
  programs; its DaemonSet grants the capabilities), declaring its metrics
  port.

Each has one layer: the binary and deploy/rootfs's /etc/passwd and
/etc/group. Every timestamp is SOURCE_DATE_EPOCH (0 when unset), so the
same binary gives the same bytes.

With `--platform ARCH=PATH` for each of several architectures, the
archive is one image index with a manifest per platform, which containerd
(`ctr images import --all-platforms`, `kind load image-archive`) and
`skopeo copy --all` read whole, and from which a node's containerd picks
its own platform. Docker's `manifest.json` lists the first platform's
image only: without its containerd image store, `docker load` takes that
one.

Usage: oci_image.py --binary PATH --out ARCHIVE [--image qproxy|qproxy-accel]
                    [--tag NAME:TAG] [--arch amd64] [--version V]
       oci_image.py --platform ARCH=PATH [--platform ARCH=PATH ...] --out ARCHIVE ...
"""

import argparse
import gzip
import hashlib
import io
import json
import os
import sys
import tarfile
from datetime import UTC, datetime

from . import ROOT

# The media type of an image index (an OCI layout's index.json, and the
# blob that lists a multi-platform image's platforms).
INDEX_TYPE = "application/vnd.oci.image.index.v1+json"

IMAGES = {
    "qproxy": {
        "user": "65532:65532",
        # The main handler (HTTP/1.1 and h2c), admin, autoscaler stats, user
        # metrics and the CPU profile, as in Knative's queue-proxy container
        # spec.
        "ports": [8012, 8013, 8022, 9090, 9091, 8008],
        # glibc's heap keeps up to 8 MiB it freed at its top instead of
        # giving it back at once, and never serves 256 KiB body buffers
        # from fresh mappings: without it some processes give large
        # answers' buffers back and fault them in again at every answer
        # (docs/configuration.md, "The image's environment").
        "env": ["GLIBC_TUNABLES=glibc.malloc.trim_threshold=8388608:glibc.malloc.mmap_threshold=1048576"],
        "description": "A drop-in replacement for Knative Serving's queue-proxy",
    },
    "qproxy-accel": {
        "user": "0:0",
        # --metrics-addr in deploy/accel-daemonset.yaml.
        "ports": [9095],
        "description": "qproxy's node agent: an eBPF bypass of the loopback hop to the app",
    },
}
ROOTFS = os.path.join(ROOT, "deploy", "rootfs")


def tar_entry(name, data, mode, mtime):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    info.mtime = mtime
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info, io.BytesIO(data)


def tar_dir(name, mtime):
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = 0o755
    info.mtime = mtime
    info.uname = info.gname = ""
    return info


def layer(entries, mtime):
    """A root filesystem as an uncompressed tar, entries in the order given:
    (path, bytes, mode) for a file, (path, None, mode) for a directory."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data, mode in entries:
            if data is None:
                info = tar_dir(name, mtime)
                info.mode = mode
                tar.addfile(info)
            else:
                tar.addfile(*tar_entry(name, data, mode, mtime))
    return out.getvalue()


def user_files():
    """/etc/passwd and /etc/group from deploy/rootfs: root and nonroot (65532)."""
    entries = [("etc", None, 0o755)]
    for name in ("group", "passwd"):
        with open(os.path.join(ROOTFS, "etc", name), "rb") as f:
            entries.append(("etc/" + name, f.read(), 0o644))
    return entries


def qualified(tag):
    """The image name as containerd and the kubelet spell it: docker.io and
    library/ made explicit, as Docker does when it writes an archive."""
    first, _, rest = tag.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return tag
    if not rest:
        return "docker.io/library/" + tag
    return "docker.io/" + tag


def digest(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def build(binary, image, tag, arch, version, mtime):
    """Returns the archive's files, path -> bytes, in the order they are
    written, and the compressed layer's size."""
    files, sizes = build_index({arch: binary}, image, tag, version, mtime)
    return files, sizes[arch]


def build_index(binaries, image, tag, version, mtime):
    """The archive of one image index with a manifest per platform,
    `binaries` mapping each architecture to its binary (the first is the
    one Docker's manifest.json names); returns its files, path -> bytes, in
    the order they are written, and each compressed layer's size by
    architecture."""
    kind = IMAGES[image]
    config = {
        "User": kind["user"],
        **({"Env": kind["env"]} if "env" in kind else {}),
        "Entrypoint": ["/" + image],
        "ExposedPorts": {f"{p}/tcp": {} for p in kind["ports"]},
    }
    labels = {
        "org.opencontainers.image.title": image,
        "org.opencontainers.image.description": kind["description"],
        "org.opencontainers.image.version": version,
        "org.opencontainers.image.licenses": "Apache-2.0",
    }
    images = []
    for arch, binary in binaries.items():
        with open(binary, "rb") as f:
            entries = user_files() + [(image, f.read(), 0o755)]
        images.append(image_blobs(entries, config, labels, arch, mtime, "deploy/build-image.sh"))
    return index_files(images, tag), {i.arch: len(i.layer) for i in images}


class Image:
    """One platform's image: its config, manifest and compressed layer."""

    def __init__(self, arch, config, manifest, layer):
        self.arch, self.config, self.manifest, self.layer = arch, config, manifest, layer


def platform(arch):
    """The OCI platform of an architecture: arm64 with the variant v8, as
    Docker and containerd name it."""
    return {"architecture": arch, "os": "linux", **({"variant": "v8"} if arch == "arm64" else {})}


def archive_files(entries, config, labels, tag, arch, mtime, created_by):
    """An image of one layer holding `entries` (see `layer`), run as
    `config` (the image config's User, Env, Entrypoint, Cmd,
    ExposedPorts); returns the archive's files, path -> bytes, in the order
    they are written, and the compressed layer's size."""
    image = image_blobs(entries, config, labels, arch, mtime, created_by)
    return index_files([image], tag), len(image.layer)


def image_blobs(entries, config, labels, arch, mtime, created_by):
    """The blobs of an image for `arch` of one layer holding `entries`."""
    rootfs = layer(entries, mtime)
    compressed = io.BytesIO()
    with gzip.GzipFile(fileobj=compressed, mode="wb", mtime=0) as gz:
        gz.write(rootfs)
    compressed = compressed.getvalue()

    created = datetime.fromtimestamp(mtime, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    config = canonical(
        {
            **platform(arch),
            "created": created,
            "config": {**config, "WorkingDir": "/", "Labels": labels},
            "rootfs": {"type": "layers", "diff_ids": [digest(rootfs)]},
            "history": [{"created": created, "created_by": created_by}],
        }
    )
    manifest = canonical(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": digest(config),
                "size": len(config),
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": digest(compressed),
                    "size": len(compressed),
                }
            ],
        }
    )
    return Image(arch, config, manifest, compressed)


def index_files(images, tag):
    """The archive's files for `images`, named `tag`, in the order they are
    written. One image's manifest is named by index.json itself; several
    are listed, each with its platform, in an image index of their own
    (a blob), which index.json names, as BuildKit writes a multi-platform
    image: one image in the layout, whose platforms a runtime picks from."""
    annotations = {
        "io.containerd.image.name": qualified(tag),
        "org.opencontainers.image.ref.name": tag.rsplit(":", 1)[-1],
    }

    def listed(image):
        return {
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": digest(image.manifest),
            "size": len(image.manifest),
            "platform": platform(image.arch),
        }

    def blob(data):
        return "blobs/sha256/" + hashlib.sha256(data).hexdigest()

    nested = []
    if len(images) == 1:
        top = {**listed(images[0]), "annotations": annotations}
    else:
        platforms = canonical(
            {
                "schemaVersion": 2,
                "mediaType": INDEX_TYPE,
                "manifests": [listed(image) for image in images],
            }
        )
        nested = [(blob(platforms), platforms)]
        top = {
            "mediaType": INDEX_TYPE,
            "digest": digest(platforms),
            "size": len(platforms),
            "annotations": annotations,
        }
    index = canonical(
        {
            "schemaVersion": 2,
            "mediaType": INDEX_TYPE,
            "manifests": [top],
        }
    )
    first = images[0]
    docker_manifest = canonical([{"Config": blob(first.config), "RepoTags": [tag], "Layers": [blob(first.layer)]}])
    files = [
        ("oci-layout", canonical({"imageLayoutVersion": "1.0.0"})),
        ("index.json", index),
        ("manifest.json", docker_manifest),
    ] + nested
    for image in images:
        files += [(blob(data), data) for data in (image.config, image.manifest, image.layer)]
    return files


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", help="the static binary, for --arch")
    parser.add_argument(
        "--platform",
        action="append",
        default=[],
        metavar="ARCH=PATH",
        help="a platform's static binary (repeated: one image index with a manifest per platform)",
    )
    parser.add_argument("--image", default="qproxy", choices=sorted(IMAGES), help="which image")
    parser.add_argument("--out", required=True, help="the archive to write")
    parser.add_argument("--tag", default="qproxy:latest", help="image name and tag")
    parser.add_argument("--arch", default="amd64", help="OCI architecture name")
    parser.add_argument("--version", default="", help="image version label")
    args = parser.parse_args()

    mtime = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    if bool(args.binary) == bool(args.platform):
        parser.error("give --binary, or --platform ARCH=PATH for each platform")
    binaries = {args.arch: args.binary} if args.binary else dict(p.split("=", 1) for p in args.platform)
    files, sizes = build_index(binaries, args.image, args.tag, args.version, mtime)
    write_archive(args.out, files, mtime)
    layers = ", ".join(f"{arch} {size} bytes" for arch, size in sizes.items())
    print(f"{args.out}: {args.tag}, compressed layer: {layers}", file=sys.stderr)


def write_archive(out, files, mtime):
    """Writes the files `archive_files` returned as the image archive `out`,
    in place of any earlier one."""
    tmp = out + ".tmp"
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(tar_dir("blobs", mtime))
        tar.addfile(tar_dir("blobs/sha256", mtime))
        for name, data in files:
            tar.addfile(*tar_entry(name, data, 0o644, mtime))
    os.replace(tmp, out)
