package reconciler

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
)

// Rule 1: a known-good mark in annotations, forged on the failing ReplicaSet
// or copied there from the Deployment, makes nothing known-good: the guard
// rolls back to the ledger's newest entry, as without the mark.
func TestForgedKnownGoodMarksChangeNothing(t *testing.T) {
	forge := func(hash string) func(*appsv1.ReplicaSet) {
		return func(rs *appsv1.ReplicaSet) {
			rs.Annotations[vocab.LegacyAnnotationKnownGood] = t0.Format(time.RFC3339)
			rs.Annotations[vocab.LegacyAnnotationKnownGoodHash] = hash
		}
	}
	tests := []struct {
		name string
		// rss builds the Deployment's ReplicaSets and records its ledger.
		rss        func(d *appsv1.Deployment) []*appsv1.ReplicaSet
		wantTarget string
	}{
		{name: "on the failing newRS, naming its own pod-template-hash", wantTarget: "web-h2",
			rss: func(d *appsv1.Deployment) []*appsv1.ReplicaSet {
				rs1, rs2 := replicaSet(d, 1, "web:v1"), replicaSet(d, 2, "web:v2")
				withKnownGood(d, rs1, rs2)
				return []*appsv1.ReplicaSet{rs1, rs2, replicaSet(d, 3, "web:v3", forge("h3"))}
			}},
		{name: "copied from the Deployment (kubectl rollout undo), onto the newRS by the Deployment controller", wantTarget: "web-h2",
			rss: func(d *appsv1.Deployment) []*appsv1.ReplicaSet {
				rs1, rs2 := replicaSet(d, 1, "web:v1"), replicaSet(d, 2, "web:v2")
				withKnownGood(d, rs1, rs2)
				annotate(vocab.LegacyAnnotationKnownGood, t0.Format(time.RFC3339), vocab.LegacyAnnotationKnownGoodHash, "h2")(d)
				rs3 := replicaSet(d, 3, "web:v3")
				require.Equal(t, "h2", rs3.Annotations[vocab.LegacyAnnotationKnownGoodHash], "copied")
				return []*appsv1.ReplicaSet{rs1, rs2, rs3}
			}},
		{name: "on an older ReplicaSet that never completed", wantTarget: "web-h1",
			rss: func(d *appsv1.Deployment) []*appsv1.ReplicaSet {
				rs1 := replicaSet(d, 1, "web:v1")
				withKnownGood(d, rs1)
				return []*appsv1.ReplicaSet{rs1, replicaSet(d, 2, "web:v2", forge("h2")), replicaSet(d, 3, "web:v3")}
			}},
		{name: "on every ReplicaSet and the Deployment", wantTarget: "web-h2",
			rss: func(d *appsv1.Deployment) []*appsv1.ReplicaSet {
				rs1, rs2 := replicaSet(d, 1, "web:v1", forge("h1")), replicaSet(d, 2, "web:v2", forge("h2"))
				withKnownGood(d, rs1, rs2)
				annotate(vocab.LegacyAnnotationKnownGood, t0.Format(time.RFC3339), vocab.LegacyAnnotationKnownGoodHash, "h3")(d)
				return []*appsv1.ReplicaSet{rs1, rs2, replicaSet(d, 3, "web:v3", forge("h3")), replicaSet(d, 4, "web:v4", forge("h4"))}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := deployment(failed)
			rss := tt.rss(d)
			newRS := rollout.FindNewReplicaSet(d, rss)
			require.NotNil(t, newRS)
			assert.False(t, IsKnownGood(d, newRS), "the failing newRS is not known-good")

			dec := ShouldRollBack(d, rss, DefaultOptions())
			assert.Equal(t, ActionRollBack, dec.Action, dec.Message)
			assert.Equal(t, ReasonAutoRollback, dec.Reason, "not a rollback loop")
			require.NotNil(t, dec.Target)
			assert.Equal(t, tt.wantTarget, dec.Target.Name, "the ledger's entry")

			// The guard acts on it so, and records nothing of the mark.
			objs := []client.Object{namespace(nil), d}
			for _, rs := range rss {
				objs = append(objs, rs)
			}
			e := newEnv(t, objs...)
			require.NoError(t, e.reconcile())
			got := e.deployment()
			assert.Equal(t, *RollbackTemplate(dec.Target), got.Spec.Template)
			assert.Equal(t, []string{vocab.ReasonAnnotationsIgnored, vocab.ReasonAutoRollback}, eventReasons(e.events()), "the forged marks ignored, with a word")
			assert.NotContains(t, knownGoodNames(ledgerOf(t, got)), newRS.Name)
		})
	}
}

// Rule 2: only the ledger's newest known-good ReplicaSet is restored. When it
// is gone, being deleted, created again or changed (a tenant can do all of
// these), there is no target: the guard holds and says why, and never picks
// an older entry, which would let whoever deletes one ReplicaSet choose the
// template the guard restores.
func TestOnlyTheNewestKnownGoodIsRestored(t *testing.T) {
	tests := []struct {
		name string
		// newest is the newest known-good ReplicaSet as it is now; nil when
		// it is gone.
		newest  func(rs2 *appsv1.ReplicaSet) *appsv1.ReplicaSet
		wantWhy string
	}{
		{name: "deleted", newest: func(*appsv1.ReplicaSet) *appsv1.ReplicaSet { return nil },
			wantWhy: "known-good ReplicaSet web-h2 (revision 2) is gone"},
		{name: "being deleted", newest: func(rs *appsv1.ReplicaSet) *appsv1.ReplicaSet {
			rs.DeletionTimestamp = ptr.To(metav1.NewTime(t0.Add(15 * time.Minute)))
			rs.Finalizers = []string{"example.com/keep"}
			return rs
		}, wantWhy: "known-good ReplicaSet web-h2 (revision 2) is being deleted"},
		{name: "created again with another UID", newest: func(rs *appsv1.ReplicaSet) *appsv1.ReplicaSet {
			rs.UID = "uid-rs-h2-again"
			return rs
		}, wantWhy: "known-good ReplicaSet web-h2 (revision 2) was deleted and created again"},
		{name: "created again with another UID and an earlier release's mark", newest: func(rs *appsv1.ReplicaSet) *appsv1.ReplicaSet {
			rs.UID = "uid-rs-h2-again"
			legacyKnownGood(rs)
			return rs
		}, wantWhy: "known-good ReplicaSet web-h2 (revision 2) was deleted and created again"},
		{name: "its template edited", newest: func(rs *appsv1.ReplicaSet) *appsv1.ReplicaSet {
			rs.Spec.Template.Spec.Containers[0].Image = "evil:latest"
			return rs
		}, wantWhy: "the template of known-good ReplicaSet web-h2 (revision 2) changed since it completed"},
		{name: "its template edited, the cache's hash annotation forged", newest: func(rs *appsv1.ReplicaSet) *appsv1.ReplicaSet {
			good := vocab.TemplateHash(&rs.Spec.Template)
			rs.Spec.Template.Spec.Containers[0].Image = "evil:latest"
			rs.Spec.Template.Annotations[rollout.CachedTemplateHash] = good
			rs.Annotations[rollout.CachedTemplateHash] = good
			return rs
		}, wantWhy: "the template of known-good ReplicaSet web-h2 (revision 2) changed since it completed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := deployment(failed)
			rs1, rs2, rs3 := history(d)
			rss := []*appsv1.ReplicaSet{rs1, rs3}
			if rs := tt.newest(rs2.DeepCopy()); rs != nil {
				rss = append(rss, rs)
			}

			target, why := FindKnownGoodTarget(d, rss)
			assert.Nil(t, target, "not the older known-good revision")
			assert.Contains(t, why, tt.wantWhy)

			dec := ShouldRollBack(d, rss, DefaultOptions())
			assert.Equal(t, ActionHold, dec.Action)
			assert.Equal(t, ReasonNoKnownGoodRevision, dec.Reason)
			assert.Nil(t, dec.Target)
			assert.Contains(t, dec.Message, tt.wantWhy)
			assert.Contains(t, dec.Message, "the guard restores only the newest known-good revision")

			// On a cluster, read through the cache: held, told once, recorded.
			objs := []client.Object{namespace(nil), d}
			for _, rs := range rss {
				objs = append(objs, rs)
			}
			e := newEnv(t, objs...)
			require.NoError(t, e.reconcile())
			got := e.deployment()
			assert.Equal(t, "web:v3", got.Spec.Template.Spec.Containers[0].Image, "left as it is")
			assert.Contains(t, got.Annotations[vocab.AnnotationRollbackStatus], tt.wantWhy)
			reasons := eventReasons(e.events())
			assert.Equal(t, vocab.ReasonNoKnownGoodRevision, reasons[len(reasons)-1])
			if len(reasons) > 1 {
				// Where a mark was forged too: ignored, with a word.
				assert.Equal(t, []string{vocab.ReasonAnnotationsIgnored, vocab.ReasonNoKnownGoodRevision}, reasons)
			}
			l := ledgerOf(t, got)
			assert.Equal(t, t0.Add(20*time.Minute).Format(time.RFC3339), l.HandledDeadline)
			assert.Empty(t, l.RolledBackTo)
		})
	}
}

// Rule 3: the annotations in which an earlier release kept its decisions,
// written on a Deployment now (by a tenant, or copied by kubectl rollout
// undo), change no decision: each decision is the same as without them.
func TestForgedDecisionAnnotationsChangeNothing(t *testing.T) {
	deadline := t0.Add(20 * time.Minute).Format(time.RFC3339)
	forgeries := []struct {
		name string
		kv   []string
	}{
		{"fail-fast-revision", []string{vocab.LegacyAnnotationFailFastRevision, "3"}},
		{"handled-deadline", []string{vocab.LegacyAnnotationHandledDeadline, deadline}},
		{"rolled-back-revision", []string{vocab.LegacyAnnotationRolledBackRevision, "3"}},
		{"rolled-back-to", []string{vocab.LegacyAnnotationRolledBackTo, "web-h2"}},
		{"failing-since", []string{vocab.LegacyAnnotationFailingSince, t0.Format(time.RFC3339) + " web-h3"}},
		{"known-good-revision", []string{vocab.LegacyAnnotationKnownGoodRevision, "3"}},
		{"all of them", []string{
			vocab.LegacyAnnotationFailFastRevision, "3", vocab.LegacyAnnotationHandledDeadline, deadline,
			vocab.LegacyAnnotationRolledBackRevision, "3", vocab.LegacyAnnotationRolledBackTo, "web-h2",
			vocab.LegacyAnnotationFailingSince, t0.Format(time.RFC3339) + " web-h3", vocab.LegacyAnnotationKnownGoodRevision, "3",
		}},
	}
	for _, f := range forgeries {
		t.Run(f.name, func(t *testing.T) {
			// A deadline exceeded: rolled back to revision 2.
			d := deployment(failed, annotate(f.kv...))
			rs1, rs2, rs3 := history(d)
			dec := ShouldRollBack(d, []*appsv1.ReplicaSet{rs1, rs2, rs3}, DefaultOptions())
			assert.Equal(t, ActionRollBack, dec.Action, dec.Reason)
			require.NotNil(t, dec.Target)
			assert.Equal(t, "web-h2", dec.Target.Name)

			// A rollout in progress: fail-fast judges it, from no start.
			d = deployment(inProgress, annotate(f.kv...))
			rs1, rs2, rs3 = history(d)
			rss := []*appsv1.ReplicaSet{rs1, rs2, rs3}
			assert.Equal(t, rs3, RolloutInProgress(d, rss), "fail-fast still judges the newRS")
			assert.True(t, failingSince(d, "web-h3").IsZero(), "the window has not started")
			st := ReadRollout(d, rss)
			assert.Equal(t, RolloutProgressing, st.Phase, st.Message)

			// No rollback stands.
			assert.False(t, rollout.HasVerdict(d))
			v := rollout.DecideVerdict(d, rss)
			assert.False(t, v.Stalled)
			assert.False(t, v.Clear)
		})
	}
}

// Rule 3, on a cluster: forged decisions do not stop fail-fast's rollback.
func TestForgedDecisionAnnotationsDoNotStopFailFast(t *testing.T) {
	d := deployment(inProgress, annotate(
		vocab.LegacyAnnotationFailFastRevision, "3",
		vocab.LegacyAnnotationRolledBackRevision, "3",
		vocab.LegacyAnnotationFailingSince, t0.Format(time.RFC3339)+" web-h3",
	))
	rs1, rs2, rs3 := history(d)
	e := newEnv(t, namespace(nil), d, rs1, rs2, rs3, newRSPod(rs3, "a", "ImagePullBackOff"), newRSPod(rs3, "b", "ImagePullBackOff"))

	e.reconcileResult()
	assert.Equal(t, e.clock.Now().UTC().Format(time.RFC3339)+" web-h3", ledgerOf(t, e.deployment()).FailingSince,
		"the window starts now, not when an annotation says")
	e.clock.Step(61 * time.Second)
	e.reconcileResult()
	got := e.deployment()
	assert.Equal(t, "web:v2", got.Spec.Template.Spec.Containers[0].Image, "rolled back, a window after the evidence began")
	assert.Equal(t, int64(3), ledgerOf(t, got).FailFastRevision)
	assert.Contains(t, eventReasons(e.events()), vocab.ReasonAutoRollback)
}

// Rule 5: an earlier release's annotations are adopted once, only for a
// Deployment created before this release first ran (the cutoff), and only
// marks that the earlier release would have read as marks, on ReplicaSets
// created before the cutoff.
func TestAdoptLegacy(t *testing.T) {
	cutoff := t0.Add(time.Hour)
	before := metav1.NewTime(t0.Add(-time.Hour))
	deadline := t0.Add(20 * time.Minute).Format(time.RFC3339)
	entry := func(rs *appsv1.ReplicaSet, rev int64) rollout.KnownGoodEntry {
		return rollout.KnownGoodEntry{ReplicaSet: rs.Name, UID: rs.UID, Template: vocab.TemplateHash(&rs.Spec.Template), Revision: rev, At: t0.Format(time.RFC3339)}
	}
	decisions := annotate(
		vocab.LegacyAnnotationRolledBackRevision, "3",
		vocab.LegacyAnnotationRolledBackTo, "web-h2",
		vocab.LegacyAnnotationFailFastRevision, "3",
		vocab.LegacyAnnotationHandledDeadline, deadline,
		vocab.LegacyAnnotationFailingSince, "2026-03-01T12:10:00Z web-h3",
	)
	tests := []struct {
		name    string
		created metav1.Time
		cutoff  time.Time
		mods    []func(*appsv1.Deployment)
		rss     func(d *appsv1.Deployment) []*appsv1.ReplicaSet
		wantOK  bool
		want    func(rss []*appsv1.ReplicaSet) rollout.Ledger
	}{
		{name: "no cutoff: nothing", created: before, mods: []func(*appsv1.Deployment){decisions},
			rss: func(d *appsv1.Deployment) []*appsv1.ReplicaSet {
				return []*appsv1.ReplicaSet{replicaSet(d, 1, "web:v1", legacyKnownGood)}
			}},
		{name: "created after the cutoff: nothing", created: metav1.NewTime(cutoff.Add(time.Minute)), cutoff: cutoff, mods: []func(*appsv1.Deployment){decisions},
			rss: func(d *appsv1.Deployment) []*appsv1.ReplicaSet {
				return []*appsv1.ReplicaSet{replicaSet(d, 1, "web:v1", legacyKnownGood)}
			}},
		{name: "created at the cutoff: nothing", created: metav1.NewTime(cutoff), cutoff: cutoff, mods: []func(*appsv1.Deployment){decisions},
			rss: func(d *appsv1.Deployment) []*appsv1.ReplicaSet {
				return []*appsv1.ReplicaSet{replicaSet(d, 1, "web:v1", legacyKnownGood)}
			}},
		{name: "created before, nothing to adopt: an empty ledger", created: before, cutoff: cutoff, wantOK: true,
			rss: func(d *appsv1.Deployment) []*appsv1.ReplicaSet {
				return []*appsv1.ReplicaSet{replicaSet(d, 1, "web:v1")}
			},
			want: func([]*appsv1.ReplicaSet) rollout.Ledger { return rollout.Ledger{} }},
		{name: "created before: marks by revision, oldest first, and the decisions", created: before, cutoff: cutoff, wantOK: true,
			mods: []func(*appsv1.Deployment){decisions},
			rss: func(d *appsv1.Deployment) []*appsv1.ReplicaSet {
				return []*appsv1.ReplicaSet{replicaSet(d, 2, "web:v2", legacyKnownGood), replicaSet(d, 1, "web:v1", legacyKnownGood), replicaSet(d, 3, "web:v3")}
			},
			want: func(rss []*appsv1.ReplicaSet) rollout.Ledger {
				return rollout.Ledger{KnownGood: []rollout.KnownGoodEntry{entry(rss[1], 1), entry(rss[0], 2)},
					RolledBackRevision: 3, RolledBackTo: "web-h2", FailFastRevision: 3, HandledDeadline: deadline, FailingSince: "2026-03-01T12:10:00Z web-h3"}
			}},
		{name: "a mark copied from another ReplicaSet is no mark", created: before, cutoff: cutoff, wantOK: true,
			rss: func(d *appsv1.Deployment) []*appsv1.ReplicaSet {
				return []*appsv1.ReplicaSet{replicaSet(d, 1, "web:v1", legacyKnownGood), replicaSet(d, 2, "web:v2", func(rs *appsv1.ReplicaSet) {
					rs.Annotations[vocab.LegacyAnnotationKnownGood] = t0.Format(time.RFC3339)
					rs.Annotations[vocab.LegacyAnnotationKnownGoodHash] = "h1"
				})}
			},
			want: func(rss []*appsv1.ReplicaSet) rollout.Ledger {
				return rollout.Ledger{KnownGood: []rollout.KnownGoodEntry{entry(rss[0], 1)}}
			}},
		{name: "a mark on a ReplicaSet created after the cutoff is no mark", created: before, cutoff: cutoff, wantOK: true,
			rss: func(d *appsv1.Deployment) []*appsv1.ReplicaSet {
				return []*appsv1.ReplicaSet{replicaSet(d, 1, "web:v1", legacyKnownGood), replicaSet(d, 2, "web:v2", legacyKnownGood, func(rs *appsv1.ReplicaSet) {
					rs.CreationTimestamp = metav1.NewTime(cutoff.Add(time.Second))
				})}
			},
			want: func(rss []*appsv1.ReplicaSet) rollout.Ledger {
				return rollout.Ledger{KnownGood: []rollout.KnownGoodEntry{entry(rss[0], 1)}}
			}},
		{name: "a mark that is not a time, or without its hash, is no mark", created: before, cutoff: cutoff, wantOK: true,
			rss: func(d *appsv1.Deployment) []*appsv1.ReplicaSet {
				return []*appsv1.ReplicaSet{
					replicaSet(d, 1, "web:v1", legacyKnownGood, func(rs *appsv1.ReplicaSet) { rs.Annotations[vocab.LegacyAnnotationKnownGood] = "yes" }),
					replicaSet(d, 2, "web:v2", legacyKnownGood, func(rs *appsv1.ReplicaSet) { delete(rs.Annotations, vocab.LegacyAnnotationKnownGoodHash) }),
				}
			},
			want: func([]*appsv1.ReplicaSet) rollout.Ledger { return rollout.Ledger{} }},
		{name: "decisions that do not read are not adopted", created: before, cutoff: cutoff, wantOK: true,
			mods: []func(*appsv1.Deployment){annotate(
				vocab.LegacyAnnotationRolledBackRevision, "three",
				vocab.LegacyAnnotationHandledDeadline, "soon",
				vocab.LegacyAnnotationFailingSince, "web-h3",
			)},
			rss:  func(*appsv1.Deployment) []*appsv1.ReplicaSet { return nil },
			want: func([]*appsv1.ReplicaSet) rollout.Ledger { return rollout.Ledger{} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := deployment(tt.mods...)
			d.CreationTimestamp = tt.created
			rss := tt.rss(d)
			got, ok := AdoptLegacy(d, rss, tt.cutoff)
			assert.Equal(t, tt.wantOK, ok)
			if !tt.wantOK {
				assert.Equal(t, rollout.Ledger{}, got)
				return
			}
			assert.Equal(t, tt.want(rss), got)
		})
	}
}

// Rule 5, on a cluster: the first reconcile of a Deployment created before
// the cutoff writes its adopted ledger, once; annotations written after that
// are never read.
func TestLedgerAdoptedOnce(t *testing.T) {
	cutoff := t0.Add(time.Hour)
	tests := []struct {
		name    string
		created time.Time
		ledger  bool // a ledger, unreadable, is there already
		want    []string
	}{
		{name: "created before the cutoff", created: t0.Add(-time.Hour), want: []string{"web-h1", "web-h2"}},
		{name: "created after the cutoff", created: cutoff.Add(time.Minute)},
		{name: "a ledger there already, though unreadable", created: t0.Add(-time.Hour), ledger: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := deployment(failed, annotate(vocab.LegacyAnnotationRolledBackRevision, "3", vocab.LegacyAnnotationHandledDeadline, t0.Add(20*time.Minute).Format(time.RFC3339)))
			d.CreationTimestamp = metav1.NewTime(tt.created)
			if tt.ledger {
				rollout.SetLedger(&d.Status, rollout.Ledger{}, t0)
				d.Status.Conditions[len(d.Status.Conditions)-1].Message = "{"
			}
			rs1 := replicaSet(d, 1, "web:v1", legacyKnownGood)
			rs2 := replicaSet(d, 2, "web:v2", legacyKnownGood)
			rs3 := replicaSet(d, 3, "web:v3")
			e := newEnv(t, namespace(nil), d, rs1, rs2, rs3)
			e.r.Options.LegacyCutoff = cutoff

			require.NoError(t, e.reconcile())
			got := e.deployment()
			l, _ := rollout.ReadLedger(got)
			assert.Equal(t, tt.want, knownGoodNames(l))
			assert.Equal(t, "web:v3", got.Spec.Template.Spec.Containers[0].Image)
			if tt.want != nil {
				assert.Equal(t, int64(3), l.RolledBackRevision, "adopted: the failed revision was rolled back from already")
				assert.Empty(t, e.events(), "and its deadline handled")
			} else {
				assert.Empty(t, l.RolledBackRevision)
				reasons := eventReasons(e.events())
				assert.Contains(t, reasons, vocab.ReasonNoKnownGoodRevision, "no mark adopted, so no known-good revision")
				assert.NotContains(t, reasons, vocab.ReasonAutoRollback)
			}

			// A tenant writes the earlier release's annotations now.
			got.Annotations[vocab.LegacyAnnotationFailFastRevision] = "9"
			got.Annotations[vocab.LegacyAnnotationRolledBackRevision] = "9"
			require.NoError(t, e.client.Update(context.Background(), got))
			before, _ := rollout.ReadLedger(e.deployment())
			require.NoError(t, e.reconcile())
			after, _ := rollout.ReadLedger(e.deployment())
			assert.True(t, after.IgnoredTold, "the annotations ignored, with a word")
			after.IgnoredTold = before.IgnoredTold
			assert.Equal(t, before, after, "never adopted again")
			writes := e.writeCount()
			require.NoError(t, e.reconcile())
			assert.Equal(t, writes, e.writeCount(), "nothing written again")
		})
	}
}

// Rule 6: kubectl rollout undo copies a ReplicaSet's annotations, an earlier
// release's known-good mark with them, onto the Deployment; the restored
// ReplicaSet becomes the newRS at a new revision and completes. The ledger is
// written once, and a second reconcile of the same objects writes nothing.
func TestRolloutUndoRecordsKnownGoodOnce(t *testing.T) {
	cutoff := t0.Add(time.Hour)
	tests := []struct {
		name      string
		created   time.Time
		cutoff    time.Time
		wantNames []string
	}{
		{name: "no earlier release", created: t0.Add(-time.Hour), wantNames: []string{"web-h1"}},
		{name: "an earlier release's marks adopted", created: t0.Add(-time.Hour), cutoff: cutoff, wantNames: []string{"web-h2", "web-h1"}},
		{name: "created after the cutoff: the marks copied onto it are not adopted", created: cutoff.Add(time.Minute), cutoff: cutoff,
			wantNames: []string{"web-h1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := deployment()
			d.CreationTimestamp = metav1.NewTime(tt.created)
			rs1 := replicaSet(d, 1, "web:v1", legacyKnownGood, func(rs *appsv1.ReplicaSet) {
				rs.CreationTimestamp = metav1.NewTime(tt.created.Add(time.Minute))
				rs.Annotations["kubernetes.io/change-cause"] = "deploy v1"
			})
			rs2 := replicaSet(d, 2, "web:v2", legacyKnownGood, func(rs *appsv1.ReplicaSet) {
				rs.CreationTimestamp = metav1.NewTime(tt.created.Add(2 * time.Minute))
			})
			// kubectl rollout undo --to-revision=1: rs1's template, and its
			// annotations but for those kubectl keeps from the Deployment.
			d.Spec.Template = *RollbackTemplate(rs1)
			undone := map[string]string{}
			for k, v := range d.Annotations {
				if annotationsToSkip[k] {
					undone[k] = v
				}
			}
			for k, v := range rs1.Annotations {
				if !annotationsToSkip[k] {
					undone[k] = v
				}
			}
			d.Annotations = undone
			require.Equal(t, "h1", d.Annotations[vocab.LegacyAnnotationKnownGoodHash], "the mark came with the undo")
			// The Deployment controller adopts rs1 as the newRS at revision 3,
			// and the rollout completes.
			d.Annotations[vocab.RevisionAnnotation] = "3"
			rs1.Annotations[vocab.RevisionAnnotation] = "3"
			completed(d)

			e := newEnv(t, namespace(nil), d, rs1, rs2)
			e.r.Options.LegacyCutoff = tt.cutoff
			require.NoError(t, e.reconcile())

			got := e.deployment()
			l := ledgerOf(t, got)
			assert.Equal(t, tt.wantNames, knownGoodNames(l))
			require.NotNil(t, l.Newest())
			assert.Equal(t, int64(3), l.Newest().Revision, "the newRS at its new revision")
			assert.Equal(t, rs1.UID, l.Newest().UID)
			assert.Len(t, e.statusPatches, 1, "the ledger written once")
			assert.Empty(t, e.patches, "no annotation written on the Deployment or its ReplicaSets")
			assert.Equal(t, d.Annotations, got.Annotations)

			// The marks the undo carried are ignored, and said so once.
			e.events()
			writes := e.writeCount()
			require.NoError(t, e.reconcile())
			assert.Equal(t, writes+1, e.writeCount(), "the one time the guard says it ignores the copied marks")
			told := e.events()
			require.Len(t, told, 1)
			assert.Contains(t, told[0], vocab.ReasonAnnotationsIgnored)
			assert.Contains(t, told[0], vocab.LegacyAnnotationKnownGoodHash)
			l.IgnoredTold = true
			assert.Equal(t, l, ledgerOf(t, e.deployment()))

			writes = e.writeCount()
			require.NoError(t, e.reconcile())
			assert.Equal(t, writes, e.writeCount(), "the same objects again: nothing written")
			assert.Empty(t, e.events(), "nor said again")
			assert.Equal(t, l, ledgerOf(t, e.deployment()))
		})
	}
}

// The known-good revision the guard restored becomes the newRS at a new
// revision; once it completes, the ledger's newest entry says so (deployguard
// status shows it), once.
func TestRestoredKnownGoodRecordedAtItsNewRevision(t *testing.T) {
	d := deployment(completed, func(d *appsv1.Deployment) {
		d.Spec.Template = podTemplate("web:v2")
		d.Annotations[vocab.RevisionAnnotation] = "4"
	})
	rs1, rs2, rs3 := history(d)
	withLedger(func(l *rollout.Ledger) { l.RolledBackRevision, l.RolledBackTo = 3, "web-h2" })(d)
	rs2.Annotations[vocab.RevisionAnnotation] = "4"
	e := newEnv(t, namespace(nil), d, rs1, rs2, rs3)

	require.NoError(t, e.reconcile())
	l := ledgerOf(t, e.deployment())
	assert.Equal(t, []string{"web-h1", "web-h2"}, knownGoodNames(l))
	assert.Equal(t, int64(4), l.Newest().Revision)
	assert.Equal(t, "web-h2", l.RolledBackTo, "the rollback still stands")

	writes := e.writeCount()
	require.NoError(t, e.reconcile())
	assert.Equal(t, writes, e.writeCount())
}

// A guard stopped between the report of a rollback (which records it as
// pending) and its settlement: the next pass settles it as made when the
// Deployment runs the restored template, and otherwise drops it and decides
// again, rolling back once.
func TestPendingRollbackSettledAfterARestart(t *testing.T) {
	restored := vocab.TemplateHash(&deployment(func(d *appsv1.Deployment) { d.Spec.Template = podTemplate("web:v2") }).Spec.Template)
	pending := rollout.PendingRollback{FailedRevision: 3, To: "web-h2", Template: restored, Deadline: t0.Add(20 * time.Minute).Format(time.RFC3339)}
	tests := []struct {
		name string
		// made: the rollback's write landed before the guard stopped.
		made bool
	}{
		{name: "the template was restored: settled as made", made: true},
		{name: "the template was not restored: dropped, decided again", made: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := deployment(failed, func(d *appsv1.Deployment) {
				d.Status.Conditions = append(d.Status.Conditions, appsv1.DeploymentCondition{Type: vocab.ConditionStalled, Status: "True",
					Reason: vocab.ReasonAutoRollback, Message: rollout.StalledMessage(d, "", "3")})
				if tt.made {
					d.Spec.Template = podTemplate("web:v2")
					d.Generation = 4 // not observed yet
				}
			})
			rs1, rs2, rs3 := history(d)
			withLedger(func(l *rollout.Ledger) { l.Pending = &pending })(d)
			e := newEnv(t, namespace(nil), d, rs1, rs2, rs3)

			require.NoError(t, e.reconcile())

			got := e.deployment()
			l := ledgerOf(t, got)
			assert.Nil(t, l.Pending, "settled")
			assert.Equal(t, int64(3), l.RolledBackRevision)
			assert.Equal(t, "web-h2", l.RolledBackTo)
			assert.Equal(t, restored, l.RolledBackToTemplate)
			assert.Equal(t, pending.Deadline, l.HandledDeadline)
			assert.Equal(t, "web:v2", got.Spec.Template.Spec.Containers[0].Image)
			require.NotNil(t, rollout.GuardStalled(&got.Status), "the rollback reads as failed")
			if tt.made {
				assert.Empty(t, e.events(), "not rolled back twice")
				assert.Zero(t, e.rollbacks(resultRolledBack))
			} else {
				assert.Equal(t, []string{vocab.ReasonAutoRollback}, eventReasons(e.events()), "rolled back once")
				assert.Equal(t, 1.0, e.rollbacks(resultRolledBack))
			}

			writes := e.writeCount()
			require.NoError(t, e.reconcile())
			assert.Equal(t, writes, e.writeCount())
		})
	}
}
