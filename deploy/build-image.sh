#!/usr/bin/env bash
# Builds qproxy's container image without a container engine: a static
# binary (glibc, statically linked), packed by deploy/oci_image.py into an
# image archive that docker load, kind load image-archive, ctr images import
# and skopeo copy all read. deploy/Dockerfile builds the same image with
# Docker or BuildKit.
#
# Usage: deploy/build-image.sh [--agent] [--profile release|dev] [--tag NAME:TAG] [--out ARCHIVE]
#                              [--platform linux/ARCH | --platforms linux/ARCH,linux/ARCH...]
#
# Defaults: the release profile, tag qproxy:<version>, the machine's own
# platform, and the archive at target/image/qproxy-<version>-<arch>.tar.
# Prints the archive's path. --platform builds for another architecture;
# --platforms builds one image index with a manifest per platform, at
# target/image/qproxy-<version>.tar (amd64, arm64, ppc64le; s390x is
# refused, deploy/README.md says why). The machine's own architecture is
# built with the workspace's toolchain; the others with Debian's Rust 1.96
# (rustc-web, cargo-web) and standard library for the target
# (libstd-rust-web-dev:ARCH) and its cross C compiler, which
# `scripts/test multiarch` installs (a missing one is named in one line).
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
platforms=""
while [ $# -gt 0 ]; do
    case "$1" in
        --agent) image=qproxy-accel; features=(--features bpf); shift ;;
        --profile) profile="$2"; shift 2 ;;
        --tag) tag="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        --platform) platforms="$2"; shift 2 ;;
        --platforms) platforms="$2"; index=1; shift 2 ;;
        -h|--help) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "build-image.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

# The names of each architecture come from deploy/cross-env.sh.
cross_env=deploy/cross-env.sh
host="$("$cross_env" host)" || exit 1
platforms="${platforms:-linux/$host}"
arches=()
for p in ${platforms//,/ }; do
    case "$p" in
        linux/*) arches+=("${p#linux/}") ;;
        *) echo "build-image.sh: a platform is linux/ARCH, not $p" >&2; exit 2 ;;
    esac
done
version="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)"
msrv="$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)"
tag="${tag:-$image:$version}"
if [ -n "${index:-}" ]; then
    out="${out:-target/image/$image-$version.tar}"
else
    out="${out:-target/image/$image-$version-${arches[0]}.tar}"
fi
case "$profile" in dev) dir=debug ;; *) dir="$profile" ;; esac

# Fails, naming what to install, unless Debian's Rust and the target's
# standard library and C compiler are here.
cross_ready() {
    local arch="$1" triple="$2"
    local need=()
    [ -x /usr/bin/rustc ] && [ -x /usr/bin/cargo ] || need+=(rustc-web cargo-web)
    [ -d "/usr/lib/rustlib/$triple" ] || need+=("libstd-rust-web-dev:$("$cross_env" debian "$arch")")
    # shellcheck disable=SC2207 # package names, one word each
    command -v "${triple%%-*}-linux-gnu-gcc" >/dev/null 2>&1 || need+=($("$cross_env" packages "$arch"))
    if [ ${#need[@]} -gt 0 ]; then
        echo "build-image.sh: linux/$arch needs Debian's ${need[*]} (scripts/test multiarch installs them)" >&2
        return 1
    fi
    local have
    have="$(/usr/bin/rustc --version | cut -d' ' -f2)"
    if [ "$(printf '%s\n%s\n' "$msrv" "$have" | sort -V | head -n1)" != "$msrv" ]; then
        echo "build-image.sh: linux/$arch: Debian's rustc is $have, below the workspace's rust-version $msrv" >&2
        return 1
    fi
}

# Builds the static binary for an architecture; prints its path.
build_one() {
    local arch="$1" triple
    if [ "$arch" = s390x ]; then
        echo "build-image.sh: linux/s390x: Debian serves its standard library only for Rust 1.85, below the workspace's rust-version; see deploy/README.md" >&2
        return 1
    fi
    triple="$("$cross_env" triple "$arch")" || return 1
    local rustflags="-C target-feature=+crt-static -C strip=symbols"
    if [ "$arch" = "$host" ]; then
        # A separate target directory: the static flags would otherwise
        # rebuild every dependency of the ordinary builds.
        CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target/image}" RUSTFLAGS="$rustflags" \
            cargo build --locked -p "$image" "${features[@]}" --profile "$profile" --target "$triple" >&2
        echo "${CARGO_TARGET_DIR:-target/image}/$triple/$dir/$image"
        return
    fi
    cross_ready "$arch" "$triple" || return 1
    # Debian's toolchain, ahead of rustup's, in a target directory of its
    # own (another compiler rebuilds every dependency).
    env PATH="/usr/bin:$PATH" RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc \
        CARGO_TARGET_DIR=target/image-cross RUSTFLAGS="$rustflags" \
        "$cross_env" run "$arch" \
        /usr/bin/cargo build --locked -p "$image" "${features[@]}" --profile "$profile" --target "$triple" >&2
    echo "target/image-cross/$triple/$dir/$image"
}

args=()
for arch in "${arches[@]}"; do
    binary="$(build_one "$arch")" || exit 1
    # A binary that still asks for a dynamic loader would not start on an
    # empty base; refuse to pack it.
    if readelf -lW "$binary" | grep -q 'INTERP'; then
        echo "build-image.sh: $binary is dynamically linked" >&2
        exit 1
    fi
    args+=(--platform "$arch=$binary")
done

mkdir -p "$(dirname "$out")"
SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}" \
    python3 deploy/oci_image.py --image "$image" "${args[@]}" --out "$out" --tag "$tag" \
    --version "$version"
echo "$out"
