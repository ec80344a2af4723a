package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
)

// ArgoCDVersion is the Argo CD whose health assessment test/tools/argocd
// builds into argocd-health (its go.mod must require this version;
// BuildArgoCDHealth checks). v3.2.12 is the newest release that builds with
// Go 1.26 as Argo CD built it: v3.6 needs Go 1.27, and v3.3 to v3.5 take
// gitops-engine from a folder of their own repository that no module proxy
// serves. The Deployment health check and the Lua health VM are the same in
// v3.6 (see test/tools/argocd/go.mod).
const ArgoCDVersion = "v3.2.12"

const argoCDModule = "github.com/argoproj/argo-cd/v3"

// ArgoCDToolsDir is the module that builds argocd-health, kept apart from the
// main module so that Argo CD's dependency versions never constrain
// deployguard's.
func ArgoCDToolsDir() string { return filepath.Join(RepoRoot(), "test", "tools", "argocd") }

// ArgoCDHealthScript is the Argo CD health customization for Deployments that
// deployguard ships (argocd-cm key resource.customizations.health.apps_Deployment).
func ArgoCDHealthScript() string {
	return filepath.Join(RepoRoot(), "config", "argocd", "deployment-health.lua")
}

// BuildArgoCDHealth builds test/tools/argocd (argocd-health: Argo CD's own
// health assessment, gitops-engine's checks and Argo CD's Lua VM) into
// bin/tools/argocd-VERSION and returns the binary's path. Go's build cache
// makes a second build take seconds; the first takes about two minutes on two
// cores.
func BuildArgoCDHealth(ctx context.Context, out io.Writer) (string, error) {
	list := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Version}}", argoCDModule)
	list.Dir = ArgoCDToolsDir()
	list.Env = append(list.Environ(), "GOWORK=off")
	got, err := list.Output()
	if err != nil {
		return "", fmt.Errorf("reading the Argo CD version of %s: %w", list.Dir, exitErr(err))
	}
	if v := string(bytes.TrimSpace(got)); v != ArgoCDVersion {
		return "", fmt.Errorf("test/tools/argocd/go.mod requires %s %s while the harness expects %s", argoCDModule, v, ArgoCDVersion)
	}
	bin := filepath.Join(RepoRoot(), "bin", "tools", "argocd-"+ArgoCDVersion, "argocd-health")
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, ".")
	cmd.Dir = ArgoCDToolsDir()
	cmd.Env = append(cmd.Environ(), "GOWORK=off")
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = io.MultiWriter(logOr(out), &buf), io.MultiWriter(logOr(out), &buf)
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("building argocd-health: %w\n%s", err, tail(buf.String(), 2000))
	}
	return bin, nil
}

// HealthResult is one Argo CD health verdict. Status is empty when Argo CD has
// no health for the object (no check for its kind); Error is the error Argo CD
// logs when a check fails (Status is then Unknown).
type HealthResult struct {
	Status  string `json:"status"`
	Message string `json:"message"`
	Error   string `json:"error,omitempty"`
}

// ArgoCDHealth is Argo CD's health of a live object (its JSON, e.g. from
// `kubectl get -o json`), evaluated by bin (from BuildArgoCDHealth): builtin
// is a default Argo CD install's verdict, customized the verdict with
// deployguard's script (ArgoCDHealthScript) as the apps/Deployment health
// customization.
func ArgoCDHealth(ctx context.Context, bin string, obj []byte) (builtin, customized HealthResult, err error) {
	cmd := exec.CommandContext(ctx, bin, "-lua", ArgoCDHealthScript(), "-f", "-")
	cmd.Stdin = bytes.NewReader(obj)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return builtin, customized, fmt.Errorf("argocd-health: %w\n%s", err, tail(stderr.String(), 2000))
	}
	var res struct {
		Builtin, Customized *HealthResult
	}
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		return builtin, customized, fmt.Errorf("reading argocd-health's output: %w\n%s", err, tail(stdout.String(), 2000))
	}
	if res.Builtin != nil {
		builtin = *res.Builtin
	}
	if res.Customized != nil {
		customized = *res.Customized
	}
	return builtin, customized, nil
}
