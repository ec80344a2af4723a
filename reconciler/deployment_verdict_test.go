package reconciler

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
)

// rolledBack gives d the state the guard's rollback from revision 3 to the
// ReplicaSet of revision 2 leaves: its template, the rollback in its ledger
// (the restored ReplicaSet and its template's hash) and its message in an
// annotation.
func rolledBack(d *appsv1.Deployment) {
	d.Spec.Template = podTemplate("web:v2")
	withLedger(func(l *rollout.Ledger) {
		l.RolledBackRevision, l.RolledBackTo, l.RolledBackToTemplate = 3, "web-h2", vocab.TemplateHash(&d.Spec.Template)
	})(d)
	d.Annotations[vocab.AnnotationRollbackStatus] = "Rolled back from revision 3 (ReplicaSet web-h3): 2/2 new pods ImagePullBackOff for 1m0s (container web, image web:v3), to known-good revision 2 (ReplicaSet web-h2)."
}

func TestDecideVerdict(t *testing.T) {
	adopted := withLedger(func(l *rollout.Ledger) { l.RolledBackToTemplate = "" })
	tests := []struct {
		name        string
		d           *appsv1.Deployment
		wantStalled bool
		wantClear   bool
	}{
		{name: "never rolled back", d: deployment()},
		{name: "rolled back, running the restored revision", d: deployment(rolledBack), wantStalled: true},
		{name: "rolled back, paused", d: deployment(rolledBack, paused), wantStalled: true},
		{name: "accepted", d: deployment(rolledBack, annotate(vocab.AnnotationAcceptRollback, "3")), wantClear: true},
		{name: "an earlier rollback accepted, not this one", d: deployment(rolledBack, annotate(vocab.AnnotationAcceptRollback, "1")), wantStalled: true},
		{name: "a new template applied", d: deployment(rolledBack, func(d *appsv1.Deployment) { d.Spec.Template = podTemplate("web:v4") }), wantClear: true},
		{name: "the failed template applied again (quarantine let it through)", d: deployment(rolledBack, func(d *appsv1.Deployment) { d.Spec.Template = podTemplate("web:v3") }), wantClear: true},
		{name: "the restored ReplicaSet is gone, its template still running", d: deployment(rolledBack, withLedger(func(l *rollout.Ledger) { l.RolledBackTo = "web-gone" })), wantStalled: true},
		// A rollback adopted from an earlier release names only the
		// ReplicaSet it restored: the verdict reads it.
		{name: "adopted, running the restored ReplicaSet's template", d: deployment(rolledBack, adopted), wantStalled: true},
		{name: "adopted, a new template applied", d: deployment(rolledBack, adopted, func(d *appsv1.Deployment) { d.Spec.Template = podTemplate("web:v4") }), wantClear: true},
		{name: "adopted, the restored ReplicaSet is gone", d: deployment(rolledBack, adopted, withLedger(func(l *rollout.Ledger) { l.RolledBackTo = "web-gone" })), wantClear: true},
		{name: "a rollback told only by annotations (forged, or an earlier release's copied on)", d: deployment(func(d *appsv1.Deployment) {
			d.Spec.Template = podTemplate("web:v2")
		}, annotate(vocab.LegacyAnnotationRolledBackRevision, "3", vocab.LegacyAnnotationRolledBackTo, "web-h2"))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rs1, rs2, rs3 := history(tt.d)
			got := rollout.DecideVerdict(tt.d, []*appsv1.ReplicaSet{rs1, rs2, rs3})
			assert.Equal(t, tt.wantStalled, got.Stalled)
			assert.Equal(t, tt.wantClear, got.Clear)
			if tt.wantStalled {
				assert.Contains(t, got.Message, "Rolled back from revision 3 (ReplicaSet web-h3): 2/2 new pods ImagePullBackOff")
				assert.Contains(t, got.Message, "Revision 3 is not running.")
				assert.Contains(t, got.Message, "kubectl annotate deployment -n shop web deployguard.io/accept-rollback=3", "the message says how to end it")
			}
		})
	}
}

// stalled returns the guard's Stalled condition of the stored Deployment.
func (e *env) stalled() *appsv1.DeploymentCondition {
	e.t.Helper()
	d := e.deployment()
	return rollout.GuardStalled(&d.Status)
}

func progressing(d *appsv1.Deployment) *appsv1.DeploymentCondition {
	return rollout.ProgressingCondition(d)
}

// Fail-fast declares the revision failed in upstream's words before it rolls
// back, so that a client watching the rollout sees the failure first; after
// the rollback the Deployment keeps reading as failed.
func TestFailFastDeclaresThenRollsBackThenReports(t *testing.T) {
	d := deployment(inProgress, withLedger(func(l *rollout.Ledger) { l.FailingSince = rollout.FailingSinceValue(t0.Add(19*time.Minute), "web-h3") }))
	rs1, rs2, rs3 := history(d)
	e := newEnv(t, namespace(nil), d, rs1, rs2, rs3,
		newRSPod(rs3, "web-h3-a", "ImagePullBackOff"), newRSPod(rs3, "web-h3-b", "ImagePullBackOff"))

	e.reconcileResult()
	require.Equal(t, []string{"Deployment/status", "Deployment/status", "Deployment", "Deployment/status"}, e.sequence,
		"declared failed, then the rollback reported, then the rollback, then the ledger: no client can read the restored template without the report")
	reported := e.statusPatches[1].body["status"].(map[string]any)["conditions"].([]any)
	assert.Contains(t, fmt.Sprint(reported), "Stalled")

	declared := e.statusPatches[0].body["status"].(map[string]any)["conditions"].([]any)
	var cond map[string]any
	for _, c := range declared {
		if c.(map[string]any)["type"] == "Progressing" {
			cond = c.(map[string]any)
		}
	}
	require.NotNil(t, cond)
	assert.Equal(t, "False", cond["status"])
	assert.Equal(t, vocab.ProgressDeadlineExceeded, cond["reason"], "the failure language kubectl, kstatus and Argo CD read")
	assert.Equal(t, `ReplicaSet "web-h3" has failed progressing: 2/2 new pods ImagePullBackOff for 1m0s (container web, image web:v3).`, cond["message"])
	assert.NotEmpty(t, e.statusPatches[0].body["metadata"].(map[string]any)["resourceVersion"], "conditional on the version read")

	got := e.deployment()
	assert.Equal(t, "web:v2", got.Spec.Template.Spec.Containers[0].Image)
	l := ledgerOf(t, got)
	assert.Equal(t, int64(3), l.FailFastRevision, "recorded as fail-fast's decision")
	assert.Equal(t, "web-h2", l.RolledBackTo)
	assert.Empty(t, l.FailingSince)
	evs := e.events()
	assert.Equal(t, []string{vocab.ReasonAutoRollback}, eventReasons(evs))
	assert.Contains(t, evs[0], "Rolled back from revision 3 (ReplicaSet web-h3): 2/2 new pods ImagePullBackOff for 1m0s (container web, image web:v3), to known-good revision 2 (ReplicaSet web-h2).")

	st := rollout.GuardStalled(&got.Status)
	require.NotNil(t, st, "the Deployment reads as failed after the rollback")
	assert.Equal(t, corev1.ConditionTrue, st.Status)
	assert.Equal(t, vocab.ReasonAutoRollback, st.Reason)
	assert.Contains(t, st.Message, "Rolled back from revision 3 (ReplicaSet web-h3): 2/2 new pods ImagePullBackOff")
	assert.Equal(t, 1.0, e.rollbacks(resultRolledBack))
	assert.Equal(t, 1.0, counterValue(t, e.r.Metrics.failFastDecisions.WithLabelValues("ImagePullBackOff", resultRolledBack)))

	// Nothing more to do: no write, no event.
	e.clock.Step(time.Minute)
	e.sequence = nil
	e.reconcileResult()
	assert.Empty(t, e.sequence)
	assert.Empty(t, e.events())
}

// The guard stopped (or lost a race) between its declaration and the
// rollback: the deadline's path finds the declaration and rolls back once,
// in fail-fast's words.
func TestDeclaredFailureRolledBackAfterARestart(t *testing.T) {
	d := deployment(inProgress)
	setProgressing(d, appsv1.DeploymentCondition{Status: corev1.ConditionFalse, Reason: vocab.ProgressDeadlineExceeded,
		Message: DeclaredFailureMessage("web-h3", "2/2 new pods ErrImagePull for 1m0s (container web, image web:v3)"), LastTransitionTime: metav1.NewTime(t0.Add(20 * time.Minute))})
	rs1, rs2, rs3 := history(d)
	e := newEnv(t, namespace(nil), d, rs1, rs2, rs3)

	e.reconcileResult()
	got := e.deployment()
	assert.Equal(t, "web:v2", got.Spec.Template.Spec.Containers[0].Image)
	assert.Equal(t, int64(3), ledgerOf(t, got).FailFastRevision)
	evs := e.events()
	assert.Equal(t, []string{vocab.ReasonAutoRollback}, eventReasons(evs))
	assert.Contains(t, evs[0], "Rolled back from revision 3 (ReplicaSet web-h3): 2/2 new pods ErrImagePull for 1m0s (container web, image web:v3), to known-good revision 2 (ReplicaSet web-h2).")
	require.NotNil(t, rollout.GuardStalled(&got.Status))

	e.reconcileResult()
	assert.Empty(t, e.events(), "once")
}

// A rollback on the deadline itself is reported the same way.
func TestDeadlineRollbackIsReported(t *testing.T) {
	d := deployment(failed)
	rs1, rs2, rs3 := history(d)
	e := newEnv(t, namespace(nil), d, rs1, rs2, rs3)
	require.NoError(t, e.reconcile())
	assert.Equal(t, []string{"Deployment/status", "Deployment", "Deployment/status"}, e.sequence, "reported, then rolled back, then recorded in the ledger, and nothing more")
	st := e.stalled()
	require.NotNil(t, st)
	assert.Contains(t, st.Message, "Rolled back from revision 3 (ReplicaSet web-h3), which exceeded its progress deadline, to known-good revision 2 (ReplicaSet web-h2).")
}

// A guard still running after `deployguard uninstall` rolls nothing back: the
// verdict would be left where nothing ends it any more.
func TestNoRollbackOnceUninstalled(t *testing.T) {
	d := deployment(failed)
	rs1, rs2, rs3 := history(d)
	e := newEnv(t, namespace(nil), d, rs1, rs2, rs3)
	e.r.Installed = func(context.Context) (bool, error) { return false, nil }
	require.NoError(t, e.reconcile())
	assert.Equal(t, "web:v3", e.deployment().Spec.Template.Spec.Containers[0].Image)
	assert.Nil(t, e.stalled())
	assert.Empty(t, e.statusPatches)

	e.r.Installed = func(context.Context) (bool, error) { return true, nil }
	require.NoError(t, e.reconcile())
	assert.Equal(t, "web:v2", e.deployment().Spec.Template.Spec.Containers[0].Image, "installed, it rolls back")
}

func TestVerdictEnds(t *testing.T) {
	tests := []struct {
		name   string
		change func(d *appsv1.Deployment)
	}{
		{name: "a fixed template is applied", change: func(d *appsv1.Deployment) {
			d.Generation++
			d.Spec.Template.Spec.Containers[0].Image = "web:v4"
		}},
		{name: "a person accepts the rollback", change: func(d *appsv1.Deployment) {
			d.Annotations[vocab.AnnotationAcceptRollback] = "3"
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := deployment(failed)
			rs1, rs2, rs3 := history(d)
			e := newEnv(t, namespace(nil), d, rs1, rs2, rs3)
			require.NoError(t, e.reconcile())
			require.NotNil(t, e.stalled())
			assert.Equal(t, "3", e.deployment().Labels[vocab.LabelRolledBack], "listed by kubectl get -l, and sent to the verdict webhook")

			got := e.deployment()
			tt.change(got)
			require.NoError(t, e.client.Update(context.Background(), got))
			if got.Generation != got.Status.ObservedGeneration {
				e.sequence = nil
				require.NoError(t, e.reconcile())
				assert.Empty(t, e.sequence, "no write before the Deployment controller has recorded the newRS it may be creating")
				// The controller creates the newRS and records it, before it
				// records the generation as observed.
				require.NoError(t, e.client.Create(context.Background(), replicaSet(got, 4, "web:v4")))
				got = e.deployment()
				setProgressing(got, appsv1.DeploymentCondition{Status: corev1.ConditionTrue, Reason: "NewReplicaSetCreated",
					Message: `Created new replica set "web-h4"`, LastTransitionTime: metav1.NewTime(t0.Add(30 * time.Minute))})
				require.NoError(t, e.client.Status().Update(context.Background(), got))
			}
			require.NoError(t, e.reconcile())
			assert.Nil(t, e.stalled(), "the Deployment no longer reads as failed, before a client can read its new generation as observed")
			l := ledgerOf(t, e.deployment())
			assert.Empty(t, l.RolledBackTo, "the rollback no longer stands")
			assert.Equal(t, int64(3), l.RolledBackRevision, "the revision rolled back from is not decided again")
			assert.NotContains(t, e.deployment().Labels, vocab.LabelRolledBack)

			// Coming back to the restored template later does not bring
			// the old verdict back.
			got = e.deployment()
			got.Spec.Template = podTemplate("web:v2")
			require.NoError(t, e.client.Update(context.Background(), got))
			require.NoError(t, e.reconcile())
			assert.Nil(t, e.stalled())
		})
	}
}

// A verdict an earlier release reported has no label: the reconciler adds
// it, so that the verdict webhook sees the Deployment's status writes.
func TestAStandingVerdictGetsItsLabel(t *testing.T) {
	d := deployment(rolledBack, func(d *appsv1.Deployment) {
		d.Status.Conditions = append(d.Status.Conditions, appsv1.DeploymentCondition{
			Type: vocab.ConditionStalled, Status: corev1.ConditionTrue, Reason: vocab.ReasonAutoRollback})
	})
	rs1, rs2, rs3 := history(d)
	e := newEnv(t, namespace(nil), d, rs1, rs2, rs3)
	require.NoError(t, e.reconcile())
	assert.Equal(t, "3", e.deployment().Labels[vocab.LabelRolledBack])
	require.NotNil(t, e.stalled(), "the verdict stands")
}

// The label goes with the verdict however the verdict ended: here the ledger
// no longer names the restored ReplicaSet (the guard stopped after it forgot
// the rollback, before it removed the condition and label).
func TestTheLabelGoesWithTheVerdict(t *testing.T) {
	d := deployment(rolledBack, withLedger(func(l *rollout.Ledger) { l.RolledBackTo = "" }), func(d *appsv1.Deployment) {
		d.Labels = map[string]string{vocab.LabelRolledBack: "3"}
		d.Status.Conditions = append(d.Status.Conditions, appsv1.DeploymentCondition{
			Type: vocab.ConditionStalled, Status: corev1.ConditionTrue, Reason: vocab.ReasonAutoRollback})
	})
	rs1, rs2, rs3 := history(d)
	e := newEnv(t, namespace(nil), d, rs1, rs2, rs3)
	require.NoError(t, e.reconcile())
	assert.Nil(t, e.stalled())
	assert.NotContains(t, e.deployment().Labels, vocab.LabelRolledBack)
}

// Opting a namespace out of the guard releases its verdicts: nothing would
// end them there, and every later deploy would read as failed.
func TestOptingOutReleasesTheVerdict(t *testing.T) {
	d := deployment(rolledBack, func(d *appsv1.Deployment) {
		d.Labels = map[string]string{vocab.LabelRolledBack: "3"}
		d.Status.Conditions = append(d.Status.Conditions, appsv1.DeploymentCondition{
			Type: vocab.ConditionStalled, Status: corev1.ConditionTrue, Reason: vocab.ReasonAutoRollback})
	})
	plain := deployment(func(d *appsv1.Deployment) { d.Name = "plain" })
	rs1, rs2, rs3 := history(d)
	e := newEnv(t, namespace(map[string]string{vocab.LabelGuard: vocab.LabelGuardDisabled}), d, plain, rs1, rs2, rs3)
	require.NoError(t, e.reconcile())
	got := e.deployment()
	assert.Nil(t, rollout.GuardStalled(&got.Status))
	assert.NotContains(t, got.Labels, vocab.LabelRolledBack)
	assert.Empty(t, ledgerOf(t, got).RolledBackTo)

	e.sequence = nil
	_, err := e.r.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(plain)})
	require.NoError(t, err)
	assert.Empty(t, e.sequence, "no write for a Deployment without a verdict")
}

// Upstream's status is left as upstream's wherever the guard does not roll
// back: paused, opted out, no known-good revision.
func TestNoVerdictWithoutARollback(t *testing.T) {
	tests := []struct {
		name string
		d    *appsv1.Deployment
		rss  func(d *appsv1.Deployment) []client.Object
	}{
		{name: "fail-fast, no known-good revision", d: deployment(inProgress, withLedger(func(l *rollout.Ledger) { l.FailingSince = rollout.FailingSinceValue(t0, "web-h3") })),
			rss: func(d *appsv1.Deployment) []client.Object {
				rs3 := replicaSet(d, 3, "web:v3")
				return []client.Object{rs3, newRSPod(rs3, "a", "ImagePullBackOff")}
			}},
		{name: "fail-fast, automatic rollback off", d: deployment(inProgress, withLedger(func(l *rollout.Ledger) { l.FailingSince = rollout.FailingSinceValue(t0, "web-h3") }), annotate(vocab.AnnotationAutoRollback, "false")),
			rss: func(d *appsv1.Deployment) []client.Object {
				rs1, rs2, rs3 := history(d)
				return []client.Object{rs1, rs2, rs3, newRSPod(rs3, "a", "ImagePullBackOff")}
			}},
		{name: "deadline, automatic rollback off", d: deployment(failed, annotate(vocab.AnnotationAutoRollback, "false")),
			rss: func(d *appsv1.Deployment) []client.Object {
				rs1, rs2, rs3 := history(d)
				return []client.Object{rs1, rs2, rs3}
			}},
		{name: "deadline, paused", d: deployment(failed, paused),
			rss: func(d *appsv1.Deployment) []client.Object {
				rs1, rs2, rs3 := history(d)
				return []client.Object{rs1, rs2, rs3}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, append([]client.Object{namespace(nil), tt.d}, tt.rss(tt.d)...)...)
			e.reconcileResult()
			e.clock.Step(time.Minute)
			e.reconcileResult()
			d := e.deployment()
			assert.Nil(t, rollout.GuardStalled(&d.Status), "no verdict")
			var types []appsv1.DeploymentConditionType
			for _, c := range d.Status.Conditions {
				types = append(types, c.Type)
			}
			assert.ElementsMatch(t, []appsv1.DeploymentConditionType{appsv1.DeploymentProgressing, vocab.ConditionLedger}, types,
				"the Deployment's status is upstream's but for the guard's ledger")
			want, got := progressing(tt.d), progressing(d)
			assert.Equal(t, []string{string(want.Status), want.Reason, want.Message}, []string{string(got.Status), got.Reason, got.Message})
		})
	}
}

func TestVerdictDue(t *testing.T) {
	withStalled := func(d *appsv1.Deployment) {
		d.Status.Conditions = append(d.Status.Conditions,
			appsv1.DeploymentCondition{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionTrue},
			appsv1.DeploymentCondition{Type: vocab.ConditionStalled, Status: corev1.ConditionTrue, Reason: vocab.ReasonAutoRollback})
	}
	newGeneration := func(d *appsv1.Deployment) { d.Generation = 4 }
	observed := func(d *appsv1.Deployment) { d.Status.ObservedGeneration = d.Generation }
	adopted := withLedger(func(l *rollout.Ledger) { l.RolledBackToTemplate = "" })
	tests := []struct {
		name              string
		old, d            *appsv1.Deployment
		wantDue           bool
		wantSelfContained bool
	}{
		{name: "the write that observes a new generation, verdict on it",
			old: deployment(rolledBack, withStalled, newGeneration), d: deployment(rolledBack, withStalled, newGeneration, observed),
			wantDue: true, wantSelfContained: true},
		{name: "the same, for a rollback adopted from an earlier release: left to the reconciler",
			old: deployment(rolledBack, adopted, withStalled, newGeneration), d: deployment(rolledBack, adopted, withStalled, newGeneration, observed),
			wantDue: true, wantSelfContained: false},
		{name: "no verdict on it",
			old: deployment(rolledBack, newGeneration), d: deployment(rolledBack, newGeneration, observed)},
		{name: "another controller's Stalled condition",
			old: deployment(newGeneration), d: deployment(newGeneration, observed, func(d *appsv1.Deployment) {
				d.Status.Conditions = append(d.Status.Conditions, appsv1.DeploymentCondition{Type: vocab.ConditionStalled, Status: corev1.ConditionTrue, Reason: "SomethingElse"})
			})},
		{name: "the generation was observed already (a later status write)",
			old: deployment(rolledBack, withStalled), d: deployment(rolledBack, withStalled)},
		{name: "the new generation not observed yet (the newRS recorded)",
			old: deployment(rolledBack, withStalled, newGeneration), d: deployment(rolledBack, withStalled, newGeneration)},
		{name: "being deleted",
			old: deployment(rolledBack, withStalled, newGeneration), d: deployment(rolledBack, withStalled, newGeneration, observed, func(d *appsv1.Deployment) {
				d.DeletionTimestamp = &metav1.Time{Time: t0}
			})},
		{name: "a verdict without its rollback recorded",
			old: deployment(withStalled, newGeneration), d: deployment(withStalled, newGeneration, observed), wantDue: true, wantSelfContained: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			selfContained, due := rollout.VerdictDue(tt.old, tt.d)
			assert.Equal(t, tt.wantDue, due)
			assert.Equal(t, tt.wantSelfContained, selfContained)
			if due {
				i := rollout.StalledIndex(&tt.d.Status)
				require.GreaterOrEqual(t, i, 0)
				assert.Equal(t, appsv1.DeploymentConditionType(vocab.ConditionStalled), tt.d.Status.Conditions[i].Type)
				assert.Equal(t, vocab.ReasonAutoRollback, tt.d.Status.Conditions[i].Reason)
			}
		})
	}
}
