#!/bin/sh
# What a build of qproxy for linux/ARCH needs to know, in one place for
# deploy/build-image.sh, the Dockerfiles and scripts/multiarch: the Rust
# target, Debian's cross C compiler and C library (aws-lc-sys compiles C),
# and the variables that point cargo and the cc crate at them.
#
#   cross-env.sh host              this machine's architecture (an OCI name)
#   cross-env.sh triple ARCH       the Rust target, e.g. aarch64-unknown-linux-gnu
#   cross-env.sh debian ARCH       Debian's name of the architecture (ppc64el)
#   cross-env.sh packages ARCH     Debian's packages of its C compiler and C library
#                                  (none for the machine's own architecture)
#   cross-env.sh install ARCH      installs those and the target's standard
#                                  library with rustup (the Dockerfiles' build stage)
#   cross-env.sh run ARCH CMD...   runs CMD with the target's linker, C compiler
#                                  and archiver (cargo build --target TRIPLE ...)
#
# ARCH is an OCI architecture: amd64, arm64 or ppc64le. POSIX sh: the
# Dockerfiles' build stage runs it with dash.
set -eu

# The machine name of an OCI architecture (as the GNU triples spell it).
machine() {
    case "$1" in
        amd64) echo x86_64 ;;
        arm64) echo aarch64 ;;
        ppc64le) echo powerpc64le ;;
        *) echo "cross-env.sh: unsupported platform linux/$1 (amd64, arm64, ppc64le)" >&2; return 2 ;;
    esac
}

# This machine's OCI architecture (uname spells ppc64le as OCI does).
host() {
    case "$(uname -m)" in
        x86_64) echo amd64 ;;
        aarch64) echo arm64 ;;
        ppc64le) echo ppc64le ;;
        *) echo "cross-env.sh: unsupported machine $(uname -m)" >&2; return 2 ;;
    esac
}

what="${1:-}"
if [ "$what" = host ]; then
    host
    exit
fi
arch="${2:-}"
if [ -z "$what" ] || [ -z "$arch" ]; then
    sed -n '7,18p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
fi
m="$(machine "$arch")"
triple="$m-unknown-linux-gnu"
gnu="$m-linux-gnu"
own=""
[ "$arch" = "$(host)" ] && own=1
# Debian's name of the architecture, for its packages.
deb="$arch"
[ "$arch" != ppc64le ] || deb=ppc64el

case "$what" in
    triple) echo "$triple" ;;
    debian) echo "$deb" ;;
    packages) [ -n "$own" ] || echo "gcc-$gnu libc6-dev-$deb-cross" ;;
    install)
        if [ -z "$own" ]; then
            apt-get update -q
            # shellcheck disable=SC2046 # two package names
            apt-get install -y -q --no-install-recommends $("$0" packages "$arch")
            rm -rf /var/lib/apt/lists/*
        fi
        rustup target add "$triple"
        ;;
    run)
        shift 2
        if [ -z "$own" ]; then
            upper="$(echo "$triple" | tr '[:lower:]-' '[:upper:]_')"
            lower="$(echo "$triple" | tr '-' '_')"
            export "CARGO_TARGET_${upper}_LINKER=$gnu-gcc" "CC_$lower=$gnu-gcc" "AR_$lower=$gnu-ar"
        fi
        exec "$@"
        ;;
    *) echo "cross-env.sh: no command $what (host, triple, debian, packages, install, run)" >&2; exit 2 ;;
esac
