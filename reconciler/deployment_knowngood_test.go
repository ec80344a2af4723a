package reconciler

import (
	"testing"

	"github.com/stretchr/testify/assert"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/deployguard/deployguard/reconciler/rollout"
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

// A ReplicaSet is known-good when the Deployment's ledger records it: the
// same ReplicaSet (name and UID) with the same template. Nothing on the
// ReplicaSet itself counts.
func TestIsKnownGood(t *testing.T) {
	tests := []struct {
		name string
		// rs is the ReplicaSet as the guard recorded it; now is it as read.
		rs, now  func(d *appsv1.Deployment) *appsv1.ReplicaSet
		recorded bool
		want     bool
	}{
		{name: "recorded by the guard", recorded: true, want: true},
		{name: "recorded, read from the cache (template stripped)", recorded: true, want: true,
			now: func(d *appsv1.Deployment) *appsv1.ReplicaSet { return cachedCopy(replicaSet(d, 2, "web:v2")) }},
		{name: "not recorded", want: false},
		{name: "not recorded, an earlier release's mark on it (or a forged one)", want: false,
			now: func(d *appsv1.Deployment) *appsv1.ReplicaSet { return replicaSet(d, 2, "web:v2", legacyKnownGood) }},
		{name: "recorded, deleted and created again by the same name", recorded: true, want: false,
			now: func(d *appsv1.Deployment) *appsv1.ReplicaSet {
				return replicaSet(d, 2, "web:v2", func(rs *appsv1.ReplicaSet) { rs.UID = "uid-rs-h2-again" })
			}},
		{name: "recorded, its template changed since", recorded: true, want: false,
			now: func(d *appsv1.Deployment) *appsv1.ReplicaSet {
				return replicaSet(d, 2, "web:v2", func(rs *appsv1.ReplicaSet) { rs.Spec.Template.Spec.Containers[0].Image = "web:evil" })
			}},
		{name: "recorded, template changed and the cache's hash annotation forged on it", recorded: true, want: false,
			now: func(d *appsv1.Deployment) *appsv1.ReplicaSet {
				good := vocab.TemplateHash(&replicaSet(d, 2, "web:v2").Spec.Template)
				return replicaSet(d, 2, "web:v2", func(rs *appsv1.ReplicaSet) {
					rs.Spec.Template.Spec.Containers[0].Image = "web:evil"
					rs.Spec.Template.Annotations[rollout.CachedTemplateHash] = good
					rs.Annotations[rollout.CachedTemplateHash] = good
				})
			}},
		{name: "recorded, template changed and the cache's hash forged as the template's name", recorded: true, want: false,
			now: func(d *appsv1.Deployment) *appsv1.ReplicaSet {
				good := vocab.TemplateHash(&replicaSet(d, 2, "web:v2").Spec.Template)
				return replicaSet(d, 2, "web:v2", func(rs *appsv1.ReplicaSet) {
					rs.Spec.Template.Spec.Containers[0].Image = "web:evil"
					rs.Spec.Template.Name = rollout.CachedTemplateHash + "=" + good
				})
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := deployment()
			if tt.recorded {
				withKnownGood(d, replicaSet(d, 2, "web:v2"))
			}
			rs := replicaSet(d, 2, "web:v2")
			if tt.now != nil {
				rs = tt.now(d)
			}
			assert.Equal(t, tt.want, IsKnownGood(d, rs))
		})
	}
}

// cachedCopy is rs as the manager's cache holds it.
func cachedCopy(rs *appsv1.ReplicaSet) *appsv1.ReplicaSet {
	c := rs.DeepCopy()
	if _, err := StripForCache(c); err != nil {
		panic(err)
	}
	return c
}

// The target is the ReplicaSet of the ledger's newest known-good entry; when
// that entry's template is the Deployment's already, or its ReplicaSet is gone,
// being deleted, replaced or changed, there is none, and the reason says why:
// never an older entry.
func TestFindKnownGoodTarget(t *testing.T) {
	d := deployment()
	rs1 := replicaSet(d, 1, "web:v1")
	rs2 := replicaSet(d, 2, "web:v2")
	rs3 := replicaSet(d, 3, "web:v3")
	rs4 := replicaSet(d, 4, "web:v4") // superseded before completing
	rs2deleting := replicaSet(d, 2, "web:v2", func(rs *appsv1.ReplicaSet) { rs.DeletionTimestamp = ptr.To(metav1.NewTime(t0)) })
	rs2again := replicaSet(d, 2, "web:v2", func(rs *appsv1.ReplicaSet) { rs.UID = "uid-rs-h2-again" })
	rs2edited := replicaSet(d, 2, "web:v2", func(rs *appsv1.ReplicaSet) { rs.Spec.Template.Spec.Containers[0].Image = "web:evil" })
	rs2forged := replicaSet(d, 2, "web:v2", legacyKnownGood)
	rs3again := replicaSet(d, 3, "web:v3", func(rs *appsv1.ReplicaSet) { rs.UID = "uid-rs-h3-again" })

	tests := []struct {
		name      string
		knownGood []*appsv1.ReplicaSet // the ledger's entries, oldest first
		rss       []*appsv1.ReplicaSet
		want      *appsv1.ReplicaSet
		wantWhy   string
	}{
		{name: "newest known-good, not merely the previous revision", knownGood: []*appsv1.ReplicaSet{rs1, rs2},
			rss: []*appsv1.ReplicaSet{rs4, rs1, rs2, rs3}, want: rs2},
		{name: "the previous revision never completed", knownGood: []*appsv1.ReplicaSet{rs1},
			rss: []*appsv1.ReplicaSet{rs1, rs2, rs3}, want: rs1},
		{name: "the newest read from the cache", knownGood: []*appsv1.ReplicaSet{rs1, rs2},
			rss: []*appsv1.ReplicaSet{rs1, cachedCopy(rs2), rs3}, want: cachedCopy(rs2)},
		{name: "no ledger", rss: []*appsv1.ReplicaSet{rs1, rs2, rs4, rs3}},
		{name: "an earlier release's (or a forged) mark is no entry", knownGood: []*appsv1.ReplicaSet{rs1},
			rss: []*appsv1.ReplicaSet{rs1, rs2forged, rs3}, want: rs1},
		{name: "the newRS itself is never the target", knownGood: []*appsv1.ReplicaSet{rs3}, rss: []*appsv1.ReplicaSet{rs3},
			wantWhy: "the Deployment's template is already that of the newest known-good ReplicaSet web-h3 (revision 3), and the guard never falls back to an older one"},
		// The newest known-good revision failing now: nothing, not the
		// older entry (a tenant who writes the template back to the newest
		// one's, or deletes its ReplicaSet for the Deployment controller to
		// make again, would otherwise choose an older template).
		{name: "the newest entry has the current template: none, not an older one", knownGood: []*appsv1.ReplicaSet{rs1, rs3},
			rss:     []*appsv1.ReplicaSet{rs1, rs3},
			wantWhy: "the Deployment's template is already that of the newest known-good ReplicaSet web-h3 (revision 3), and the guard never falls back to an older one"},
		{name: "the newest entry's ReplicaSet made again with the current template: none, not an older one", knownGood: []*appsv1.ReplicaSet{rs1, rs3},
			rss:     []*appsv1.ReplicaSet{rs1, rs3again},
			wantWhy: "the Deployment's template is already that of the newest known-good ReplicaSet web-h3 (revision 3), and the guard never falls back to an older one"},
		{name: "the newest being deleted: none, not an older one", knownGood: []*appsv1.ReplicaSet{rs1, rs2},
			rss: []*appsv1.ReplicaSet{rs1, rs2deleting, rs3}, wantWhy: "known-good ReplicaSet web-h2 (revision 2) is being deleted"},
		{name: "the newest gone: none, not an older one", knownGood: []*appsv1.ReplicaSet{rs1, rs2},
			rss: []*appsv1.ReplicaSet{rs1, rs3}, wantWhy: "known-good ReplicaSet web-h2 (revision 2) is gone"},
		{name: "the newest created again by its name: none", knownGood: []*appsv1.ReplicaSet{rs1, rs2},
			rss: []*appsv1.ReplicaSet{rs1, rs2again, rs3}, wantWhy: "known-good ReplicaSet web-h2 (revision 2) was deleted and created again since it completed"},
		{name: "the newest's template changed: none", knownGood: []*appsv1.ReplicaSet{rs1, rs2},
			rss: []*appsv1.ReplicaSet{rs1, rs2edited, rs3}, wantWhy: "the template of known-good ReplicaSet web-h2 (revision 2) changed since it completed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := d.DeepCopy()
			if tt.knownGood != nil {
				withKnownGood(d, tt.knownGood...)
			}
			got, why := FindKnownGoodTarget(d, tt.rss)
			assert.Equal(t, tt.want, got)
			assert.Equal(t, tt.wantWhy, why)
			assert.Equal(t, tt.want, KnownGoodTarget(d, tt.rss))
		})
	}
}
