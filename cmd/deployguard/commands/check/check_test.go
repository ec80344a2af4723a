package check

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/deployguard/deployguard/cmd/deployguard/cli"
)

const goodManifest = `apiVersion: apps/v1
kind: Deployment
metadata:
  name: good
spec:
  replicas: 2
  selector:
    matchLabels: {app.kubernetes.io/name: good}
  template:
    metadata:
      labels: {app.kubernetes.io/name: good}
    spec:
      containers:
        - name: app
          image: app:1.0
          readinessProbe: {tcpSocket: {port: 80}}
          resources: {requests: {cpu: 10m, memory: 16Mi}}
`

const latestManifest = `apiVersion: apps/v1
kind: Deployment
metadata:
  name: latest
  namespace: shop
spec:
  selector:
    matchLabels: {app: latest}
  template:
    metadata:
      labels: {app: latest}
    spec:
      containers:
        - name: web
          image: nginx:latest
          readinessProbe: {tcpSocket: {port: 80}}
          resources: {requests: {cpu: 10m, memory: 16Mi}}
`

const noProbeManifest = `{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"noprobe"},
 "spec":{"selector":{"matchLabels":{"app":"noprobe"}},"template":{"metadata":{"labels":{"app":"noprobe"}},
 "spec":{"containers":[{"name":"c","image":"c:1","resources":{"requests":{"cpu":"1m","memory":"1Mi"}}}]}}}}`

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
	require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
	return p
}

func TestCheck(t *testing.T) {
	dir := t.TempDir()
	good := writeFile(t, dir, "good.yaml", goodManifest)
	multi := writeFile(t, dir, "multi.yaml", goodManifest+"---\n# a comment only\n---\n"+latestManifest+"---\napiVersion: v1\nkind: Service\nmetadata: {name: svc}\n")
	noProbe := writeFile(t, dir, "noprobe.json", noProbeManifest)
	tree := filepath.Join(dir, "tree")
	writeFile(t, tree, "a/good.yaml", goodManifest)
	writeFile(t, tree, "b/latest.yml", latestManifest)
	writeFile(t, tree, "README.md", "not a manifest")
	broken := writeFile(t, dir, "broken.yaml", "apiVersion: apps/v1\nkind: Deployment\nmetadata: [\n")
	// Enforcing a built-in policy is one line of the config file.
	enforce := writeFile(t, dir, "enforce.yaml", "apiVersion: deployguard.io/v1alpha1\nkind: GuardConfig\npolicy:\n  modes: {images: enforce}\n")
	teamPolicyDir := filepath.Join(dir, "team")
	writeFile(t, teamPolicyDir, "team.rego", "package deployguard.team\n\ndeny contains \"add a team label\" if not input.object.metadata.labels.team\n")
	badPolicyDir := filepath.Join(dir, "policies")
	writeFile(t, badPolicyDir, "bad.rego", "package deployguard.bad\n\ndeny contains msg if {\n")

	tests := []struct {
		name     string
		args     []string
		stdin    string
		wantCode int
		wantOut  []string
		wantErr  string
	}{
		{name: "admitted", args: []string{"-f", good}, wantCode: 0, wantOut: []string{"good.yaml#1 Deployment default/good: ADMITTED", "1 admitted, 0 denied, 0 skipped"}},
		{name: "the default configuration warns about a :latest image, refuses nothing", args: []string{"-f", multi}, wantCode: 0,
			wantOut: []string{"multi.yaml#2 Deployment shop/latest: ADMITTED", `warning [policy images] spec.template.spec.containers[0].image: image "nginx:latest"`, "2 admitted, 0 denied, 1 skipped"}},
		{name: "a rollout-safety check refuses in the default configuration", args: []string{"-f", "-"},
			stdin: strings.Replace(goodManifest, "  replicas: 2\n", "  replicas: 2\n  strategy: {rollingUpdate: {maxUnavailable: 100%}}\n", 1), wantCode: 1,
			wantOut: []string{"DENIED", "spec.strategy.rollingUpdate.maxUnavailable: Invalid value: 100% resolves to 2 of 2 replicas"}},
		{
			name: "multi-document file: file, document, object, field path and message", args: []string{"-f", multi, "--config", enforce}, wantCode: 1,
			wantOut: []string{
				"multi.yaml#1 Deployment default/good: ADMITTED",
				"multi.yaml#2 Deployment shop/latest: DENIED",
				`error   spec.template.spec.containers[0].image: Forbidden: [policy images] image "nginx:latest"`,
				"multi.yaml#3 Service svc: SKIPPED",
				"1 admitted, 1 denied, 1 skipped",
			},
		},
		{name: "directory, recursively, manifests only", args: []string{"-f", tree, "--config", enforce}, wantCode: 1, wantOut: []string{"good.yaml#1", "latest.yml#1", "1 admitted, 1 denied, 0 skipped"}},
		{name: "stdin", args: []string{"-f", "-", "--config", enforce}, stdin: latestManifest, wantCode: 1, wantOut: []string{"<stdin>#1 Deployment shop/latest: DENIED"}},
		{name: "empty selector is caught before a cluster", args: []string{"-f", "-"}, stdin: strings.Replace(goodManifest, "  selector:\n    matchLabels: {app.kubernetes.io/name: good}\n", "", 1), wantCode: 0,
			wantOut: []string{"ADMITTED", "the guard would default: spec.selector", "warning spec.selector: the selector was empty; deployguard set it to app.kubernetes.io/name=good"}},
		{name: "warnings do not fail", args: []string{"-f", noProbe}, wantCode: 0, wantOut: []string{`warning [policy probes] spec.template.spec.containers[0].readinessProbe: container "c" has no readinessProbe`}},
		{name: "warnings fail with --strict", args: []string{"-f", noProbe, "--strict"}, wantCode: 1},
		{name: "json output", args: []string{"-f", multi, "-o", "json", "--config", enforce}, wantCode: 1, wantOut: []string{`"verdict": "denied"`, `"field": "spec.template.spec.containers[0].image"`, `"file": "` + multi + `"`}},
		{name: "unreadable input", args: []string{"-f", filepath.Join(dir, "missing.yaml")}, wantCode: 2, wantErr: "no such file"},
		{name: "malformed YAML", args: []string{"-f", broken}, wantCode: 2, wantErr: "document 1"},
		{name: "no -f", args: nil, wantCode: 2, wantErr: "usage"},
		{name: "bad output format", args: []string{"-f", good, "-o", "xml"}, wantCode: 2, wantErr: "usage"},
		{name: "a broken policy directory is a usage error naming file and line", args: []string{"-f", good, "--policy-dir", badPolicyDir}, wantCode: 2, wantErr: "bad.rego:"},
		{name: "disabled built-in by config", args: []string{"-f", "-", "--config", writeFile(t, dir, "guard.yaml", "apiVersion: deployguard.io/v1alpha1\nkind: GuardConfig\npolicy:\n  disableBuiltins: [images]\n  modes: {images: enforce}\n")},
			stdin: latestManifest, wantCode: 0},
		{name: "warn mode by config turns a denial into a warning", args: []string{"-f", "-", "--policy-dir", teamPolicyDir, "--config", writeFile(t, dir, "warn.yaml", "apiVersion: deployguard.io/v1alpha1\nkind: GuardConfig\npolicy:\n  modeOverride: warn\n")},
			stdin: latestManifest, wantCode: 0, wantOut: []string{"warning [policy team] add a team label"}},
		{name: "a team policy enforces by default", args: []string{"-f", "-", "--policy-dir", teamPolicyDir},
			stdin: latestManifest, wantCode: 1, wantOut: []string{"error   spec: Forbidden: [policy team] add a team label"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := cli.Run(NewCommand, tt.args, strings.NewReader(tt.stdin), &stdout, &stderr)
			assert.Equal(t, tt.wantCode, code, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
			for _, w := range tt.wantOut {
				assert.Contains(t, stdout.String(), w)
			}
			if tt.wantErr != "" {
				assert.Contains(t, stderr.String(), tt.wantErr)
			}
		})
	}
}

func TestCheckJSONIsMachineReadable(t *testing.T) {
	var stdout, stderr bytes.Buffer
	cfg := writeFile(t, t.TempDir(), "enforce.yaml", "apiVersion: deployguard.io/v1alpha1\nkind: GuardConfig\npolicy:\n  modes: {images: enforce}\n")
	code := cli.Run(NewCommand, []string{"-f", "-", "-o", "json", "--config", cfg}, strings.NewReader(goodManifest+"---\n"+latestManifest), &stdout, &stderr)
	require.Equal(t, 1, code, stderr.String())
	var results []checkResult
	require.NoError(t, json.Unmarshal(stdout.Bytes(), &results))
	require.Len(t, results, 2)
	assert.Equal(t, "admitted", results[0].Verdict)
	assert.Equal(t, 2, results[1].Document)
	assert.Equal(t, "shop", results[1].Namespace)
	require.NotEmpty(t, results[1].Problems)
	assert.Equal(t, "spec.template.spec.containers[0].image", results[1].Problems[0].Field)
}

// A chart's replicas: 1 with a minAvailable: 1 budget is reported on
// whichever of the two comes second, as the cluster reports it; enforce mode
// refuses it.
func TestCheckReportsABudgetThatBlocksEveryDrain(t *testing.T) {
	const budget = "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: web, namespace: shop}\nspec:\n  minAvailable: 1\n  selector: {matchLabels: {app: web}}\n"
	const single = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: shop}\nspec:\n  replicas: 1\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n    spec:\n      containers: [{name: app, image: \"app:1.0\"}]\n"
	for _, tc := range []struct {
		name, input string
		second      string
	}{
		{"budget first", budget + "---\n" + single, `spec.replicas: PodDisruptionBudget "web" (minAvailable: 1) allows no eviction of 1 pod of Deployment "web" (1 replica)`},
		{"Deployment first", single + "---\n" + budget, `spec.minAvailable: this budget (minAvailable: 1) allows no eviction of the 1 pod of Deployment "web" (1 replica)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			require.Equal(t, 0, cli.Run(NewCommand, []string{"-f", "-", "-o", "json"}, strings.NewReader(tc.input), &stdout, &stderr), stderr.String())
			var results []checkResult
			require.NoError(t, json.Unmarshal(stdout.Bytes(), &results))
			require.Len(t, results, 2)
			for _, w := range results[0].Warnings {
				assert.NotContains(t, w, "allows no eviction", "the first of the two has nothing to be judged with yet")
			}
			assert.Contains(t, strings.Join(results[1].Warnings, "\n"), tc.second)
		})
	}
	cfg := writeFile(t, t.TempDir(), "enforce.yaml", "apiVersion: deployguard.io/v1alpha1\nkind: GuardConfig\ndisruptionBudgets: {mode: enforce}\n")
	var stdout, stderr bytes.Buffer
	assert.Equal(t, 1, cli.Run(NewCommand, []string{"-f", "-", "--config", cfg}, strings.NewReader(budget+"---\n"+single), &stdout, &stderr), "enforce mode refuses: %s", stdout.String())
}
