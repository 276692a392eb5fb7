#!/usr/bin/env bash
# ctest -L image: builds the runtime image with deploy/image/build (mmdebstrap
# root filesystem from Debian's archive, podman with the vfs driver in a
# throw-away store) and proves it runs stagewise:
#   - runtime-packages names the package of every library the binaries link;
#   - the image's user is 10001:10001 and it holds the three binaries;
#   - inside the image's own file system (podman image mount; chroot, a
#     private /proc, as uid 10001, the root read-only as in deploy/k8s):
#     every binary's --help, and a tiny job on
#     Fashion-MNIST from the image with `stagewise local` (a coordinator and
#     2 workers, mutual TLS);
#   - the docker-archive holds the image.
# Prints the image size and build times. Exit 77 (skipped) when not root or a
# tool is missing (scripts/setup installs mmdebstrap and podman), or when
# Debian's archive cannot be reached.
#   image_test.sh SOURCE_DIR BINARY_DIR
set -euo pipefail
src=$1
bin=$2/bin
skip() { echo "skipped: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "needs root (mmdebstrap root mode, chroot)"
for tool in mmdebstrap podman unshare chroot; do
  command -v "$tool" >/dev/null || skip "$tool not found (scripts/setup installs it)"
done

unshare --mount --pid --fork true 2>/dev/null ||
  skip "cannot make mount and pid namespaces here (unshare; a container without CAP_SYS_ADMIN?)"

work=$(mktemp -d /tmp/stagewise_image_XXXXXX)
PODMAN=(podman --storage-driver vfs --root "$work/storage" --runroot "$work/run")
cleanup() {
  "${PODMAN[@]}" image unmount --all >/dev/null 2>&1 || true
  "${PODMAN[@]}" system reset --force >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

# 1. The package list covers every library the binaries link directly.
missing=0
for b in stagewise stagewise-coordinator stagewise-worker; do
  for lib in $(readelf -d "$bin/$b" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
    path=$(ldconfig -p | awk -v l="$lib" '$1 == l && !found { print $NF; found = 1 }')
    [ -n "$path" ] || { echo "FAIL: $b links $lib, which ldconfig does not know"; missing=1; continue; }
    pkg=$(dpkg -S "$(readlink -f "$path")" 2>/dev/null | sed -n '1s/:.*//p' || true)
    case "$pkg" in libc6|libgcc-s1|"") continue ;; esac  # essential, always in the image
    if ! grep -qx "$pkg" "$src/deploy/image/runtime-packages"; then
      echo "FAIL: $b links $lib from $pkg, which deploy/image/runtime-packages does not name"
      missing=1
    fi
  done
done
[ "$missing" = 0 ] || exit 1
echo "ok: runtime-packages names the package of every library the binaries link"

# 2. Build. The root filesystem is cached in BINARY_DIR/image by package list.
start=$(date +%s)
set +e
OUT="$2/image" BIN_DIR="$bin" PODMAN_ARGS="${PODMAN[*]:1}" "$src/deploy/image/build" \
  > "$work/build.log" 2>&1
rc=$?
set -e
cat "$work/build.log"
if [ $rc -ne 0 ]; then
  if grep -qE "Temporary failure resolving|Could not resolve|Failed to fetch|apt-get update.*failed" \
      "$work/build.log"; then
    skip "Debian's archive cannot be reached (see the log above)"
  fi
  echo "FAIL: deploy/image/build exited $rc"
  exit 1
fi
echo "ok: built in $(( $(date +%s) - start ))s"
name=$("$src/deploy/image/build" --print-name)
version=${name##*:}

# 3. The image itself.
user=$("${PODMAN[@]}" image inspect --format '{{.Config.User}}' "$name")
[ "$user" = "10001:10001" ] || { echo "FAIL: image user is '$user', not 10001:10001"; exit 1; }
size=$("${PODMAN[@]}" image inspect --format '{{.Size}}' "$name")
echo "ok: $name runs as $user; size $(( size / 1048576 )) MiB"
root=$("${PODMAN[@]}" image mount "$name")
for b in stagewise stagewise-coordinator stagewise-worker; do
  cmp "$bin/$b" "$root/usr/local/bin/$b" || { echo "FAIL: /usr/local/bin/$b differs from $bin/$b"; exit 1; }
done
if [ -e "$root/usr/bin/gcc" ] || [ -e "$root/usr/bin/cc" ] || [ -e "$root/usr/bin/apt-get" ]; then
  echo "FAIL: the runtime image holds a compiler or apt"
  exit 1
fi

# 4. Run inside the image's file system as Kubernetes runs the pods
# (deploy/k8s): uid 10001, the root file system read-only, /tmp a writable
# volume; with a private mount and pid namespace and /proc (LibTorch reads
# /proc/cpuinfo).
mkdir -p "$work/tmp/job"
cat > "$work/tmp/job/tiny.yaml" <<'EOF'
name: image-tiny
seed: 0
model:
  name: mlp
  hidden: [32]
data:
  dataset: fashion_mnist     # the packaged copy in the image
algorithm: backprop
stages: 2
optimizer:
  name: sgd
  lr: 0.1
batch_size: 64
steps: 6
EOF
chmod 1777 "$work/tmp" "$work/tmp/job"
chmod 0644 "$work/tmp/job/tiny.yaml"
inside() {
  unshare --mount --pid --fork --kill-child /bin/sh -c '
    mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" &&
    mount -t proc proc "$1/proc" && mount --bind "$2" "$1/tmp" &&
    exec chroot --userspec=10001:10001 "$1" /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin \
      HOME=/tmp OMP_NUM_THREADS=1 /bin/sh -c "$3"' sh "$root" "$work/tmp" "$1"
}
for b in stagewise stagewise-coordinator stagewise-worker; do
  out=$(inside "$b --help")
  grep -q "^Usage: $b" <<< "$out" || { echo "FAIL: $b --help in the image:"; echo "$out"; exit 1; }
done
echo "ok: stagewise, stagewise-coordinator and stagewise-worker --help run in the image"
out=$(inside "cd /tmp/job && stagewise local tiny.yaml" 2>&1) || {
  echo "FAIL: stagewise local in the image:"
  echo "$out"
  exit 1
}
echo "$out" | tail -12
# local exits 0 only when the job SUCCEEDED.
grep -qE "^steps +6/6" <<< "$out" || { echo "FAIL: expected 6/6 steps"; exit 1; }
echo "ok: a 2-stage job ran in the image (coordinator and 2 workers, mutual TLS, read-only root)"

# 5. The archive operators load into their cluster.
archive="$2/image/stagewise-$version.tar"
# (Whole outputs to files: grep -q would end the pipe early, and tar would
# then fail with SIGPIPE under pipefail.)
tar -tf "$archive" > "$work/archive.list"
grep -qx "manifest.json" "$work/archive.list" || { echo "FAIL: $archive has no manifest.json"; exit 1; }
tar -xOf "$archive" manifest.json > "$work/manifest.json"
grep -q "$name" "$work/manifest.json" || { echo "FAIL: $archive does not name $name"; exit 1; }
echo "ok: $archive ($(du -m "$archive" | cut -f1) MiB) holds $name"
rm -f "$archive"
