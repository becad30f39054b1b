#!/usr/bin/env bash
# The Debian packages a real node needs (`make up NODE=real`): the container runtime, the CNI
# plugins, iptables and ipset (kube-router's NetworkPolicy enforcement), and what builds the images
# here (debootstrap, buildah, a static C toolchain for the pause program).
set -euo pipefail
exec bash "$(dirname "$0")/../debian/install.sh" containerd runc containernetworking-plugins iptables ipset \
  debootstrap buildah gcc libc6-dev
