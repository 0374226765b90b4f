#!/usr/bin/env bash
# Builds the hostmesh image offline, without a Docker daemon: a static
# hostmesh from this checkout (glibc linked in with crt-static), then
# image/Containerfile (FROM scratch) around it with podman or buildah.
#
#   image/build.sh [TAG...]     default tag: ghcr.io/hostmesh/hostmesh:<version>
#
# Environment: HOSTMESH_BUILD_TOOL (podman or buildah; default: podman when
# installed), CARGO_BUILD_JOBS, CARGO_TARGET_DIR. Prints the image id last.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
tags=("$@")
[ ${#tags[@]} -gt 0 ] || tags=("ghcr.io/hostmesh/hostmesh:${version}")

tool=${HOSTMESH_BUILD_TOOL:-}
if [ -z "$tool" ]; then
  if command -v podman >/dev/null 2>&1; then tool=podman
  elif command -v buildah >/dev/null 2>&1; then tool=buildah
  else echo "image/build.sh: needs podman or buildah (apt-get install podman)" >&2; exit 1
  fi
fi

triple="$(uname -m)-unknown-linux-gnu"
target_dir=${CARGO_TARGET_DIR:-$root/target}
start=$(date +%s)
RUSTFLAGS="-C target-feature=+crt-static" \
  cargo build --release --locked --target "$triple" --bin hostmesh --bin hostmesh-agent >&2
bin="$target_dir/$triple/release/hostmesh"
agent="$target_dir/$triple/release/hostmesh-agent"
echo "image/build.sh: static build took $(( $(date +%s) - start ))s" >&2

# Static: no program interpreter, so no libc is needed at run time.
for b in "$bin" "$agent"; do
  if LC_ALL=C readelf -l "$b" | grep -q 'Requesting program interpreter'; then
    echo "image/build.sh: $b is dynamically linked" >&2; exit 1
  fi
done

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
cp "$bin" "$ctx/hostmesh"
# The agent-only build that install-agent copies into every host pod.
cp "$agent" "$ctx/hostmesh-agent"
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  cp /etc/ssl/certs/ca-certificates.crt "$ctx/"
else
  : > "$ctx/ca-certificates.crt"
fi

tag_args=()
for t in "${tags[@]}"; do tag_args+=(--tag "$t"); done
case "$tool" in
  podman) build=(podman build) ;;
  buildah) build=(buildah build) ;;
  *) echo "image/build.sh: HOSTMESH_BUILD_TOOL must be podman or buildah" >&2; exit 1 ;;
esac
"${build[@]}" --quiet --file image/Containerfile \
  --build-arg "VERSION=$version" --build-arg "REVISION=$revision" \
  "${tag_args[@]}" "$ctx"
