package check

import (
	"encoding/json"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// kustomizeFixture writes a base and an overlay, as the microservices-demo and
// argocd-example-apps repositories lay them out: the overlay's patches are
// Deployments without containers (replicas only) and a $patch directive. It
// returns the overlay's directory.
func kustomizeFixture(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	writeFile(t, dir, "base/kustomization.yaml", "resources:\n- deployment.yaml\n- service.yaml\n")
	writeFile(t, dir, "base/deployment.yaml", `apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 1
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: web
        image: web:1.0
        readinessProbe: {tcpSocket: {port: 80}}
        resources: {requests: {cpu: 10m, memory: 16Mi}}
      - name: sidecar
        image: sidecar:1.0
        readinessProbe: {tcpSocket: {port: 81}}
        resources: {requests: {cpu: 10m, memory: 16Mi}}
`)
	writeFile(t, dir, "base/service.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec:\n  selector: {app: web}\n  ports: [{port: 80}]\n")
	writeFile(t, dir, "prod/kustomization.yaml", `namePrefix: prod-
namespace: shop
resources:
- ../base
images:
- name: web
  newTag: latest
patches:
- path: replicas.yaml
patchesStrategicMerge:
- no-sidecar.yaml
`)
	writeFile(t, dir, "prod/replicas.yaml", "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\nspec:\n  replicas: 2\n  strategy:\n    rollingUpdate: {maxUnavailable: 2}\n")
	writeFile(t, dir, "prod/no-sidecar.yaml", "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\nspec:\n  template:\n    spec:\n      containers:\n      - name: sidecar\n        $patch: delete\n")
	return filepath.Join(dir, "prod")
}

func TestCheckKustomize(t *testing.T) {
	overlay := kustomizeFixture(t)
	base := filepath.Join(filepath.Dir(overlay), "base")

	code, out, stderr := runCheck(t, "-k", overlay, "-o", "json")
	require.Equal(t, 1, code, stderr)
	var results []checkResult
	require.NoError(t, json.Unmarshal([]byte(out), &results))
	require.Len(t, results, 2, out)
	svc, web := results[0], results[1]
	if svc.Kind == "Deployment" {
		svc, web = web, svc
	}
	assert.Equal(t, "skipped", svc.Verdict)
	assert.Equal(t, "prod-web", web.Name, "what kustomize renders is checked")
	assert.Equal(t, "shop", web.Namespace)
	assert.Equal(t, "denied", web.Verdict)
	// The findings point at the file the Deployment came from.
	assert.Equal(t, filepath.Join(base, "deployment.yaml"), web.File)
	assert.Equal(t, 1, web.Line)
	got := map[string]string{}
	for _, f := range web.Findings {
		got[f.Rule] = f.File + ":" + strconv.Itoa(f.Line)
	}
	// maxUnavailable is written in the overlay's patch: the finding points
	// there. The image's tag is the overlay's images transformer's, its field
	// is in the base.
	assert.Equal(t, map[string]string{
		"check/spec.strategy.rollingUpdate.maxUnavailable": filepath.Join(overlay, "replicas.yaml") + ":8",
		"policy/images": ":15",
	}, got)
	code, sarif, _ := runCheck(t, "-k", overlay, "-o", "sarif")
	assert.Equal(t, 1, code)
	assert.Contains(t, sarif, `"uri": "file://`+filepath.ToSlash(filepath.Join(overlay, "replicas.yaml"))+`"`)

	code, text, _ := runCheck(t, "-k", overlay)
	assert.Equal(t, 1, code)
	assert.Contains(t, text, "Deployment shop/prod-web: DENIED")
	assert.NotContains(t, text, "sidecar", "the $patch: delete was applied")
}

func TestCheckKustomizeErrors(t *testing.T) {
	code, _, stderr := runCheck(t, "-k", t.TempDir())
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "no kustomization")

	dir := t.TempDir()
	writeFile(t, dir, "kustomization.yaml", "resources:\n- missing.yaml\n")
	code, _, stderr = runCheck(t, "-k", dir)
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "kustomize build")
}

// The patches of a kustomization met as plain files are skipped with a note,
// not denied as objects: a Deployment without containers that the
// kustomization lists, and a document with a $patch directive anywhere.
func TestCheckSkipsPatchFragments(t *testing.T) {
	overlay := kustomizeFixture(t)
	tree := filepath.Dir(overlay)
	for _, args := range [][]string{
		{"-f", tree},
		{"-f", filepath.Join(overlay, "replicas.yaml")},
		{"-f", filepath.Join(overlay, "no-sidecar.yaml")},
	} {
		code, out, stderr := runCheck(t, append(args, "-o", "json")...)
		assert.Equal(t, 0, code, "%v: %s %s", args, out, stderr)
		var results []checkResult
		require.NoError(t, json.Unmarshal([]byte(out), &results))
		for _, r := range results {
			if filepath.Dir(r.File) != overlay {
				continue
			}
			assert.Equal(t, "skipped", r.Verdict, "%s", r.File)
			assert.Regexp(t, "patch|kustomization", r.Note, r.File)
		}
	}
	// patches given as bare paths, as argocd-example-apps' kustomized-helm does.
	bare := t.TempDir()
	writeFile(t, bare, "kustomization.yaml", "resources:\n- all.yaml\npatches:\n- overlays/web.yaml\n")
	code, out, _ := runCheck(t, "-f", writeFile(t, bare, "overlays/web.yaml", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec:\n  template:\n    spec:\n      containers:\n      - {name: web, image: 'web:5'}\n"))
	assert.Equal(t, 0, code, out)
	assert.Contains(t, out, "SKIPPED")
	assert.Contains(t, out, "a patch that "+filepath.Join(bare, "kustomization.yaml")+" lists")

	// Without a kustomization listing it, a $patch document is still a patch.
	code, out, _ = runCheck(t, "-f", writeFile(t, t.TempDir(), "p.yaml", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\n$patch: replace\nspec: {}\n"))
	assert.Equal(t, 0, code)
	assert.Contains(t, out, "strategic-merge patch ($patch directive)")
	// A Deployment that no kustomization lists is checked, and refused.
	code, out, _ = runCheck(t, "-f", writeFile(t, t.TempDir(), "d.yaml", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec: {replicas: 2}\n"))
	assert.Equal(t, 1, code, out)
}
