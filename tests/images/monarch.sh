#!/usr/bin/env bash
# Builds the e2e suite's Monarch image for a cluster's own nodes: this
# machine's Monarch venv (the one the Monarch tests use, made here if
# missing: testkit's TORCHMONARCH and the Kubernetes client) at the same
# path, the Python it was made from, the shared libraries they load and a
# static busybox for /bin/sh. A Monarch World's workers and the client pods
# run `python` from it exactly as the process kubelet runs the venv's.
#
#   tests/images/monarch.sh [TAG]     default tag: localhost/hostmesh-e2e/monarch:e2e
#
# Needs podman and busybox-static. Prints the tag last. Load it into a
# cluster's node afterwards (../shared/realk8s/load-image.sh TAG).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
tag=${1:-localhost/hostmesh-e2e/monarch:e2e}
target_dir=${CARGO_TARGET_DIR:-$root/target}
venv="$target_dir/monarch-venv"

monarch=$(sed -n 's/^pub const TORCHMONARCH: &str = "\(.*\)";$/\1/p' "$root/testkit/src/monarch.rs")
[ -n "$monarch" ] || { echo "monarch.sh: no TORCHMONARCH in testkit/src/monarch.rs" >&2; exit 1; }
probe='import monarch.actor, monarch.job.kubernetes, kubernetes'
if ! "$venv/bin/python3" -c "$probe" 2>/dev/null; then
  echo "monarch.sh: making $venv ($monarch, kubernetes)" >&2
  python3 -m venv "$venv"
  "$venv/bin/python3" -m pip install -q "$monarch" kubernetes >&2
  "$venv/bin/python3" -c "$probe"
fi
busybox=$(command -v busybox || true)
if [ -z "$busybox" ] || LC_ALL=C readelf -l "$busybox" | grep -q 'program interpreter'; then
  echo "monarch.sh: needs a static busybox (apt-get install busybox-static)" >&2; exit 1
fi

python=$(readlink -f "$venv/bin/python3")
base=$("$venv/bin/python3" -c 'import sys; print(sys.base_prefix)')
pyver=$("$venv/bin/python3" -c 'import sys; print(f"python{sys.version_info[0]}.{sys.version_info[1]}")')

rootfs=$(mktemp -d)
trap 'rm -rf "$rootfs"' EXIT
copy() { # copy PATH... into the rootfs at the same paths, links kept
  for p in "$@"; do tar -C / -c "${p#/}" | tar -C "$rootfs" -x; done
}
copy_file() { # copy FILE... as files at the same paths (links followed)
  for p in "$@"; do tar -C / -c -h "${p#/}" | tar -C "$rootfs" -x; done
}
copy "$venv"
# The interpreter and each link on the way to it from the venv's python3.
link="$venv/bin/python3"
while [ -L "$link" ]; do
  next=$(readlink "$link"); case "$next" in /*) ;; *) next="$(dirname "$link")/$next" ;; esac
  copy "$next"; link=$next
done
# The standard library, without what no worker imports.
mkdir -p "$rootfs$base/lib"
tar -C / -c --exclude="${base#/}/lib/$pyver/site-packages" --exclude="${base#/}/lib/$pyver/test" \
  --exclude='*/idlelib' --exclude='*/tkinter' --exclude='*/turtledemo' --exclude='*/ensurepip' \
  "${base#/}/lib/$pyver" | tar -C "$rootfs" -x
mkdir -p "$rootfs$base/lib/$pyver/site-packages"
for lib in "$base"/lib/libpython*; do [ -e "$lib" ] && copy "$lib"; done
# Every shared library the interpreter and the venv's extensions load.
{
  echo "$python"
  find "$venv" "$rootfs$base/lib" -name '*.so*' -type f
} | while read -r f; do ldd "$f" 2>/dev/null || true; done \
  | awk '/=> \// {print $3} /^\s*\/lib/ {print $1}' | sort -u | while read -r lib; do
    case "$lib" in "$venv"/*|"$rootfs"/*) continue ;; esac
    copy_file "$lib"
  done
for ld in /lib64/ld-linux-x86-64.so.2 /lib/ld-linux-aarch64.so.1; do
  if [ -e "$ld" ]; then copy_file "$ld"; fi
done
# A shell and the usual tools, a writable /tmp, and a passwd for getpwuid.
mkdir -p "$rootfs/bin" "$rootfs/tmp" "$rootfs/etc"
chmod 1777 "$rootfs/tmp"
cp "$busybox" "$rootfs/bin/busybox"
for app in $("$busybox" --list); do [ -e "$rootfs/bin/$app" ] || ln -s busybox "$rootfs/bin/$app"; done
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' > "$rootfs/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' > "$rootfs/etc/group"

tar -C "$rootfs" -c . | podman import \
  --change "ENV PATH=$venv/bin:/usr/local/bin:/usr/bin:/bin" \
  --change "WORKDIR /tmp" \
  - "$tag" >/dev/null
echo "$tag"
