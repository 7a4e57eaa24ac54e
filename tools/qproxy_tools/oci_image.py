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

Usage: oci_image.py --binary PATH --out ARCHIVE [--image qproxy|qproxy-accel]
                    [--tag NAME:TAG] [--arch amd64] [--version V]
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
    """Returns the archive's files, path -> bytes, in the order they are written."""
    kind = IMAGES[image]
    with open(binary, "rb") as f:
        entries = user_files() + [(image, f.read(), 0o755)]
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
    return archive_files(entries, config, labels, tag, arch, mtime, "deploy/build-image.sh")


def archive_files(entries, config, labels, tag, arch, mtime, created_by):
    """An image of one layer holding `entries` (see `layer`), run as
    `config` (the image config's User, Env, Entrypoint, Cmd,
    ExposedPorts); returns the archive's files, path -> bytes, in the order
    they are written, and the compressed layer's size."""
    rootfs = layer(entries, mtime)
    compressed = io.BytesIO()
    with gzip.GzipFile(fileobj=compressed, mode="wb", mtime=0) as gz:
        gz.write(rootfs)
    compressed = compressed.getvalue()

    created = datetime.fromtimestamp(mtime, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    config = canonical(
        {
            "architecture": arch,
            "os": "linux",
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
    index = canonical(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": digest(manifest),
                    "size": len(manifest),
                    "platform": {"architecture": arch, "os": "linux"},
                    "annotations": {
                        "io.containerd.image.name": qualified(tag),
                        "org.opencontainers.image.ref.name": tag.rsplit(":", 1)[-1],
                    },
                }
            ],
        }
    )

    def blob(data):
        return "blobs/sha256/" + hashlib.sha256(data).hexdigest()

    docker_manifest = canonical([{"Config": blob(config), "RepoTags": [tag], "Layers": [blob(compressed)]}])
    return [
        ("oci-layout", canonical({"imageLayoutVersion": "1.0.0"})),
        ("index.json", index),
        ("manifest.json", docker_manifest),
        (blob(config), config),
        (blob(manifest), manifest),
        (blob(compressed), compressed),
    ], len(compressed)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", required=True, help="the static binary")
    parser.add_argument("--image", default="qproxy", choices=sorted(IMAGES), help="which image")
    parser.add_argument("--out", required=True, help="the archive to write")
    parser.add_argument("--tag", default="qproxy:latest", help="image name and tag")
    parser.add_argument("--arch", default="amd64", help="OCI architecture name")
    parser.add_argument("--version", default="", help="image version label")
    args = parser.parse_args()

    mtime = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    files, layer_size = build(args.binary, args.image, args.tag, args.arch, args.version, mtime)
    write_archive(args.out, files, mtime)
    print(f"{args.out}: {args.tag}, compressed layer {layer_size} bytes", file=sys.stderr)


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
