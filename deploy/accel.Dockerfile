# The node agent's image (qproxy-accel, deploy/accel-daemonset.yaml), for
# Docker or BuildKit; deploy/build-image.sh --agent makes the same image
# without a container engine.
#
#   docker build -f deploy/accel.Dockerfile -t registry.example.com/qproxy-accel:0.1.0 .
#   docker buildx build -f deploy/accel.Dockerfile --platform linux/amd64,linux/arm64,linux/ppc64le \
#     -t registry.example.com/qproxy-accel:0.1.0 --push .
#
# The agent built with its BPF programs (clang and libbpf-dev compile them),
# statically linked, on an empty base. It runs as root: the DaemonSet drops
# every capability but the four it needs (docs/accel.md, "Privileges").

# Built on the builder's own platform for each target platform (buildx
# --platform), cross-compiling: no emulation. The BPF programs are the same
# for every little-endian target.
FROM --platform=$BUILDPLATFORM rust:1-bookworm AS build
ARG TARGETARCH
RUN apt-get update \
    && apt-get install -y --no-install-recommends clang libbpf-dev \
    && rm -rf /var/lib/apt/lists/*
COPY deploy/cross-env.sh /usr/local/bin/
RUN cross-env.sh install "$TARGETARCH"
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    triple="$(cross-env.sh triple "$TARGETARCH")" \
    && RUSTFLAGS="-C target-feature=+crt-static -C strip=symbols" \
       cross-env.sh run "$TARGETARCH" cargo build --locked --release -p qproxy-accel --features bpf --target "$triple" \
    && cp "target/$triple/release/qproxy-accel" /qproxy-accel \
    && ! readelf -lW /qproxy-accel | grep -q INTERP

FROM scratch
COPY deploy/rootfs/etc/passwd deploy/rootfs/etc/group /etc/
COPY --from=build /qproxy-accel /qproxy-accel
USER 0:0
# --metrics-addr in deploy/accel-daemonset.yaml.
EXPOSE 9095
LABEL org.opencontainers.image.title="qproxy-accel" \
      org.opencontainers.image.description="qproxy's node agent: an eBPF bypass of the loopback hop to the app" \
      org.opencontainers.image.licenses="Apache-2.0"
ENTRYPOINT ["/qproxy-accel"]
