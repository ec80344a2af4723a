package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/test/harness"
)

// A scale-up whose new pods can never be scheduled is what upstream never
// reports: the template did not change, so no progress deadline runs. The
// guard reports it within the deadline plus a resync (Stalled=True, reason
// ScaleUpStalled, which kstatus-based tools read as Failed; an Event;
// `deployguard status`), and clears it when the Deployment is scaled back.
func TestScaleUpThatCannotCompleteIsReported(t *testing.T) {
	t.Parallel()
	const progressDeadline = 15 * time.Second
	ctx := context.Background()
	ns := harness.NewNamespace(t, local.Client)
	d := harness.Deployment(ns, "spread", "app:1", shortDeadline)
	d.Spec.ProgressDeadlineSeconds = ptr(int32(progressDeadline / time.Second))
	// One pod per node, and the cluster has two nodes: two replicas run, and
	// every pod beyond them is unschedulable.
	d.Spec.Template.Spec.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
			TopologyKey:   corev1.LabelHostname,
			LabelSelector: &metav1.LabelSelector{MatchLabels: d.Spec.Selector.MatchLabels},
		}},
	}}
	require.NoError(t, local.Client.Create(ctx, d))
	waitAvailable(t, ns, "spread", time.Minute)

	scaled := time.Now()
	require.NoError(t, update(t, ns, "spread", func(d *appsv1.Deployment) { d.Spec.Replicas = ptr(int32(6)) }))
	var stalled *appsv1.DeploymentCondition
	harness.WaitFor(t, progressDeadline+45*time.Second, "the stalled scale-up was not reported", func(ctx context.Context) (bool, string, error) {
		d := get(ctx, t, ns, "spread")
		stalled = condition(d, vocab.ConditionStalled)
		return stalled != nil && stalled.Status == corev1.ConditionTrue && stalled.Reason == vocab.ReasonScaleUpStalled, describe(d), nil
	})
	t.Logf("reported %s after the scale-up (deadline %s)", time.Since(scaled).Round(time.Second), progressDeadline)
	assert.GreaterOrEqual(t, time.Since(scaled), progressDeadline, "reported before the progress deadline")
	for _, want := range []string{"2/6 replicas available", "past the progress deadline of 15s", "4 Unschedulable", "anti-affinity", "scale back to 2"} {
		assert.Contains(t, stalled.Message, want)
	}
	assert.Contains(t, guardEvent(t, ns, "spread", vocab.ReasonScaleUpStalled), "4 Unschedulable")
	st, text := statusOf(ctx, t, ns, "spread")
	assert.Equal(t, stalled.Message, st.ScaleUpStalled)
	assert.Contains(t, text, "Scale-up stalled (Stalled, ScaleUpStalled): 2/6 replicas available")
	// Nothing was rolled back: there is no template to roll back to.
	got := get(ctx, t, ns, "spread")
	assert.Zero(t, rolledBackRevision(got), describe(got))
	assert.NotContains(t, got.Labels, vocab.LabelRolledBack)

	require.NoError(t, update(t, ns, "spread", func(d *appsv1.Deployment) { d.Spec.Replicas = ptr(int32(2)) }))
	harness.WaitFor(t, 30*time.Second, "the report was not cleared after scaling back", func(ctx context.Context) (bool, string, error) {
		d := get(ctx, t, ns, "spread")
		return condition(d, vocab.ConditionStalled) == nil, describe(d), nil
	})
	assert.True(t, strings.HasPrefix(guardEvent(t, ns, "spread", vocab.ReasonScaleUpRecovered), "The scale-up no longer stalls: 2/2 replicas available"))
}

// A scale-up that a ResourceQuota refuses creates no pod at all: only the
// ReplicaSet's ReplicaFailure condition says why, and the guard's cache keeps
// none of a ReplicaSet's conditions. The guard reads it from the API server
// and reports the stall with the quota's words.
func TestScaleUpRefusedByAQuotaIsReported(t *testing.T) {
	t.Parallel()
	const progressDeadline = 15 * time.Second
	ctx := context.Background()
	ns := harness.NewNamespace(t, local.Client)
	require.NoError(t, local.Client.Create(ctx, &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pods"},
		Spec:       corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("2")}},
	}))
	harness.WaitFor(t, time.Minute, "the quota controller never counted the namespace", func(ctx context.Context) (bool, string, error) {
		var q corev1.ResourceQuota
		if err := local.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "pods"}, &q); err != nil {
			return false, "", err
		}
		_, counted := q.Status.Used[corev1.ResourcePods]
		return counted, fmt.Sprintf("%+v", q.Status), nil
	})
	d := harness.Deployment(ns, "quota", "app:1", shortDeadline)
	d.Spec.ProgressDeadlineSeconds = ptr(int32(progressDeadline / time.Second))
	require.NoError(t, local.Client.Create(ctx, d))
	waitAvailable(t, ns, "quota", time.Minute)

	require.NoError(t, update(t, ns, "quota", func(d *appsv1.Deployment) { d.Spec.Replicas = ptr(int32(4)) }))
	var stalled *appsv1.DeploymentCondition
	harness.WaitFor(t, progressDeadline+45*time.Second, "the scale-up the quota refused was not reported", func(ctx context.Context) (bool, string, error) {
		d := get(ctx, t, ns, "quota")
		stalled = condition(d, vocab.ConditionStalled)
		return stalled != nil && stalled.Status == corev1.ConditionTrue && stalled.Reason == vocab.ReasonScaleUpStalled, describe(d), nil
	})
	for _, want := range []string{"2/4 replicas available", "FailedCreate", "exceeded quota", "scale back to 2"} {
		assert.Contains(t, stalled.Message, want)
	}
}
