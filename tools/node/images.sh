#!/usr/bin/env bash
# The images a real node runs (issue 19), built here without Docker or a registry and cached outside
# the repo, each rebuilt only when its inputs change:
#   base     Debian bookworm with Python 3.11 and its venv module (debootstrap), the Dockerfile's BASE
#   skyscan  the product, from the project's own Dockerfile (`buildah bud`, BASE = the base above)
#   pause    every Pod's sandbox process (tools/node/pause.c, static), containerd's sandbox_image
# Prints the directory holding <name>.tar (docker-archive, ready for `ctr -n k8s.io images import`).
# Needs root and the Debian packages debootstrap and buildah (installed when missing).
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
cache=${SKYSCAN_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/skyscan/images}
suite=bookworm
mkdir -p "$cache"

need() { # need COMMAND PACKAGE
  command -v "$1" >/dev/null || { echo "installing $2" >&2; DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$2" >&2; }
}
need debootstrap debootstrap
need buildah buildah

# The host may reach PyPI through a proxy with a CA of its own: the build stage gets the host's bundle.
bundle=${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}

# --- base: a root filesystem once per machine (about 2.5 min), then an image of it in buildah's store
rootfs="$cache/rootfs-$suite"
if [ ! -x "$rootfs/usr/bin/python3" ]; then
  echo "debootstrap $suite into $rootfs" >&2
  rm -rf "$rootfs.partial"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates "$suite" "$rootfs.partial" \
    http://deb.debian.org/debian >&2
  rm -rf "$rootfs.partial"/var/cache/apt/archives/*.deb "$rootfs.partial"/var/lib/apt/lists/*
  mv "$rootfs.partial" "$rootfs"
fi
base="localhost/skyscan-base:$suite"
if ! buildah inspect --type image "$base" >/dev/null 2>&1; then
  c=$(buildah from scratch)
  buildah copy --quiet "$c" "$rootfs" / >/dev/null
  buildah config --env LANG=C.UTF-8 "$c"
  buildah commit --quiet --rm "$c" "$base" >/dev/null
fi

# --- skyscan: rebuilt when the Dockerfile or what it copies changes
inputs=$(cd "$repo" && git ls-files -z Dockerfile pyproject.toml README.md skyscan operator api_shim skyscan_client \
  | xargs -0 sha256sum | sha256sum | cut -c1-16)  # as the files are now, edits included
tar="$cache/skyscan-$inputs.tar"
if [ ! -s "$tar" ]; then
  echo "building localhost/skyscan:$inputs from $repo/Dockerfile" >&2
  buildah bud --quiet --isolation chroot --layers \
    --build-arg "BASE=$base" --build-arg "PIP_CERT=$bundle" --volume "$bundle:$bundle:ro" \
    -t "localhost/skyscan:$inputs" -t localhost/skyscan:dev "$repo" >&2
  buildah push --quiet "localhost/skyscan:$inputs" "docker-archive:$tar.partial:localhost/skyscan:dev" >/dev/null
  mv "$tar.partial" "$tar"
  find "$cache" -maxdepth 1 -name 'skyscan-*.tar' ! -name "$(basename "$tar")" -delete  # older builds
fi
ln -sf "$(basename "$tar")" "$cache/skyscan.tar"

# --- pause: one static binary in an image of its own
pause_inputs=$(sha256sum "$repo/tools/node/pause.c" | cut -c1-16)
pause_tar="$cache/pause-$pause_inputs.tar"
if [ ! -s "$pause_tar" ]; then
  work=$(mktemp -d)
  gcc -static -Os -o "$work/pause" "$repo/tools/node/pause.c"
  strip "$work/pause"
  c=$(buildah from scratch)
  buildah copy --quiet "$c" "$work/pause" /pause >/dev/null
  buildah config --entrypoint '["/pause"]' --user 65535:65535 "$c"
  buildah commit --quiet --rm "$c" localhost/pause:3.10 >/dev/null
  buildah push --quiet localhost/pause:3.10 "docker-archive:$pause_tar.partial:localhost/pause:3.10" >/dev/null
  mv "$pause_tar.partial" "$pause_tar"
  find "$cache" -maxdepth 1 -name 'pause-*.tar' ! -name "$(basename "$pause_tar")" -delete
  rm -rf "$work"
fi
ln -sf "$(basename "$pause_tar")" "$cache/pause.tar"
echo "$cache"
