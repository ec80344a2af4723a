// Package harness starts the real parts the integration and end-to-end tiers
// (and `make run`) run against: a kube-apiserver with etcd (envtest), a full
// local cluster (kwokctl with kube-controller-manager, kube-scheduler and fake
// kwok nodes), and the guard itself as a process. Everything is built from the
// Go module proxy by test/tools/build.sh into a folder keyed by version.
package harness

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
)

// K8sVersion is the control plane the tools are built for.
const K8sVersion = "v1.37.2"

// RepoRoot is the repository's top folder, found from this file's location so
// that tests work from any package directory.
func RepoRoot() string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		wd, _ := os.Getwd()
		return wd
	}
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// ToolsDir is where the control plane binaries are: $DEPLOYGUARD_TOOLS, or the
// folder `make tools` builds. It is an error, with the command to run, when one
// of need (all of them when none is named) is not there: a missing control
// plane must never look like a pass.
func ToolsDir(need ...string) (string, error) {
	dir := os.Getenv("DEPLOYGUARD_TOOLS")
	if dir == "" {
		dir = filepath.Join(RepoRoot(), "bin", "tools", "k8s-"+K8sVersion)
	}
	var missing []string
	if len(need) == 0 {
		need = []string{"kube-apiserver", "etcd", "kube-controller-manager", "kube-scheduler", "kubectl", "kwok", "kwokctl"}
	}
	for _, b := range need {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			missing = append(missing, b)
		}
	}
	if len(missing) > 0 {
		return "", fmt.Errorf("control plane binaries %v missing in %s: run `make tools` (or `make test`, which builds them)", missing, dir)
	}
	return dir, nil
}

// GuardBinary is the deployguard binary the end-to-end tier runs:
// $DEPLOYGUARD_BIN or bin/deployguard.
func GuardBinary() (string, error) {
	p := os.Getenv("DEPLOYGUARD_BIN")
	if p == "" {
		p = filepath.Join(RepoRoot(), "bin", "deployguard")
	}
	if _, err := os.Stat(p); err != nil {
		return "", errors.New("deployguard binary missing at " + p + ": run `make build` (or `make test-e2e`, which builds it)")
	}
	return p, nil
}
