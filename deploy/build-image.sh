#!/usr/bin/env bash
# Builds qproxy's container image without a container engine: a static
# binary (glibc, statically linked), packed by deploy/oci_image.py into an
# image archive that docker load, kind load image-archive, ctr images import
# and skopeo copy all read. deploy/Dockerfile builds the same image with
# Docker or BuildKit.
#
# Usage: deploy/build-image.sh [--agent] [--profile release|dev] [--tag NAME:TAG] [--out ARCHIVE]
#
# Defaults: the release profile, tag qproxy:<version>, and the archive at
# target/image/qproxy-<version>-<arch>.tar. Prints the archive's path.
# --agent builds the node agent's image instead (qproxy-accel with its BPF
# programs, which needs clang and libbpf-dev; deploy/accel-daemonset.yaml):
# tag qproxy-accel:<version>, archive target/image/qproxy-accel-<version>-<arch>.tar.
set -euo pipefail
cd "$(dirname "$0")/.."

profile=release
image=qproxy
features=()
tag=""
out=""
while [ $# -gt 0 ]; do
    case "$1" in
        --agent) image=qproxy-accel; features=(--features bpf); shift ;;
        --profile) profile="$2"; shift 2 ;;
        --tag) tag="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "build-image.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

machine="$(uname -m)"
case "$machine" in
    x86_64) arch=amd64 ;;
    aarch64) arch=arm64 ;;
    *) echo "build-image.sh: unsupported machine $machine" >&2; exit 1 ;;
esac
triple="$machine-unknown-linux-gnu"
version="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)"
tag="${tag:-$image:$version}"
out="${out:-target/image/$image-$version-$arch.tar}"

# A separate target directory: the static flags would otherwise rebuild
# every dependency of the ordinary builds.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target/image}"
RUSTFLAGS="-C target-feature=+crt-static -C strip=symbols" \
    cargo build --locked -p "$image" "${features[@]}" --profile "$profile" --target "$triple" >&2
case "$profile" in dev) dir=debug ;; *) dir="$profile" ;; esac
binary="$CARGO_TARGET_DIR/$triple/$dir/$image"

# A binary that still asks for a dynamic loader would not start on an empty
# base; refuse to pack it.
if readelf -lW "$binary" | grep -q 'INTERP'; then
    echo "build-image.sh: $binary is dynamically linked" >&2
    exit 1
fi

mkdir -p "$(dirname "$out")"
SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}" \
    python3 deploy/oci_image.py --image "$image" --binary "$binary" --out "$out" --tag "$tag" \
    --arch "$arch" --version "$version"
echo "$out"
