#!/usr/bin/env bash
# The Debian packages a real node needs (`make up NODE=real`): the container runtime, the CNI
# plugins, iptables and ipset (kube-router's NetworkPolicy enforcement), and what builds the images here (debootstrap, buildah, a static C toolchain for
# the pause program). Idempotent: apt-get runs only when one of them is missing.
set -euo pipefail

packages=(containerd runc containernetworking-plugins iptables ipset debootstrap buildah gcc libc6-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "a real node needs the Debian packages ${missing[*]}; run as root or install them" >&2
  exit 1
fi
echo "installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
# The package lists are refreshed only when an install finds them stale.
apt-get install -y -q --no-install-recommends "${missing[@]}" >&2 \
  || { apt-get update -q >&2 && apt-get install -y -q --no-install-recommends "${missing[@]}" >&2; }
