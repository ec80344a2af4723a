package clients

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/deployguard/deployguard/test/harness"
)

// Flux's kustomize-controller and source-controller, built from their
// modules, deploy from an OCI artifact served on loopback, with health
// checks on (wait: true, which judges with Flux's kstatus).
func TestFlux(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	logf, err := os.Create(filepath.Join(local.Opts.WorkDir, "flux.log"))
	require.NoError(t, err)
	defer logf.Close()

	src, kust, err := harness.BuildFlux(ctx, logf)
	require.NoError(t, err)
	require.NoError(t, local.Cluster.InstallFluxCRDs(ctx))
	reg := harness.StartOCIRegistry()
	defer reg.Close()
	flux, err := harness.StartFlux(ctx, harness.FluxOptions{SourceController: src, KustomizeController: kust,
		Kubeconfig: local.Cluster.Kubeconfig, WorkDir: filepath.Join(local.Opts.WorkDir, "flux"), Output: logf})
	require.NoError(t, err)
	defer func() { assert.NoError(t, flux.Stop()) }()

	ns := harness.NewNamespace(t, local.Client)
	push := func(image string) {
		t.Helper()
		_, err := reg.PushFiles("apps/web", "latest", map[string]string{"web.yaml": webManifest(t, ns, "web", image)})
		require.NoError(t, err)
	}
	push(goodImage)
	r := kubectl(ctx, "apply", "-f", writeFile(t, "flux.yaml", fmt.Sprintf(`apiVersion: source.toolkit.fluxcd.io/v1
kind: OCIRepository
metadata:
  name: web
  namespace: %[1]s
spec:
  interval: 2s
  insecure: true
  url: %[2]s
  ref:
    tag: latest
---
apiVersion: kustomize.toolkit.fluxcd.io/v1
kind: Kustomization
metadata:
  name: web
  namespace: %[1]s
spec:
  interval: 10m
  retryInterval: 5s
  timeout: 2m
  prune: true
  wait: true
  sourceRef:
    kind: OCIRepository
    name: web
`, ns, reg.URL("apps/web"))))
	require.Zero(t, r.Code, "%s", r)

	ready := func() (string, string) {
		out := kubectl(ctx, "get", "kustomization", "web", "-n", ns, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}|{.status.conditions[?(@.type=="Ready")].reason}|{.status.conditions[?(@.type=="Ready")].message}`)
		status, rest, _ := strings.Cut(out.Stdout, "|")
		return status, rest
	}
	waitReady := func(what, want string, match func(msg string) bool) string {
		t.Helper()
		var status, msg string
		harness.WaitFor(t, 4*time.Minute, what, func(ctx context.Context) (bool, string, error) {
			status, msg = ready()
			return status == want && match(msg), status + " " + msg, nil
		})
		return msg
	}
	anything := func(string) bool { return true }

	waitReady("good deploy: Kustomization Ready=True", "True", anything)
	waitKnownGood(t, ns, "web")

	watchCtx, cancelWatch := context.WithTimeout(ctx, 5*time.Minute)
	defer cancelWatch()
	decided := decisionWatch(watchCtx, t, ns, "web")
	push(badImage)
	msg := waitReady("bad deploy: Kustomization Ready=False", "False", func(msg string) bool {
		return strings.Contains(msg, "HealthCheckFailed") || strings.Contains(msg, "deployguard")
	})
	failedAt := time.Now()
	t.Logf("bad deploy: Flux Kustomization Ready=False: %s", msg)
	select {
	case at := <-decided:
		logMeasured(t, "Flux Kustomization Ready=False", at, failedAt)
	case <-watchCtx.Done():
		require.FailNow(t, "the guard never decided")
	}
	// Its retries apply the failed template again: refused by the
	// quarantine, in the guard's words, with the evidence.
	msg = waitReady("bad deploy: Ready=False with the guard's message", "False", func(msg string) bool {
		return strings.Contains(msg, "deployguard rolled it back") && strings.Contains(msg, "ImagePullBackOff")
	})
	t.Logf("bad deploy, retried: Flux Kustomization Ready=False: %s", msg)
	d := get(ctx, t, ns, "web")
	assert.Equal(t, goodImage, d.Spec.Template.Spec.Containers[0].Image, "Flux's re-apply did not undo the rollback")

	// A fixed template pushed to the source rolls out and reads Ready.
	push(fixedImage)
	waitReady("fixed deploy: Kustomization Ready=True", "True", anything)
	d = get(ctx, t, ns, "web")
	assert.Equal(t, fixedImage, d.Spec.Template.Spec.Containers[0].Image)
	assert.Nil(t, stalled(d), "the verdict ended with the fixed template: %s", describe(d))
}
