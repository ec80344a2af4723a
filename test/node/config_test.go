package node

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/test/harness"
)

// configChart is a release of the test app reading its one setting from a
// ConfigMap, with Helm's checksum annotation: a config change is a rollout.
var configChart = filepath.Join(harness.RepoRoot(), "test", "node", "testdata", "configapp")

// installConfigApp installs the release with a good config and waits for it
// to be recorded known-good (by the guard, where it runs).
func installConfigApp(ctx context.Context, t *testing.T, ns, rel string, guarded bool) {
	t.Helper()
	r := helm(ctx, "install", rel, configChart, "-n", ns, "--wait", "--timeout", "3m")
	require.Zero(t, r.Code, "helm install: %s", r)
	if guarded {
		waitDeployment(t, ns, rel, "revision 1 was not recorded known-good", 2*time.Minute, func(l rollout.Ledger, d *appsv1.Deployment) bool {
			n := l.Newest()
			return n != nil && n.Revision == 1 && len(n.Config) == 1 && completed(d)
		})
	}
}

// restartOnePod deletes one Ready pod of the Deployment, as a node drain or
// an eviction does, and returns the state of its replacement once it has
// either become Ready or failed to start: whether the config the template
// reads now lets a pod start.
func restartOnePod(ctx context.Context, t *testing.T, ns, name string) (ready bool, state string) {
	t.Helper()
	d, err := get(ctx, ns, name)
	require.NoError(t, err)
	var pods corev1.PodList
	require.NoError(t, cl.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels(d.Spec.Selector.MatchLabels)))
	var victim *corev1.Pod
	for i, p := range pods.Items {
		if p.DeletionTimestamp == nil && len(p.Status.ContainerStatuses) > 0 && p.Status.ContainerStatuses[0].Ready {
			victim = &pods.Items[i]
			break
		}
	}
	require.NotNil(t, victim, "a Ready pod: %v", podStates(ctx, ns))
	before := map[string]bool{}
	for _, p := range pods.Items {
		before[p.Name] = true
	}
	t.Logf("deleting %s", victim.Name)
	require.NoError(t, cl.Delete(ctx, victim))
	harness.WaitFor(t, 2*time.Minute, "the replacement pod neither became Ready nor failed", func(ctx context.Context) (bool, string, error) {
		var now corev1.PodList
		if err := cl.List(ctx, &now, client.InNamespace(ns), client.MatchingLabels(d.Spec.Selector.MatchLabels)); err != nil {
			return false, err.Error(), nil
		}
		for _, p := range now.Items {
			if before[p.Name] || len(p.Status.ContainerStatuses) == 0 {
				continue
			}
			s := p.Status.ContainerStatuses[0]
			switch {
			case s.Ready:
				ready, state = true, p.Name+" Ready"
				return true, state, nil
			case s.LastTerminationState.Terminated != nil:
				state = fmt.Sprintf("%s exited %d times: %s", p.Name, s.RestartCount, strings.TrimSpace(s.LastTerminationState.Terminated.Message))
				return true, state, nil
			}
		}
		return false, strings.Join(podStates(ctx, ns), "; "), nil
	})
	return ready, state
}

// A Helm release whose upgrade puts a bad value in its ConfigMap (and the
// checksum in its template): the new pods exit on start, the guard rolls
// back, and the restored pods read the config revision 1 ran with, from its
// snapshot. The pipeline step fails and names the restored config.
func helmConfigChangeIsRestoredFromItsSnapshot(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, cl)
	installConfigApp(ctx, t, ns, "shop", true)

	r := helm(ctx, "upgrade", "shop", configChart, "-n", ns, "--set", "config=bad")
	require.Zero(t, r.Code, "helm upgrade: %s", r)
	step := kubectlDeployguard(ctx, "rollout", "status", "deploy/shop", "-n", ns, "--timeout=4m")
	t.Logf("kubectl deployguard rollout status: %s", step)
	assert.Equal(t, 1, step.Code, "the pipeline step fails")
	assert.Contains(t, step.Stdout+step.Stderr, "Config restored: ConfigMap shop-config from snapshot shop-config-dg-")

	d := rolledBack(ctx, t, ns, "shop", 4*time.Minute)
	t.Logf("AutoRollback: %s", d)
	assert.Contains(t, d, "Config restored: ConfigMap shop-config from snapshot shop-config-dg-")
	got, err := get(ctx, ns, "shop")
	require.NoError(t, err)
	snap := got.Spec.Template.Spec.Volumes[0].ConfigMap.Name
	assert.True(t, strings.HasPrefix(snap, "shop-config-dg-"), "the restored template mounts the snapshot: %s", snap)
	var cm corev1.ConfigMap
	require.NoError(t, cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: "shop-config"}, &cm))
	assert.Equal(t, "bad", cm.Data["config"], "the release's ConfigMap is left as Helm wrote it")

	ready, state := restartOnePod(ctx, t, ns, "shop")
	assert.True(t, ready, "a pod of the restored revision starts again with the good config: %s", state)
}

// The same upgrade, in a namespace the guard leaves alone, undone with
// upstream's `kubectl rollout undo`: the template comes back, but it reads
// the same ConfigMap, which now holds the bad value; the first pod that
// starts again fails.
func rolloutUndoAloneDoesNotHealAConfigChange(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, cl, harness.NamespaceLabels(map[string]string{vocab.LabelGuard: vocab.LabelGuardDisabled}))
	installConfigApp(ctx, t, ns, "shop", false)

	r := helm(ctx, "upgrade", "shop", configChart, "-n", ns, "--set", "config=bad")
	require.Zero(t, r.Code, "helm upgrade: %s", r)
	waitDeployment(t, ns, "shop", "the bad config's pods never failed", 2*time.Minute, func(_ rollout.Ledger, d *appsv1.Deployment) bool {
		return strings.Contains(strings.Join(podStates(ctx, ns), ";"), "bad configuration")
	})
	logEvidence(ctx, t, ns)
	r = kubectl(ctx, "rollout", "undo", "deploy/shop", "-n", ns)
	require.Zero(t, r.Code, "kubectl rollout undo: %s", r)
	waitDeployment(t, ns, "shop", "the undo never completed", 2*time.Minute, func(_ rollout.Ledger, d *appsv1.Deployment) bool {
		return completed(d)
	})
	ready, state := restartOnePod(ctx, t, ns, "shop")
	t.Logf("after kubectl rollout undo, a restarted pod: %s", state)
	assert.False(t, ready, "upstream's undo restores the template, not the config it ran with")
}

// kubectlDeployguard runs the guard's CLI as the kubectl plugin, as a
// pipeline does (setup puts bin/, with kubectl-deployguard, on PATH).
func kubectlDeployguard(ctx context.Context, args ...string) result {
	return kubectl(ctx, append([]string{"deployguard"}, args...)...)
}
