#!/usr/bin/env bash
# Build the local control-plane binaries once per machine into a version-stamped cache outside the
# repo: kube-apiserver, kube-controller-manager, kube-scheduler (from ./kube), kwok, and helm (the
# chart's lint and render in the suite); with --real-node (or SKYSCAN_REAL_NODE=1) also kubelet,
# kube-proxy and CoreDNS; with --bench (or SKYSCAN_BENCH_TOOLS=1) also hey, `make bench`'s HTTP load
# generator.
# Prints the cache directory. A binary is rebuilt only when missing or reporting another version.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
KUBE_VERSION=${KUBE_VERSION:-v1.33.13}
KWOK_VERSION=${KWOK_VERSION:-v0.7.0}
HELM_VERSION=${HELM_VERSION:-v3.22.0}
bin=${SKYSCAN_K8S_BIN:-${XDG_CACHE_HOME:-$HOME/.cache}/skyscan/k8s/$KUBE_VERSION}
mkdir -p "$bin"

export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-trimpath -mod=mod"

stale() { # stale BINARY EXPECTED_VERSION_SUBSTRING
  [ -x "$bin/$1" ] || return 0
  local version  # read whole: `grep -q` closing the pipe early would SIGPIPE a second line (pipefail)
  version=$("$bin/$1" --version 2>&1) || true  # kube-router prints it on stderr
  [[ $version != *"$2"* ]]
}

# A real node (`make up NODE=real`, SKYSCAN_REAL_NODE=1) needs the kubelet and kube-proxy as well, and
# CoreDNS for cluster DNS; the kwok path never pays for them.
real_node=${SKYSCAN_REAL_NODE:-}
bench=${SKYSCAN_BENCH_TOOLS:-}
for arg in "$@"; do
  case $arg in
    --real-node) real_node=1 ;;
    --bench) bench=1 ;;
    *) echo "usage: $0 [--real-node] [--bench]" >&2; exit 2 ;;
  esac
done
kube=()
node_binaries=()
[ -n "$real_node" ] && node_binaries=(kubelet kube-proxy)
for b in kube-apiserver kube-controller-manager kube-scheduler "${node_binaries[@]}"; do
  stale "$b" "Kubernetes $KUBE_VERSION" && kube+=("k8s.io/kubernetes/cmd/$b")
done
if [ ${#kube[@]} -gt 0 ]; then
  minor=${KUBE_VERSION#v1.}; minor=${minor%%.*}
  ldflags="-s -w"
  for kv in gitVersion=$KUBE_VERSION gitMajor=1 gitMinor=$minor gitTreeState=clean \
            buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ); do
    ldflags="$ldflags -X k8s.io/component-base/version.$kv -X k8s.io/client-go/pkg/version.$kv"
  done
  echo "building ${kube[*]##*/} $KUBE_VERSION into $bin" >&2
  (cd "$here/kube" && go build -tags selinux,notest,grpcnotrace -ldflags "$ldflags" -o "$bin/" "${kube[@]}")
fi

if stale kwok "${KWOK_VERSION#v}"; then
  echo "building kwok $KWOK_VERSION into $bin" >&2
  GOFLAGS=-trimpath GOBIN="$bin" go install -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
fi

# helm names its version with a subcommand, not --version.
if ! { [ -x "$bin/helm" ] && "$bin/helm" version --short 2>/dev/null | grep -qxF -- "$HELM_VERSION"; }; then
  echo "building helm $HELM_VERSION into $bin" >&2
  # go install leaves what a release stamps at its source defaults (version v3.x, Kubernetes 1.20):
  # stamp the tag, and the control plane's Kubernetes version as what `helm template` renders for.
  minor=${KUBE_VERSION#v1.}; minor=${minor%%.*}
  ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  for pkg in pkg/chartutil pkg/lint/rules; do
    ldflags="$ldflags -X helm.sh/helm/v3/$pkg.k8sVersionMajor=1 -X helm.sh/helm/v3/$pkg.k8sVersionMinor=$minor"
  done
  GOFLAGS=-trimpath GOBIN="$bin" go install -ldflags "$ldflags" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
fi

COREDNS_VERSION=${COREDNS_VERSION:-v1.12.4}
if [ -n "$real_node" ] && stale coredns "CoreDNS-${COREDNS_VERSION#v}"; then
  echo "building coredns $COREDNS_VERSION into $bin" >&2
  GOFLAGS=-trimpath GOBIN="$bin" go install -ldflags "-s -w" "github.com/coredns/coredns@$COREDNS_VERSION"
fi

# The real node's NetworkPolicy enforcer: kube-router's firewall alone (iptables and ipset).
KUBE_ROUTER_VERSION=${KUBE_ROUTER_VERSION:-v2.1.0}
if [ -n "$real_node" ] && stale kube-router "$KUBE_ROUTER_VERSION"; then
  echo "building kube-router $KUBE_ROUTER_VERSION into $bin" >&2
  GOFLAGS=-trimpath CGO_ENABLED=0 GOBIN="$bin" go install -ldflags \
    "-s -w -X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=$KUBE_ROUTER_VERSION" \
    "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router@$KUBE_ROUTER_VERSION"
fi

# hey has no --version: the module version Go stamped into the binary says which it is.
HEY_VERSION=${HEY_VERSION:-v0.1.5}
if [ -n "$bench" ]; then
  built=$(go version -m "$bin/hey" 2>/dev/null) || true
  if [[ $built != *"github.com/rakyll/hey"*"$HEY_VERSION"* ]]; then
    echo "building hey $HEY_VERSION into $bin" >&2
    GOFLAGS=-trimpath GOBIN="$bin" go install -ldflags "-s -w" "github.com/rakyll/hey@$HEY_VERSION"
  fi
fi

# kwok >= 0.8 has no built-in stages; always hand it the fast ones shipped in its module.
stages=$(go env GOMODCACHE)/sigs.k8s.io/kwok@$KWOK_VERSION/kustomize/stage
if [ ! -s "$bin/kwok-stages.yaml" ]; then
  [ -d "$stages" ] || go mod download "sigs.k8s.io/kwok@$KWOK_VERSION"
  for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
           pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml \
           pod/chaos/pod-container-running-failed.yaml; do
    echo '---'; cat "$stages/$f"
  done > "$bin/kwok-stages.yaml.tmp"
  mv "$bin/kwok-stages.yaml.tmp" "$bin/kwok-stages.yaml"
fi
echo "$bin"
