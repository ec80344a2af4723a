//go:build coldstart

package e2e

// Built only with -tags coldstart (make test-coldstart), not in make test:
// in a full CI run on 2 cores the guard's own Deployment once did not complete
// a rollout within 3 minutes of the control plane's restart (it passes run
// alone, in about 30 s). Kept runnable while that is understood.

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/test/harness"
)

// TestColdStartWithoutTheGuard starts a whole cluster whose guard webhooks are
// registered while no guard runs, as after a cluster stop and start, before
// the guard's own pod is up. Nothing may wait on the guard to start the
// guard: the control plane comes up, the guard's own Deployment (in its
// excluded namespace) rolls out, scaling through the scale subresource works
// for every Deployment; only Deployment writes in guarded namespaces are
// refused (failurePolicy Fail), until the guard is back.
func TestColdStartWithoutTheGuard(t *testing.T) {
	l, _ := ownCluster(t, "cold")
	ctx := context.Background()
	ns := newNamespace(t, nil)
	require.NoError(t, l.Client.Create(ctx, deployment(ns, "web", "app:1")))
	waitAvailable(t, ns, "web", time.Minute)
	// A stand-in for the guard's own Deployment, where config/ installs it.
	own := deployment(harness.GuardNamespace, "deployguard", "deployguard:dev")
	require.NoError(t, l.Client.Create(ctx, own))
	waitAvailable(t, harness.GuardNamespace, "deployguard", time.Minute)

	port := l.Guard.Opts.WebhookPort
	require.NoError(t, l.Guard.Stop())
	require.NoError(t, l.Cluster.StopControlPlane(ctx))
	started := time.Now()
	require.NoError(t, l.Cluster.StartControlPlane(ctx))
	t.Logf("control plane ready %s after its start, with the guard's webhooks registered and no guard", time.Since(started).Round(100*time.Millisecond))

	// The guard's own Deployment rolls out a new revision (as an upgrade or
	// a node drain would need) without the guard.
	require.NoError(t, update(t, harness.GuardNamespace, "deployguard", func(d *appsv1.Deployment) {
		d.Spec.Template.Annotations = map[string]string{"kubectl.kubernetes.io/restartedAt": time.Now().Format(time.RFC3339)}
	}))
	afterRestart(t, l.Client, harness.GuardNamespace, "deployguard", "the guard's own Deployment did not roll out without the guard", completed)
	// kube-system is excluded too.
	require.NoError(t, l.Client.Create(ctx, deployment("kube-system", "addon", "addon:1")))
	// Scaling a guarded Deployment goes through the scale subresource, which
	// the webhooks do not intercept: an HPA keeps working.
	scale := &autoscalingv1.Scale{Spec: autoscalingv1.ScaleSpec{Replicas: 3}}
	require.NoError(t, l.Client.SubResource("scale").Update(ctx, get(ctx, t, ns, "web"), client.WithSubResourceBody(scale)))
	afterRestart(t, l.Client, ns, "web", "the scale of a guarded Deployment was not carried out", func(d *appsv1.Deployment) bool {
		return d.Status.ReadyReplicas == 3
	})
	// A write of a guarded Deployment fails closed, and says why.
	err := l.Client.Create(ctx, deployment(ns, "new", "app:1"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "failed calling webhook", "refused because the guard is not there, and the error says so")

	start := time.Now()
	require.NoError(t, l.StartGuard(ctx, port))
	require.NoError(t, l.Client.Create(ctx, deployment(ns, "new", "app:1")))
	t.Logf("guard started after the cold start: admitting again %s after its start", time.Since(start).Round(100*time.Millisecond))
	var pods corev1.PodList
	require.NoError(t, l.Client.List(ctx, &pods, client.InNamespace(harness.GuardNamespace)))
	assert.NotEmpty(t, pods.Items)
}
