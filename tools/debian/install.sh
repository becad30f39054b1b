#!/usr/bin/env bash
# Install the Debian packages named as arguments that are missing (idempotent: apt-get runs only when
# one is). As root only; otherwise it says which are missing and fails.
set -euo pipefail

missing=()
for p in "$@"; do
  dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "missing Debian packages: ${missing[*]}; run as root or install them" >&2
  exit 1
fi
echo "installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
# The package lists are refreshed only when an install finds them stale.
apt-get install -y -q --no-install-recommends "${missing[@]}" >&2 \
  || { apt-get update -q >&2 && apt-get install -y -q --no-install-recommends "${missing[@]}" >&2; }
