package reconciler

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/deployguard/deployguard/reconciler/vocab"
)

func TestAlignFinalizers(t *testing.T) {
	withFinalizers := func(f ...string) func(*appsv1.Deployment) {
		return func(d *appsv1.Deployment) { d.Finalizers = f }
	}
	tests := []struct {
		name           string
		d              *appsv1.Deployment
		clusterDefault []string
		want           []string
		changed        bool
	}{
		{name: "a Deployment that asks for nothing carries nothing", d: deployment()},
		{name: "an earlier version's finalizers go", d: deployment(withFinalizers(vocab.FinalizerDrain, otherFinalizer, vocab.FinalizerRecord)),
			want: []string{otherFinalizer}, changed: true},
		{name: "the annotation's steps are added in canonical order", d: deployment(annotate(vocab.AnnotationCleanup, "drain,record"), withFinalizers(otherFinalizer)),
			want: []string{otherFinalizer, vocab.FinalizerRecord, vocab.FinalizerDrain}, changed: true},
		{name: "already as asked: nothing to write", d: deployment(annotate(vocab.AnnotationCleanup, "record"), withFinalizers(vocab.FinalizerRecord, otherFinalizer)),
			want: []string{vocab.FinalizerRecord, otherFinalizer}},
		{name: "the cluster's default", d: deployment(), clusterDefault: []string{vocab.FinalizerRecord},
			want: []string{vocab.FinalizerRecord}, changed: true},
		{name: "none wins over the cluster's default", d: deployment(annotate(vocab.AnnotationCleanup, "none"), withFinalizers(vocab.FinalizerRecord)),
			clusterDefault: vocab.CanonicalFinalizers(), changed: true},
		{name: "an annotation that does not parse changes nothing", d: deployment(annotate(vocab.AnnotationCleanup, "backup"), withFinalizers(vocab.FinalizerDrain)),
			want: []string{vocab.FinalizerDrain}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, changed := AlignFinalizers(tt.d, tt.clusterDefault)
			assert.Equal(t, tt.want, got)
			assert.Equal(t, tt.changed, changed)
		})
	}
}

// A live Deployment that carries the finalizers an earlier version put on
// every Deployment loses them, in one conditional write; one that asks for
// its cleanup gets them.
func TestReconcileAlignsFinalizers(t *testing.T) {
	t.Run("not asked", func(t *testing.T) {
		d := deployment(func(d *appsv1.Deployment) { d.Finalizers = []string{vocab.FinalizerDrain, vocab.FinalizerRecord} })
		e := newEnv(t, namespace(nil), d)
		require.NoError(t, e.reconcile())
		assert.Empty(t, e.deployment().Finalizers)
		assert.Equal(t, [][]string{nil}, e.finalizerPatches())
		require.NoError(t, e.reconcile())
		assert.Len(t, e.finalizerPatches(), 1, "nothing more to write")
	})
	t.Run("asked", func(t *testing.T) {
		d := deployment(annotate(vocab.AnnotationCleanup, "record,drain"))
		e := newEnv(t, namespace(nil), d)
		require.NoError(t, e.reconcile())
		assert.Equal(t, vocab.CanonicalFinalizers(), e.deployment().Finalizers)
	})
	t.Run("asked, spec not yet observed: waits for the Deployment controller", func(t *testing.T) {
		d := deployment(annotate(vocab.AnnotationCleanup, "record,drain"), func(d *appsv1.Deployment) { d.Status.ObservedGeneration = 0 })
		e := newEnv(t, namespace(nil), d)
		require.NoError(t, e.reconcile())
		assert.Empty(t, e.deployment().Finalizers, "no write while the controller may be creating the newRS")
		got := e.deployment()
		got.Status.ObservedGeneration = got.Generation
		require.NoError(t, e.client.Status().Update(context.Background(), got))
		require.NoError(t, e.reconcile())
		assert.Equal(t, vocab.CanonicalFinalizers(), e.deployment().Finalizers)
	})
	t.Run("opted-out namespace: left alone", func(t *testing.T) {
		d := deployment(func(d *appsv1.Deployment) { d.Finalizers = []string{vocab.FinalizerDrain} })
		e := newEnv(t, namespace(map[string]string{vocab.LabelGuard: vocab.LabelGuardDisabled}), d)
		require.NoError(t, e.reconcile())
		assert.Equal(t, []string{vocab.FinalizerDrain}, e.deployment().Finalizers)
	})
}

// The drain is done once every pod has been told to stop: the Deployment goes
// while its pods end gracefully, so a client that deletes it and waits for
// its pods finds it gone.
func TestDrainDoneWhenEveryPodIsStopping(t *testing.T) {
	d := deployment(deleting(vocab.FinalizerDrain), func(d *appsv1.Deployment) {
		d.Annotations[vocab.AnnotationDrainStarted] = t0.Add(20 * time.Minute).Format(time.RFC3339)
		d.Annotations[vocab.AnnotationDrainReplicas] = "3"
	})
	rs1, rs2, rs3 := history(d)
	rs3.Spec.Replicas = ptr.To[int32](0)
	stopping := pod(rs3, "web-h3-a", corev1.PodRunning)
	stopping.DeletionTimestamp = &metav1.Time{Time: t0.Add(20 * time.Minute)}
	stopping.Finalizers = []string{"example.com/hold"} // a pod still shutting down
	e := newEnv(t, namespace(nil), d, rs1, rs2, rs3, stopping, pod(rs3, "web-h3-done", corev1.PodSucceeded))

	e.reconcileResult()

	assert.Equal(t, []string{vocab.ReasonDrained}, eventReasons(e.events()))
	assert.Equal(t, 1.0, e.cleanupSteps(stepDrain, resultCompleted))
}

// An orphaning deletion keeps the ReplicaSets and their pods for a new owner:
// the drain must not scale them down. A foreground deletion leaves them to
// the garbage collector.
func TestDrainSkipped(t *testing.T) {
	for name, gcFinalizer := range map[string]string{"orphan": metav1.FinalizerOrphanDependents, "foreground": metav1.FinalizerDeleteDependents} {
		t.Run(name, func(t *testing.T) {
			d := deployment(deleting(vocab.FinalizerDrain, gcFinalizer))
			rs1, rs2, rs3 := history(d)
			rs3.Spec.Replicas = ptr.To[int32](3)
			e := newEnv(t, namespace(nil), d, rs1, rs2, rs3, pod(rs3, "web-h3-a", corev1.PodRunning))

			e.reconcileResult()

			assert.Equal(t, []string{vocab.ReasonDrainSkipped}, eventReasons(e.events()))
			assert.Equal(t, int32(3), *e.replicaSet("web-h3").Spec.Replicas, "the ReplicaSet is not scaled")
			assert.Equal(t, []string{gcFinalizer}, e.deployment().Finalizers, "the garbage collector's finalizer is left to it")
			assert.Equal(t, 1.0, e.cleanupSteps(stepDrain, resultSkipped))
		})
	}
}

// While the guard is being uninstalled (its webhook configurations deleted
// first), the reconciler removes finalizers but never adds them back.
func TestFinalizersNotAddedOnceUninstalled(t *testing.T) {
	d := deployment(annotate(vocab.AnnotationCleanup, "record,drain"))
	e := newEnv(t, namespace(nil), d)
	e.r.Installed = func(context.Context) (bool, error) { return false, nil }
	require.NoError(t, e.reconcile())
	assert.Empty(t, e.deployment().Finalizers)

	e.r.Installed = func(context.Context) (bool, error) { return true, nil }
	require.NoError(t, e.reconcile())
	assert.Equal(t, vocab.CanonicalFinalizers(), e.deployment().Finalizers)
}

// The garbage collector carried out an orphaning deletion before the drain
// ran (its finalizer already gone): the ReplicaSets are no longer the
// Deployment's, and are not scaled down.
func TestDrainLeavesReplicaSetsAlreadyOrphaned(t *testing.T) {
	d := deployment(deleting(vocab.FinalizerDrain))
	rs1, rs2, rs3 := history(d)
	for _, rs := range []*appsv1.ReplicaSet{rs1, rs2, rs3} {
		rs.OwnerReferences = nil
	}
	rs3.Spec.Replicas = ptr.To[int32](2)
	e := newEnv(t, namespace(nil), d, rs1, rs2, rs3, pod(rs3, "web-h3-a", corev1.PodRunning))

	e.reconcileResult()

	assert.Equal(t, []string{vocab.ReasonDrainSkipped}, eventReasons(e.events()))
	assert.Equal(t, int32(2), *e.replicaSet("web-h3").Spec.Replicas)
	assert.Empty(t, e.patches[:len(e.patches)-1], "nothing written but the finalizer's removal")
}
