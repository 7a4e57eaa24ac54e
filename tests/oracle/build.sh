#!/bin/sh
# Builds Knative's Go queue-proxy (serving v0.42.2) from the Go module proxy,
# the oracle qproxy's behaviour is compared with.
#
#   tests/oracle/build.sh [OUTPUT]
#
# OUTPUT defaults to target/oracle/queue-v0.42.2 at the repository root; a
# relative OUTPUT is taken from the current directory. An existing OUTPUT
# is kept.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/../../target/oracle/queue-v0.42.2}
case $out in
    /*) ;;
    *) out=$PWD/$out ;;
esac
if [ -x "$out" ]; then
    exit 0
fi
mkdir -p "$(dirname "$out")"
cd "$here"
go build -trimpath -o "$out.tmp" knative.dev/serving/cmd/queue
mv "$out.tmp" "$out"
