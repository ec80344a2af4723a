package reconciler

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/deployguard/deployguard/reconciler/vocab"
)

func TestIsComplete(t *testing.T) {
	tests := []struct {
		name string
		d    *appsv1.Deployment
		want bool
	}{
		{name: "NewReplicaSetAvailable, all replicas updated and available", d: deployment(completed), want: true},
		{name: "no Progressing condition (no progress deadline)", d: deployment(func(d *appsv1.Deployment) {
			completed(d)
			d.Status.Conditions = nil
		}), want: false},
		{name: "still progressing", d: deployment(completed, func(d *appsv1.Deployment) {
			d.Status.Conditions[0].Reason = "ReplicaSetUpdated"
		}), want: false},
		{name: "deadline exceeded", d: deployment(failed), want: false},
		{name: "paused condition", d: deployment(completed, func(d *appsv1.Deployment) {
			d.Status.Conditions[0].Status, d.Status.Conditions[0].Reason = corev1.ConditionUnknown, vocab.DeploymentPaused
		}), want: false},
		{name: "new generation not observed yet", d: deployment(completed, func(d *appsv1.Deployment) { d.Generation = 4 }), want: false},
		{name: "an old pod still running", d: deployment(completed, func(d *appsv1.Deployment) { d.Status.Replicas = 4 }), want: false},
		{name: "one updated replica not available", d: deployment(completed, func(d *appsv1.Deployment) { d.Status.AvailableReplicas = 2 }), want: false},
		{name: "scaled up, not all updated yet", d: deployment(completed, func(d *appsv1.Deployment) { d.Spec.Replicas = ptr.To[int32](5) }), want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, IsComplete(tt.d))
		})
	}
}

func TestReplicaSetToMark(t *testing.T) {
	tests := []struct {
		name string
		d    *appsv1.Deployment
		want bool
	}{
		{name: "complete rollout: its newRS", d: deployment(completed), want: true},
		{name: "paused: never marked", d: deployment(completed, paused), want: false},
		{name: "scaled to zero: nothing proven", d: deployment(func(d *appsv1.Deployment) {
			d.Spec.Replicas = ptr.To[int32](0)
			completed(d)
		}), want: false},
		{name: "not complete", d: deployment(failed), want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rs1, rs2, rs3 := history(tt.d)
			got := ReplicaSetToMark(tt.d, []*appsv1.ReplicaSet{rs1, rs2, rs3})
			if tt.want {
				assert.Equal(t, rs3, got)
			} else {
				assert.Nil(t, got)
			}
		})
	}

	t.Run("newRS not in the cache yet", func(t *testing.T) {
		d := deployment(completed)
		rs1, rs2, _ := history(d)
		assert.Nil(t, ReplicaSetToMark(d, []*appsv1.ReplicaSet{rs1, rs2}))
	})
}

func TestIsKnownGood(t *testing.T) {
	d := deployment()
	tests := []struct {
		name string
		rs   *appsv1.ReplicaSet
		want bool
	}{
		{name: "marked by the guard", rs: replicaSet(d, 2, "web:v2", knownGood), want: true},
		{name: "not marked", rs: replicaSet(d, 2, "web:v2"), want: false},
		{
			// kubectl rollout undo copied revision 1's mark onto the Deployment,
			// and the Deployment controller copied it onto revision 2.
			name: "mark copied from another ReplicaSet",
			rs: replicaSet(d, 2, "web:v2", func(rs *appsv1.ReplicaSet) {
				rs.Annotations[vocab.AnnotationKnownGood] = t0.Format(time.RFC3339)
				rs.Annotations[vocab.AnnotationKnownGoodHash] = "h1"
			}),
			want: false,
		},
		{name: "mark without hash", rs: replicaSet(d, 2, "web:v2", knownGood, func(rs *appsv1.ReplicaSet) {
			delete(rs.Annotations, vocab.AnnotationKnownGoodHash)
		}), want: false},
		{name: "mark that is not a time", rs: replicaSet(d, 2, "web:v2", knownGood, func(rs *appsv1.ReplicaSet) {
			rs.Annotations[vocab.AnnotationKnownGood] = "yes"
		}), want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, IsKnownGood(tt.rs))
		})
	}
}

func TestKnownGoodTarget(t *testing.T) {
	d := deployment()
	rs1 := replicaSet(d, 1, "web:v1", knownGood)
	rs2 := replicaSet(d, 2, "web:v2", knownGood)
	rs2bad := replicaSet(d, 2, "web:v2")
	rs4 := replicaSet(d, 4, "web:v4") // superseded before completing
	rs3 := replicaSet(d, 3, "web:v3")
	rs3good := replicaSet(d, 3, "web:v3", knownGood)
	rs2deleting := replicaSet(d, 2, "web:v2", knownGood, func(rs *appsv1.ReplicaSet) {
		rs.DeletionTimestamp = ptr.To(metav1.NewTime(t0))
	})
	rs2copied := replicaSet(d, 2, "web:v2", func(rs *appsv1.ReplicaSet) {
		rs.Annotations[vocab.AnnotationKnownGood] = t0.Format(time.RFC3339)
		rs.Annotations[vocab.AnnotationKnownGoodHash] = "h1"
	})

	tests := []struct {
		name string
		rss  []*appsv1.ReplicaSet
		want *appsv1.ReplicaSet
	}{
		{name: "newest known-good, not merely the previous revision", rss: []*appsv1.ReplicaSet{rs4, rs1, rs2, rs3}, want: rs2},
		{name: "the previous revision never completed", rss: []*appsv1.ReplicaSet{rs1, rs2bad, rs3}, want: rs1},
		{name: "none known-good", rss: []*appsv1.ReplicaSet{rs2bad, rs4, rs3}, want: nil},
		{name: "the newRS itself is never the target", rss: []*appsv1.ReplicaSet{rs3good}, want: nil},
		{name: "a ReplicaSet being deleted is skipped", rss: []*appsv1.ReplicaSet{rs1, rs2deleting, rs3}, want: rs1},
		{name: "a copied mark is no mark", rss: []*appsv1.ReplicaSet{rs1, rs2copied, rs3}, want: rs1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, KnownGoodTarget(d, tt.rss))
		})
	}
}
