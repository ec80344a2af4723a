#!/usr/bin/env bash
# Builds the local control plane from the Go module proxy into a folder keyed by
# version, so that a second run (or CI with a warm cache) is a no-op. Prebuilt
# Kubernetes binaries cannot be downloaded on the machines this project runs on.
#
# usage: test/tools/build.sh OUT_DIR
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
out="${1:?usage: build.sh OUT_DIR}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"

kwok_version="v0.8.0"
# -trimpath keeps the binaries independent of where the module cache lives.
flags=(-trimpath -ldflags "-s -w")

need() { [[ ! -x "$out/$1" ]]; }

# The folder is named for the version it holds (the Makefile's K8S_VERSION);
# the version built is the one test/tools/kube/go.mod pins.
kube_version="$(cd "$here/kube" && GOWORK=off go list -m -f '{{.Version}}' k8s.io/kubernetes)"
case "$(basename "$out")" in
k8s-v*) [[ "$(basename "$out")" == "k8s-$kube_version" ]] || {
	echo "build.sh: $out is named for another version than the $kube_version test/tools/kube/go.mod pins: change both together" >&2
	exit 1
} ;;
esac

# Binaries built before they were stamped with their version are built again.
stamped() { [[ -x "$out/kube-apiserver" && "$("$out/kube-apiserver" --version)" == "Kubernetes $kube_version" ]]; }
if need kube-apiserver || need kube-controller-manager || need kube-scheduler || need kubectl || ! stamped; then
	echo ">> building kube-apiserver, kube-controller-manager, kube-scheduler, kubectl $kube_version (k8s.io/kubernetes, several minutes cold)"
	# On a line of its own, so that a failure stops the build (set -e).
	kube_ldflags="$("$here/kube-ldflags.sh" "$here/kube")"
	(cd "$here/kube" && GOWORK=off go build -trimpath -ldflags "$kube_ldflags" -o "$out/" \
		k8s.io/kubernetes/cmd/kube-apiserver \
		k8s.io/kubernetes/cmd/kube-controller-manager \
		k8s.io/kubernetes/cmd/kube-scheduler \
		k8s.io/kubernetes/cmd/kubectl)
	stamped || {
		echo "build.sh: $out/kube-apiserver --version does not say \"Kubernetes $kube_version\": the version stamp (test/tools/kube-ldflags.sh) no longer applies" >&2
		exit 1
	}
fi

if need etcd; then
	echo ">> building etcd"
	(cd "$here/etcd" && go build "${flags[@]}" -o "$out/etcd" .)
fi

if need kwok || need kwokctl; then
	echo ">> building kwok and kwokctl ${kwok_version}"
	GOBIN="$out" go install "${flags[@]}" "sigs.k8s.io/kwok/cmd/kwok@${kwok_version}" "sigs.k8s.io/kwok/cmd/kwokctl@${kwok_version}"
fi

# helm renders the chart corpus (test/integration/testdata/charts); about 3
# minutes cold. Its version comes from test/tools/helm/go.mod and is stamped in,
# as helm's own release build does, so that `helm version` names it.
if need helm; then
	helm_version="$(cd "$here/helm" && go list -m -f '{{.Version}}' helm.sh/helm/v3)"
	echo ">> building helm ${helm_version}"
	(cd "$here/helm" && go build -trimpath \
		-ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=${helm_version}" \
		-o "$out/helm" helm.sh/helm/v3/cmd/helm)
fi

# helm v4 deploys in the clients tier (test/clients): its --wait judges
# resources with kstatus. Stamped with its version, as above.
if need helm4; then
	helm4_version="$(cd "$here/helm4" && go list -m -f '{{.Version}}' helm.sh/helm/v4)"
	echo ">> building helm ${helm4_version}"
	(cd "$here/helm4" && go build -trimpath \
		-ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=${helm4_version}" \
		-o "$out/helm4" helm.sh/helm/v4/cmd/helm)
fi

# kwokctl applies no stages of its own once the Stage CRD is enabled (the
# harness enables it to add stages of its own, test/harness/stages), so the
# harness applies kwok's defaults itself: these exact files, which kwokctl
# embeds, from the same module version as the binaries.
if [[ ! -f "$out/kwok-stages/.complete" ]]; then
	echo ">> kwok ${kwok_version}'s default stages"
	# Outside any module, so that no go.mod or go.sum is touched.
	kwok_dir="$(cd / && GOWORK=off go mod download -json "sigs.k8s.io/kwok@${kwok_version}" |
		sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
	[[ -d "$kwok_dir" ]] || { echo "cannot find the sigs.k8s.io/kwok@${kwok_version} module" >&2; exit 1; }
	rm -rf "$out/kwok-stages" && mkdir -p "$out/kwok-stages"
	for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
		pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
		install -m 0644 "$kwok_dir/kustomize/stage/$f" "$out/kwok-stages/"
	done
	touch "$out/kwok-stages/.complete"
fi

echo ">> control plane ready in $out"
