# The hostmesh image: the operator, and the agent that the init container of
# every host pod copies into the user's image. The binary is static (no libc
# at run time), so that copy runs in scratch, distroless, Alpine (musl) and
# old-glibc images alike.
#
#   docker build -t ghcr.io/hostmesh/hostmesh:0.1.0 \
#     --build-arg VERSION=0.1.0 --build-arg REVISION="$(git rev-parse HEAD)" .
#
# Without a Docker daemon or network, image/build.sh builds the same final
# stage with podman from a binary built on the host (docs/operations.md).

ARG RUST_VERSION=1.95

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
# The context usually has no .git: the revision comes in as an argument
# (cli/build.rs reads HOSTMESH_GIT_REVISION; `unknown` when empty).
ARG REVISION=""
ENV HOSTMESH_GIT_REVISION=${REVISION} \
    CARGO_TERM_COLOR=never
COPY . .
# glibc linked statically (crt-static); name resolution does not use it
# (hostmesh-net). `--target` keeps build scripts and proc macros dynamic.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    triple="$(uname -m)-unknown-linux-gnu" \
 && RUSTFLAGS="-C target-feature=+crt-static" \
    cargo build --release --locked --target "$triple" --bin hostmesh --bin hostmesh-agent \
 && cp "target/$triple/release/hostmesh" /hostmesh \
 && cp "target/$triple/release/hostmesh-agent" /hostmesh-agent \
 && for b in /hostmesh /hostmesh-agent; do if readelf -l "$b" | grep -q INTERP; then echo "$b is not static" >&2; exit 1; fi; done \
 && /hostmesh --version

FROM scratch
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="hostmesh" \
      org.opencontainers.image.description="The hostmesh operator and host agent (static; the agent runs in any image)" \
      org.opencontainers.image.source="https://github.com/hostmesh/hostmesh" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /hostmesh /usr/local/bin/hostmesh
# The agent-only build: what `hostmesh install-agent` copies into host pods.
COPY --from=build /hostmesh-agent /usr/local/bin/hostmesh-agent
# The init container runs `hostmesh install-agent ...` by name.
ENV PATH=/usr/local/bin
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/hostmesh"]
CMD ["--help"]
