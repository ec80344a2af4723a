package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/test/harness"
)

// The harness itself: Deployments roll out for real on kwok nodes, through the
// guard's webhooks.
func TestDeploymentBecomesAvailableOnKwokNodes(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, local.Client)
	d := harness.Deployment(ns, "web", "nginx:1.27.3", shortDeadline)
	d.Spec.Selector = nil // repaired by the guard on the way in
	require.NoError(t, local.Client.Create(ctx, d))

	got := waitAvailable(t, ns, "web", time.Minute)
	assert.Equal(t, map[string]string{"app.kubernetes.io/name": "web"}, got.Spec.Selector.MatchLabels)
	assert.Equal(t, "spec.selector", got.Annotations[vocab.AnnotationDefaulted], "the only change the guard made")
	assert.Empty(t, got.Finalizers, "no cleanup asked for, none held")

	var pods corev1.PodList
	require.NoError(t, local.Client.List(ctx, &pods, client.InNamespace(ns)))
	require.Len(t, pods.Items, 2)
	for _, p := range pods.Items {
		assert.NotEmpty(t, p.Spec.NodeName, "scheduled by kube-scheduler on a kwok node")
		assert.Equal(t, corev1.PodRunning, p.Status.Phase)
	}
}

// A rollout whose pods can never be scheduled is stuck: the real Deployment
// controller marks it ProgressDeadlineExceeded after progressDeadlineSeconds.
// With no earlier revision that completed, the guard has nothing to roll back
// to, and says so.
func TestStuckRolloutReachesProgressDeadlineExceeded(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, local.Client)
	d := harness.Deployment(ns, "stuck", "nginx:1.27.3", shortDeadline)
	breakTemplate(&d.Spec.Template, "nginx:1.27.3")
	require.NoError(t, local.Client.Create(ctx, d))

	harness.WaitFor(t, time.Duration(deadline+30)*time.Second, "no ProgressDeadlineExceeded", func(ctx context.Context) (bool, string, error) {
		d := get(ctx, t, ns, "stuck")
		p := condition(d, appsv1.DeploymentProgressing)
		return p != nil && p.Status == corev1.ConditionFalse && p.Reason == vocab.ProgressDeadlineExceeded, describe(d), nil
	})
	harness.WaitFor(t, 10*time.Second, "the guard did not say why it did not roll back", func(ctx context.Context) (bool, string, error) {
		d := get(ctx, t, ns, "stuck")
		return assert.ObjectsAreEqual([]string{vocab.ReasonNoKnownGoodRevision}, harness.GuardEventReasons(ctx, t, local.Client, ns, "stuck")) &&
			d.Annotations[vocab.AnnotationRollbackStatus] != "", describe(d), nil
	})
	got := get(ctx, t, ns, "stuck")
	assert.Contains(t, got.Annotations[vocab.AnnotationRollbackStatus], "no known-good revision")
	assert.Equal(t, "no-such-node", got.Spec.Template.Spec.NodeSelector["deployguard.io/e2e"], "nothing was rolled back")
}
