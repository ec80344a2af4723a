//go:build tools

// Package tools pins the control plane this module builds: 1.36's
// kube-apiserver, and the kube-controller-manager and kube-scheduler that
// run with it in the guard-down test (the version skew policy wants neither
// newer than the API server).
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver/app"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	_ "k8s.io/kubernetes/cmd/kube-scheduler/app"
)
