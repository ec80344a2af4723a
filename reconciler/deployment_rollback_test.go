package reconciler

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
)

func TestShouldRollBack(t *testing.T) {
	deadline := t0.Add(20 * time.Minute).Format(time.RFC3339)
	earlier := t0.Add(10 * time.Minute).Format(time.RFC3339)
	on := DefaultOptions()
	off := DefaultOptions()
	off.AutoRollback = false

	// rs3AfterRollback is what the restored ReplicaSet looks like once the
	// Deployment controller adopted it as newRS again: revision bumped.
	restored := func(d *appsv1.Deployment) []*appsv1.ReplicaSet {
		rs1 := replicaSet(d, 1, "web:v1")
		rs2 := replicaSet(d, 2, "web:v2")
		rs3 := replicaSet(d, 3, "web:v3")
		withKnownGood(d, rs1, rs2)
		rs2.Annotations[vocab.RevisionAnnotation] = "4"
		return []*appsv1.ReplicaSet{rs1, rs2, rs3}
	}
	// rolledBack is the Deployment right after the guard's rollback write to
	// revision 2, observed by the Deployment controller, which kept the old
	// condition because no replica has made progress yet.
	rolledBack := func(d *appsv1.Deployment) {
		failed(d)
		d.Spec.Template = podTemplate("web:v2")
		d.Generation, d.Status.ObservedGeneration = 4, 4
		d.Annotations[vocab.RevisionAnnotation] = "4"
		withLedger(func(l *rollout.Ledger) {
			l.RolledBackRevision, l.RolledBackTo, l.HandledDeadline = 3, "web-h2", deadline
		})(d)
	}

	tests := []struct {
		name       string
		d          *appsv1.Deployment
		rss        func(*appsv1.Deployment) []*appsv1.ReplicaSet
		opts       Options
		wantAction Action
		wantReason string
		wantTarget string
	}{
		{
			name: "rollout complete: nothing to do",
			d:    deployment(completed), opts: on,
			wantAction: ActionNone, wantReason: ReasonRolloutNotFailed,
		},
		{
			name: "still progressing: nothing to do",
			d: deployment(func(d *appsv1.Deployment) {
				setProgressing(d, appsv1.DeploymentCondition{Status: corev1.ConditionTrue, Reason: "ReplicaSetUpdated"})
			}), opts: on,
			wantAction: ActionNone, wantReason: ReasonRolloutNotFailed,
		},
		{
			name: "resumed: the clock restarted, no deadline yet",
			d: deployment(func(d *appsv1.Deployment) {
				setProgressing(d, appsv1.DeploymentCondition{Status: corev1.ConditionUnknown, Reason: vocab.DeploymentResumed})
			}), opts: on,
			wantAction: ActionNone, wantReason: ReasonRolloutNotFailed,
		},
		{
			name: "completed, and a metric check failed it in its bake window: back to the newest known-good revision",
			d: deployment(completed, withLedger(func(l *rollout.Ledger) {
				l.Checks = &rollout.CheckRun{ReplicaSet: "web-h3", Revision: 3, Failed: earlier, Evidence: "metric check ClusterDeploymentCheck/errors/rate failed"}
			})), opts: on,
			wantAction: ActionRollBack, wantReason: ReasonAutoRollback, wantTarget: "web-h2",
		},
		{
			name: "a metric check's failure once handled is not acted on again",
			d: deployment(completed, withLedger(func(l *rollout.Ledger) {
				l.Checks = &rollout.CheckRun{ReplicaSet: "web-h3", Revision: 3, Failed: earlier, Evidence: "metric check x failed"}
				l.HandledDeadline = earlier
			})), opts: on,
			wantAction: ActionNone, wantReason: ReasonDeadlineAlreadyHandled,
		},
		{
			name: "a metric check's failure of another revision is not this one's",
			d: deployment(completed, withLedger(func(l *rollout.Ledger) {
				l.Checks = &rollout.CheckRun{ReplicaSet: "web-h2", Revision: 2, Failed: earlier, Evidence: "metric check x failed"}
			})), opts: on,
			wantAction: ActionNone, wantReason: ReasonRolloutNotFailed,
		},
		{
			name: "deadline exceeded: back to the newest known-good revision",
			d:    deployment(failed), opts: on,
			wantAction: ActionRollBack, wantReason: ReasonAutoRollback, wantTarget: "web-h2",
		},
		{
			name: "previous revision never completed: back past it",
			d:    deployment(failed), opts: on,
			rss: func(d *appsv1.Deployment) []*appsv1.ReplicaSet {
				rs1 := replicaSet(d, 1, "web:v1")
				withKnownGood(d, rs1)
				return []*appsv1.ReplicaSet{rs1, replicaSet(d, 2, "web:v2"), replicaSet(d, 3, "web:v3")}
			},
			wantAction: ActionRollBack, wantReason: ReasonAutoRollback, wantTarget: "web-h1",
		},
		{
			name: "no known-good revision: held, said why",
			d:    deployment(failed), opts: on,
			rss: func(d *appsv1.Deployment) []*appsv1.ReplicaSet {
				return []*appsv1.ReplicaSet{replicaSet(d, 1, "web:v1"), replicaSet(d, 2, "web:v2"), replicaSet(d, 3, "web:v3")}
			},
			wantAction: ActionHold, wantReason: ReasonNoKnownGoodRevision,
		},
		{
			name: "turned off cluster-wide",
			d:    deployment(failed), opts: off,
			wantAction: ActionNone, wantReason: ReasonAutoRollbackDisabled,
		},
		{
			name: "turned off by the Deployment",
			d:    deployment(failed, annotate(vocab.AnnotationAutoRollback, "false")), opts: on,
			wantAction: ActionNone, wantReason: ReasonAutoRollbackDisabled,
		},
		{
			name: "opt-out value that is not false leaves it on",
			d:    deployment(failed, annotate(vocab.AnnotationAutoRollback, "please")), opts: on,
			wantAction: ActionRollBack, wantReason: ReasonAutoRollback, wantTarget: "web-h2",
		},
		{
			name: "new generation not observed: the condition may be about the old spec",
			d:    deployment(failed, func(d *appsv1.Deployment) { d.Generation = 4 }), opts: on,
			wantAction: ActionNone, wantReason: ReasonGenerationNotObserved,
		},
		{
			name: "paused: never rolled back, recorded once",
			d:    deployment(failed, paused), opts: on,
			wantAction: ActionHold, wantReason: ReasonPaused,
		},
		{
			name: "resumed after a deadline recorded while paused: not acted on",
			d:    deployment(failed, withLedger(func(l *rollout.Ledger) { l.HandledDeadline = deadline })), opts: on,
			wantAction: ActionNone, wantReason: ReasonDeadlineAlreadyHandled,
		},
		{
			name: "a new deadline after an older one was handled",
			d:    deployment(failed, withLedger(func(l *rollout.Ledger) { l.HandledDeadline = earlier })), opts: on,
			wantAction: ActionRollBack, wantReason: ReasonAutoRollback, wantTarget: "web-h2",
		},
		{
			name: "right after the rollback write, before the Deployment controller synced",
			d: deployment(rolledBack, func(d *appsv1.Deployment) {
				d.Status.ObservedGeneration = 3
				d.Annotations[vocab.RevisionAnnotation] = "3"
			}), opts: on,
			wantAction: ActionNone, wantReason: ReasonGenerationNotObserved,
		},
		{
			name: "after the rollback, stale deadline still shown: not a loop",
			d:    deployment(rolledBack), rss: restored, opts: on,
			wantAction: ActionNone, wantReason: ReasonDeadlineAlreadyHandled,
		},
		{
			name: "stale deadline naming another ReplicaSet (rolled back by hand)",
			d: deployment(rolledBack, withLedger(func(l *rollout.Ledger) {
				l.HandledDeadline, l.RolledBackRevision, l.RolledBackTo = "", 0, ""
			})), rss: restored, opts: on,
			wantAction: ActionNone, wantReason: ReasonStaleCondition,
		},
		{
			name: "failed revision already rolled back from",
			d:    deployment(failed, withLedger(func(l *rollout.Ledger) { l.RolledBackRevision = 3 })), opts: on,
			wantAction: ActionNone, wantReason: ReasonAlreadyRolledBack,
		},
		{
			name: "the restored known-good revision fails its own deadline: loop stopped",
			d:    deployment(rolledBack, failedAt("web-h2", t0.Add(40*time.Minute))), rss: restored, opts: on,
			wantAction: ActionHold, wantReason: ReasonRollbackLoop,
		},
		{
			name: "a known-good revision re-applied by hand fails: not rolled back either",
			d:    deployment(failed), opts: on,
			rss: func(d *appsv1.Deployment) []*appsv1.ReplicaSet {
				rs1, rs3 := replicaSet(d, 1, "web:v1"), replicaSet(d, 3, "web:v3")
				withKnownGood(d, rs1, rs3)
				return []*appsv1.ReplicaSet{rs1, rs3}
			},
			wantAction: ActionHold, wantReason: ReasonRollbackLoop,
		},
		{
			name: "newRS not in the cache yet",
			d:    deployment(failed), opts: on,
			rss: func(d *appsv1.Deployment) []*appsv1.ReplicaSet {
				rs1 := replicaSet(d, 1, "web:v1")
				withKnownGood(d, rs1)
				return []*appsv1.ReplicaSet{rs1}
			},
			wantAction: ActionNone, wantReason: ReasonNoNewReplicaSet,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rss := tt.rss
			if rss == nil {
				rss = func(d *appsv1.Deployment) []*appsv1.ReplicaSet {
					rs1, rs2, rs3 := history(d)
					return []*appsv1.ReplicaSet{rs1, rs2, rs3}
				}
			}
			got := ShouldRollBack(tt.d, rss(tt.d), tt.opts)
			assert.Equal(t, tt.wantAction, got.Action)
			assert.Equal(t, tt.wantReason, got.Reason)
			if tt.wantAction != ActionNone {
				assert.NotEmpty(t, got.Message, "a decision that is written says why")
				require.NotNil(t, got.Deadline)
			}
			if tt.wantTarget == "" {
				assert.Nil(t, got.Target)
				return
			}
			require.NotNil(t, got.Target)
			assert.Equal(t, tt.wantTarget, got.Target.Name)
			assert.Equal(t, int64(3), got.FailedRevision)
		})
	}
}

func TestRollbackTemplate(t *testing.T) {
	d := deployment()
	rs := replicaSet(d, 2, "web:v2")
	require.Equal(t, "h2", rs.Spec.Template.Labels[appsv1.DefaultDeploymentUniqueLabelKey])

	got := RollbackTemplate(rs)

	// What kubectl rollout undo --to-revision=2 patches in: the ReplicaSet's
	// template without the hash label, everything else as it is.
	want := podTemplate("web:v2")
	assert.Equal(t, want, *got)
	assert.Equal(t, "h2", rs.Spec.Template.Labels[appsv1.DefaultDeploymentUniqueLabelKey], "the ReplicaSet is not modified")
}

func TestRollbackAnnotations(t *testing.T) {
	const lastApplied = `{"kind":"Deployment"}`
	d := deployment(annotate(
		corev1.LastAppliedConfigAnnotation, lastApplied,
		"deployment.kubernetes.io/revision-history", "1",
		"kubernetes.io/change-cause", "deploy v3",
		"added-after-v2", "x",
		vocab.AnnotationQuarantinedTemplates, "q1,q2",
		vocab.AnnotationProtected, "true",
		// An earlier release's marks, left on the Deployment by that
		// release or by a kubectl rollout undo.
		vocab.LegacyAnnotationKnownGood, t0.Format(time.RFC3339),
		vocab.LegacyAnnotationKnownGoodHash, "h1",
		vocab.LegacyAnnotationKnownGoodRevision, "1",
		vocab.LegacyAnnotationRolledBackRevision, "2",
		vocab.LegacyAnnotationRolledBackTo, "web-h1",
		vocab.LegacyAnnotationFailFastRevision, "2",
		vocab.LegacyAnnotationHandledDeadline, t0.Format(time.RFC3339),
		vocab.LegacyAnnotationFailingSince, t0.Format(time.RFC3339)+" web-h2",
	))
	rs := replicaSet(d, 2, "web:v2", func(rs *appsv1.ReplicaSet) {
		rs.Annotations = map[string]string{
			vocab.RevisionAnnotation:                    "2",
			"deployment.kubernetes.io/desired-replicas": "3",
			"deployment.kubernetes.io/max-replicas":     "4",
			"kubernetes.io/change-cause":                "deploy v2",
			// Copies the Deployment controller made when revision 2 was new.
			vocab.AnnotationQuarantinedTemplates: "q1",
			vocab.AnnotationDefaulted:            "strategy",
		}
		legacyKnownGood(rs)
	})

	got := RollbackAnnotations(d, rs)

	assert.Equal(t, map[string]string{
		// kubectl keeps these from the Deployment…
		corev1.LastAppliedConfigAnnotation:          lastApplied,
		vocab.RevisionAnnotation:                    "3",
		"deployment.kubernetes.io/revision-history": "1",
		// …and takes the rest from the ReplicaSet, dropping what only the
		// Deployment had.
		"kubernetes.io/change-cause": "deploy v2",
		// The guard's own annotations stay as the Deployment has them; the
		// ReplicaSet's copies and an earlier release's known-good mark do not
		// come over, and every earlier release's mark on the Deployment goes.
		vocab.AnnotationQuarantinedTemplates: "q1,q2",
		vocab.AnnotationProtected:            "true",
	}, got)
}

func TestFailedReplicaSetName(t *testing.T) {
	tests := []struct {
		msg    string
		want   string
		wantOK bool
	}{
		{msg: `ReplicaSet "web-7d4b9c" has timed out progressing.`, want: "web-7d4b9c", wantOK: true},
		{msg: `Deployment "web" has timed out progressing.`, wantOK: false},
		{msg: `ReplicaSet "web-7d4b9c" is progressing.`, wantOK: false},
		{msg: "", wantOK: false},
		{msg: `ReplicaSet "web-7d4b9c" has failed progressing: 2/2 new pods ImagePullBackOff for 1m0s (container web, image web:v3).`, want: "web-7d4b9c", wantOK: true},
		{msg: `ReplicaSet "web-7d4b9c" has failed progressing: .`, wantOK: false},
	}
	for _, tt := range tests {
		t.Run(tt.msg, func(t *testing.T) {
			got, ok := failedReplicaSetName(tt.msg)
			assert.Equal(t, tt.wantOK, ok)
			assert.Equal(t, tt.want, got)
		})
	}
}

// The condition's lastTransitionTime is serialised to the second; a deadline
// recorded from a cached copy with sub-second precision still matches it.
func TestHandledDeadlineSecondResolution(t *testing.T) {
	at := t0.Add(20*time.Minute + 400*time.Millisecond)
	d := deployment(failedAt("web-h3", at), withLedger(func(l *rollout.Ledger) { l.HandledDeadline = at.Truncate(time.Second).Format(time.RFC3339) }))
	rs1, rs2, rs3 := history(d)
	got := ShouldRollBack(d, []*appsv1.ReplicaSet{rs1, rs2, rs3}, DefaultOptions())
	assert.Equal(t, ReasonDeadlineAlreadyHandled, got.Reason)
}

func TestOutcomeUnknown(t *testing.T) {
	gr := appsv1.Resource("deployments")
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"the connection dropped", errors.New("read tcp: connection reset by peer"), true},
		{"the client timed out", context.DeadlineExceeded, true},
		{"the API server timed out", apierrors.NewTimeoutError("etcd slow", 1), true},
		{"the API server's own time-out", apierrors.NewServerTimeout(gr, "patch", 1), true},
		{"an internal error", apierrors.NewInternalError(errors.New("etcd")), true},
		{"not found: not applied", apierrors.NewNotFound(gr, "web"), false},
		{"conflict: not applied", apierrors.NewConflict(gr, "web", errors.New("changed")), false},
		{"forbidden: not applied", apierrors.NewForbidden(gr, "web", errors.New("no")), false},
		{"invalid: not applied", apierrors.NewBadRequest("bad"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, outcomeUnknown(tt.err))
		})
	}
}
