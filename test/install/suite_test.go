// Package install tests how the guard is installed and watched: the Helm chart
// (config/helm/deployguard) against the kustomize bases it must not drift
// from, every rendering of it validated by a real kube-apiserver (server-side
// dry-run, with cert-manager's and the Prometheus Operator's CRDs installed),
// and the dashboard and alerts of config/monitoring against the metrics a
// running guard really exports.
//
// One local cluster (harness.StartLocal: control plane, kwok nodes, the guard)
// serves both: the dry-runs need only its API server, the metrics need the
// guard to admit, roll back and clean up for real.
package install

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/deployguard/deployguard/test/harness"
)

// guardConfig shortens fail-fast to its minimum so that a fail-fast decision
// (and its metrics) happens within seconds.
const guardConfig = `apiVersion: deployguard.io/v1alpha1
kind: GuardConfig
rollback:
  failFast: {window: 10s}
`

// prometheusOperatorVersion is the Prometheus Operator module whose CRDs
// (example/prometheus-operator-crd) validate the ServiceMonitor and the
// PrometheusRule.
const prometheusOperatorVersion = "v0.85.0"

var (
	local *harness.Local
	tools string
)

func TestMain(m *testing.M) {
	os.Exit(harness.RunTier(m, harness.TierOptions{
		Name:  "install",
		Tools: []string{"helm"},
		Local: &harness.LocalOptions{
			Nodes: 1, GuardConfig: guardConfig,
			CRDs: []string{filepath.Join(harness.RepoRoot(), "config", "crd", "exceptions")},
		},
		Setup: func(ctx context.Context, tier *harness.Tier) error {
			local, tools = tier.Local, tier.Tools
			ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
			defer cancel()
			return installCRDs(ctx)
		},
	}))
}

// installCRDs installs cert-manager's CRDs (from its module, as test/tls does)
// and the Prometheus Operator's ServiceMonitor and PrometheusRule CRDs (from
// its module), so that dry-runs validate those kinds against their schemas.
func installCRDs(ctx context.Context) error {
	if err := local.Cluster.InstallCertManagerCRDs(ctx); err != nil {
		return err
	}
	dir, err := moduleDir(ctx, "github.com/prometheus-operator/prometheus-operator@"+prometheusOperatorVersion)
	if err != nil {
		return err
	}
	crds := filepath.Join(dir, "example", "prometheus-operator-crd")
	if _, err := local.Cluster.Kubectl(ctx, local.Cluster.Kubeconfig, "apply", "--server-side",
		"-f", filepath.Join(crds, "monitoring.coreos.com_servicemonitors.yaml"),
		"-f", filepath.Join(crds, "monitoring.coreos.com_prometheusrules.yaml")); err != nil {
		return err
	}
	_, err = local.Cluster.Kubectl(ctx, local.Cluster.Kubeconfig, "wait", "--for=condition=Established", "--timeout=60s",
		"crd/servicemonitors.monitoring.coreos.com", "crd/prometheusrules.monitoring.coreos.com")
	return err
}

// moduleDir downloads a module version through the Go module proxy (outside
// any module, so that no go.mod is touched) and returns its folder.
func moduleDir(ctx context.Context, modVersion string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", modVersion)
	cmd.Dir = os.TempDir()
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go mod download %s: %w", modVersion, err)
	}
	var mod struct{ Dir, Error string }
	if err := json.Unmarshal(out, &mod); err != nil {
		return "", fmt.Errorf("go mod download %s: %w", modVersion, err)
	}
	if mod.Dir == "" {
		return "", fmt.Errorf("go mod download %s: no folder (%s)", modVersion, mod.Error)
	}
	return mod.Dir, nil
}
