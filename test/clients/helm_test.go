package clients

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/deployguard/deployguard/test/harness"
)

var chart = filepath.Join(harness.RepoRoot(), "test", "clients", "testdata", "web")

// Helm 3's --wait checks readiness only: after the guard's rollback the
// Deployment is ready, so helm reports the release deployed. The documented
// pipeline adds the guard's step after it, and that fails.
func TestHelm3(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := harness.NewNamespace(t, local.Client)
	helm := filepath.Join(tools, "helm")
	plugin := filepath.Join(tools, "kubectl")

	r := command(ctx, helm, "upgrade", "--install", "shop", chart, "-n", ns, "--wait", "--timeout", "2m")
	require.Zero(t, r.Code, "good deploy: helm v3: %s", r)
	r = command(ctx, plugin, "deployguard", "rollout", "status", "deploy/shop-web", "-n", ns, "--timeout=2m")
	require.Zero(t, r.Code, "good deploy: the pipeline step: %s", r)
	waitKnownGood(t, ns, "shop-web")

	watchCtx, cancel := context.WithTimeout(ctx, 4*time.Minute)
	defer cancel()
	decided := decisionWatch(watchCtx, t, ns, "shop-web")
	hr := command(ctx, helm, "upgrade", "shop", chart, "-n", ns, "--set", "image.tag=no-such-tag", "--wait", "--timeout", "3m")
	t.Logf("bad deploy: helm v3 upgrade --wait: exit %d: %s", hr.Code, hr.Stdout+hr.Stderr)
	sr := command(ctx, plugin, "deployguard", "rollout", "status", "deploy/shop-web", "-n", ns, "--timeout=2m")
	assert.Equal(t, 1, sr.Code, "bad deploy: the documented pipeline (helm upgrade --wait && kubectl deployguard rollout status) fails: %s", sr)
	assert.Contains(t, sr.Stderr, "AutoRollback")
	assert.Contains(t, sr.Stderr, "ImagePullBackOff")
	select {
	case at := <-decided:
		logMeasured(t, "helm v3 --wait + kubectl deployguard rollout status", at, sr.Ended)
	case <-watchCtx.Done():
		require.FailNow(t, "the guard never decided")
	}
}

// Helm 4's --wait (the watcher strategy) judges with kstatus, which reads
// the guard's declaration and its Stalled verdict as Failed.
func TestHelm4(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := harness.NewNamespace(t, local.Client)
	helm := filepath.Join(tools, "helm4")

	r := command(ctx, helm, "upgrade", "--install", "shop", chart, "-n", ns, "--wait", "--timeout", "2m")
	require.Zero(t, r.Code, "good deploy: helm v4 --wait: %s", r)
	waitKnownGood(t, ns, "shop-web")

	watchCtx, cancel := context.WithTimeout(ctx, 4*time.Minute)
	defer cancel()
	decided := decisionWatch(watchCtx, t, ns, "shop-web")
	hr := command(ctx, helm, "upgrade", "shop", chart, "-n", ns, "--set", "image.tag=no-such-tag", "--wait", "--timeout", "3m")
	assert.NotZero(t, hr.Code, "bad deploy: helm v4 --wait must fail: %s", hr)
	assert.Contains(t, hr.Stderr, "Failed", "%s", hr)
	select {
	case at := <-decided:
		assert.Less(t, hr.Ended.Sub(at), 30*time.Second, "helm v4 fails within 30 s of the guard's decision")
		logMeasured(t, "helm v4 upgrade --wait", at, hr.Ended)
	case <-watchCtx.Done():
		require.FailNow(t, "the guard never decided")
	}
	r = command(ctx, helm, "status", "shop", "-n", ns)
	assert.Contains(t, r.Stdout, "STATUS: failed", "%s", r)

	// The fix, deployed the same way, reads as deployed: the verdict on the
	// rolled-back revision ends in the very write that records the new
	// generation as observed (the guard's status webhook), so no client can
	// read the fix as failed.
	stale := staleVerdictWatch(ctx, t, ns, "shop-web")
	r = command(ctx, helm, "upgrade", "shop", chart, "-n", ns, "--set", "image.tag=1.28", "--wait", "--timeout", "2m")
	assert.Zero(t, r.Code, "fixed deploy after a rollback: helm v4 --wait: %s", r)
	assert.Empty(t, stale(), "the fix was observed with the rolled-back revision's verdict on it")
}
