#!/bin/sh
# Builds Knative's Go queue-proxy from the Go module proxy: the oracle
# qproxy's behaviour is compared with, one per Knative generation.
#
#   tests/oracle/build.sh VERSION [OUTPUT]
#
# VERSION is a folder here, each a Go module pinning that release of
# knative.dev/serving by its go.sum:
#   v0.42.2  classic Knative (Knative 1.15): separate observability variables
#   v0.50.0  current Knative: OBSERVABILITY_CONFIG, OpenTelemetry
# OUTPUT defaults to target/oracle/queue-VERSION at the repository root; a
# relative OUTPUT is taken from the current directory. An existing OUTPUT
# is kept.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
version=${1:?usage: tests/oracle/build.sh VERSION [OUTPUT]}
if [ ! -f "$here/$version/go.mod" ]; then
    echo "build.sh: no oracle $version; the versions are: $(cd "$here" && ls -d v*/ | tr -d /)" >&2
    exit 2
fi
out=${2:-$here/../../target/oracle/queue-$version}
case $out in
    /*) ;;
    *) out=$PWD/$out ;;
esac
if [ -x "$out" ]; then
    exit 0
fi
mkdir -p "$(dirname "$out")"
cd "$here/$version"
go build -trimpath -o "$out.tmp" knative.dev/serving/cmd/queue
mv "$out.tmp" "$out"
