#!/usr/bin/env bash
# Prints the -ldflags that stamp the Kubernetes binaries built from the module
# in DIR (test/tools/kube, test/tools/kube-min) with the version of
# k8s.io/kubernetes it pins: the version fields upstream's release build sets
# (hack/lib/version.sh), but the commit, which a module does not carry.
# Unstamped, kube-apiserver reports
# v0.0.0-master+$Format:%H$: helm then refuses every chart with a kubeVersion
# constraint, and kwokctl configures the components for version 0.0.0.
#
# usage: test/tools/kube-ldflags.sh DIR
set -euo pipefail

dir="${1:?usage: kube-ldflags.sh DIR}"
info="$(cd "$dir" && GOWORK=off go list -m -f '{{.Version}} {{.Time.UTC.Format "2006-01-02T15:04:05Z"}}' k8s.io/kubernetes)"
read -r version time <<<"$info"
[[ "$version" =~ ^v([0-9]+)\.([0-9]+)\. ]] || { echo "kube-ldflags.sh: cannot read k8s.io/kubernetes's version in $dir: $version" >&2; exit 1; }
major="${BASH_REMATCH[1]}" minor="${BASH_REMATCH[2]}"

flags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	flags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
	flags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$time"
done
echo "$flags"
