#!/usr/bin/env bash
# The images a real node runs (issue 19), built here without Docker or a registry and cached outside
# the repo, each rebuilt only when its inputs change:
#   base     Debian bookworm with Python 3.11 and its venv module (debootstrap), the Dockerfile's BASE
#   skyscan  the product, from the project's own Dockerfile (`buildah bud`, BASE = the base above)
#   scanner  the product plus the scanner simulator, started as a real scanner server is
#            (local/scanner_image/Dockerfile, FROM the product image)
#   pause    every Pod's sandbox process (tools/node/pause.c, static), containerd's sandbox_image
# Prints the directory holding <name>.tar, a docker-archive of the image localhost/<name>:dev, ready for
# `ctr -n k8s.io images import`. Needs root and the Debian packages of
# tools/node/packages.sh (installed when missing).
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
cache=${SKYSCAN_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/skyscan/images}
suite=bookworm
include=python3,python3-venv,ca-certificates
mkdir -p "$cache"
bash "$repo/tools/node/packages.sh"

# The host may reach PyPI through a proxy with a CA of its own: the build stages get the host's bundle.
bundle=${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}
hash_files() { # hash_files DIR PATH... : the content of the tracked (and changed) files under PATHs
  (cd "$1" && shift && { git ls-files -z --cached --others --exclude-standard -- "$@" | xargs -0 sha256sum 2>/dev/null || true; } \
    | sha256sum | cut -c1-16)
}
timed() { # timed NAME COMMAND...: runs it, says how long it took
  local began=$SECONDS; "${@:2}"; echo "built $1 in $((SECONDS - began)) s" >&2
}
# archive NAME IMAGE TAR: the image as a docker-archive named localhost/NAME:dev, older builds removed
archive() {
  buildah push --quiet "$2" "docker-archive:$3.partial:localhost/$1:dev" >/dev/null
  mv "$3.partial" "$3"
  find "$cache" -maxdepth 1 -name "$1-????????????????.tar" ! -name "$(basename "$3")" -delete
  ln -sf "$(basename "$3")" "$cache/$1.tar"
  echo "$1: $(du -m "$3" | cut -f1) MB ($3)" >&2
}

# --- base: a root filesystem once per machine (about 2.5 min), then an image of it in buildah's store
base_key=$(echo "$suite $include" | sha256sum | cut -c1-12)
rootfs="$cache/rootfs-$suite-$base_key"
make_rootfs() {
  rm -rf "$rootfs.partial"
  debootstrap --variant=minbase --include="$include" "$suite" "$rootfs.partial" http://deb.debian.org/debian >&2
  rm -rf "$rootfs.partial"/var/cache/apt/archives/*.deb "$rootfs.partial"/var/lib/apt/lists/*
  mv "$rootfs.partial" "$rootfs"
}
if [ ! -x "$rootfs/usr/bin/python3" ]; then
  timed "the $suite root filesystem" make_rootfs
  find "$cache" -maxdepth 1 -name "rootfs-*" ! -name "$(basename "$rootfs")" -exec rm -rf {} +  # older ones
fi
base="localhost/skyscan-base:$suite-$base_key"
make_base() {
  local c; c=$(buildah from scratch)
  buildah copy --quiet "$c" "$rootfs" / >/dev/null
  buildah config --env LANG=C.UTF-8 "$c"
  buildah commit --quiet --rm "$c" "$base" >/dev/null
}
buildah inspect --type image "$base" >/dev/null 2>&1 || timed "$base" make_base

# --- skyscan: rebuilt when the Dockerfile or what it copies changes (as the files are now, edits included)
inputs=$(hash_files "$repo" Dockerfile .dockerignore requirements/image.txt pyproject.toml README.md skyscan operator api_shim skyscan_client)
product="localhost/skyscan:$inputs"
tar="$cache/skyscan-$inputs.tar"
make_product() {
  buildah bud --quiet --isolation chroot --layers \
    --build-arg "BASE=$base" --build-arg "PIP_CERT=$bundle" --volume "$bundle:$bundle:ro" \
    -t "$product" "$repo" >&2
  archive skyscan "$product" "$tar"
}
[ -s "$tar" ] || timed "$product" make_product

# --- scanner: rebuilt when the product or the simulator changes
scanner_inputs=$( { echo "$inputs"; hash_files "$repo/local" .dockerignore pyproject.toml skyscan_local scanner_image; } \
  | sha256sum | cut -c1-16)
scanner_tar="$cache/skyscan-scanner-$scanner_inputs.tar"
make_scanner() {
  buildah bud --quiet --isolation chroot --layers \
    --build-arg "SKYSCAN_IMAGE=$product" --build-arg "PIP_CERT=$bundle" --volume "$bundle:$bundle:ro" \
    -f "$repo/local/scanner_image/Dockerfile" -t "localhost/skyscan-scanner:$scanner_inputs" "$repo/local" >&2
  archive skyscan-scanner "localhost/skyscan-scanner:$scanner_inputs" "$scanner_tar"
}
if [ ! -s "$scanner_tar" ]; then
  buildah inspect --type image "$product" >/dev/null 2>&1 || timed "$product" make_product
  timed "the scanner image" make_scanner
fi

# --- pause: one static binary in an image of its own
pause_inputs=$( { cat "$repo/tools/node/pause.c"; echo localhost/pause:dev; } | sha256sum | cut -c1-16)
pause_tar="$cache/pause-$pause_inputs.tar"
make_pause() {
  local work c; work=$(mktemp -d)
  gcc -static -Os -o "$work/pause" "$repo/tools/node/pause.c"
  strip "$work/pause"
  c=$(buildah from scratch)
  buildah copy --quiet "$c" "$work/pause" /pause >/dev/null
  buildah config --entrypoint '["/pause"]' --user 65535:65535 "$c"
  buildah commit --quiet --rm "$c" "localhost/pause:$pause_inputs" >/dev/null
  rm -rf "$work"
  archive pause "localhost/pause:$pause_inputs" "$pause_tar"
}
[ -s "$pause_tar" ] || timed "the pause image" make_pause

# Older builds of ours leave buildah's store, and so do the build stages left dangling (a source edit
# invalidates their layers anyway).
keep=(); for name in skyscan skyscan-scanner pause; do
  t=$(readlink "$cache/$name.tar"); t=${t#"$name-"}; keep+=(-e "localhost/$name:${t%.tar}")
done
buildah images --format '{{.Name}}:{{.Tag}}' \
  | grep -E '^localhost/(skyscan|skyscan-scanner|pause|skyscan-base):' | grep -vxF "${keep[@]}" -e "$base" \
  | xargs -r buildah rmi >/dev/null 2>&1 || true
buildah rmi --prune >/dev/null 2>&1 || true
echo "$cache"
