#!/usr/bin/env bash
# Builds a real node's parts from the Go module proxy into a folder keyed by
# version (the Makefile's NODE_TOOLS_DIR), so that a second run is a no-op:
# containerd v2 and its runc shim, runc (cgo, with seccomp), kubelet and
# kube-proxy (from the same k8s.io/kubernetes module as the control plane,
# test/tools/kube), distribution's registry, and Prometheus (the metric
# checks' proof: it scrapes the test app's pods). The CNI plugins, libseccomp
# and iptables are Debian's packages, installed with apt when missing.
#
# usage: test/tools/build-node.sh OUT_DIR
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
out="${1:?usage: build-node.sh OUT_DIR}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"

containerd_version="v2.4.2"
runc_version="v1.3.6"
registry_version="v3.1.2"
# Prometheus's Go module version, test/tools/promql's: its dependencies are
# in the module cache already.
prometheus_version="v0.316.0"
flags=(-trimpath -ldflags "-s -w")

# What the node needs from Debian: runc's build links libseccomp (through
# pkg-config), the pod network is the CNI plugins' bridge (in /usr/lib/cni),
# kube-proxy writes iptables rules, and the tier enters its own network
# namespace with unshare and ip.
missing=()
[[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/loopback && -x /usr/lib/cni/portmap ]] || missing+=(containernetworking-plugins)
pkg-config --exists libseccomp 2>/dev/null || missing+=(libseccomp-dev pkg-config)
command -v iptables >/dev/null || missing+=(iptables)
command -v ip >/dev/null || missing+=(iproute2)
command -v unshare >/dev/null || missing+=(util-linux)
if ((${#missing[@]})); then
	echo ">> apt-get install ${missing[*]}"
	s=
	[[ "$(id -u)" == 0 ]] || s=sudo
	$s apt-get update -qq && $s apt-get install -y -qq "${missing[@]}"
fi

stamp="containerd=$containerd_version runc=$runc_version registry=$registry_version prometheus=$prometheus_version kube=$(cd "$here/kube" && GOWORK=off go list -m -f '{{.Version}}' k8s.io/kubernetes)"
if [[ -f "$out/.complete" && "$(cat "$out/.complete")" == "$stamp" ]]; then
	echo ">> node parts ready in $out"
	exit 0
fi

echo ">> building containerd $containerd_version (about a minute cold)"
# Without the btrfs, devmapper and zfs snapshotters: overlayfs is the node's.
GOBIN="$out" CGO_ENABLED=0 go install "${flags[@]}" -tags "no_btrfs no_devmapper no_zfs urfave_cli_no_docs" \
	"github.com/containerd/containerd/v2/cmd/containerd@$containerd_version" \
	"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$containerd_version" \
	"github.com/containerd/containerd/v2/cmd/ctr@$containerd_version"

echo ">> building runc $runc_version"
GOBIN="$out" CGO_ENABLED=1 go install "${flags[@]}" -tags "seccomp urfave_cli_no_docs" \
	"github.com/opencontainers/runc@$runc_version"

echo ">> building kubelet and kube-proxy"
kube_ldflags="$("$here/kube-ldflags.sh" "$here/kube")"
(cd "$here/kube" && GOWORK=off go build -trimpath -ldflags "$kube_ldflags" -o "$out/" \
	k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy)

echo ">> building distribution's registry $registry_version"
GOBIN="$out" CGO_ENABLED=0 go install "${flags[@]}" "github.com/distribution/distribution/v3/cmd/registry@$registry_version"

echo ">> building Prometheus $prometheus_version (about 3 minutes cold)"
# Only Kubernetes service discovery (the other discoveries' cloud SDKs are
# most of its build); no -tags builtinassets: the web UI is not needed.
GOBIN="$out" CGO_ENABLED=0 go install "${flags[@]}" -tags "remove_all_sd enable_kubernetes_sd" \
	"github.com/prometheus/prometheus/cmd/prometheus@$prometheus_version"

echo "$stamp" >"$out/.complete"
echo ">> node parts ready in $out"
