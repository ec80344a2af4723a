package reconciler

import (
	"testing"

	"github.com/stretchr/testify/assert"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
)

func TestReadRollout(t *testing.T) {
	notObserved := func(d *appsv1.Deployment) { d.Generation++ }
	updating := func(d *appsv1.Deployment) { inProgress(d) }
	oldPending := func(d *appsv1.Deployment) {
		completed(d)
		d.Status.Replicas++
	}
	notAvailable := func(d *appsv1.Deployment) {
		completed(d)
		d.Status.AvailableReplicas--
	}
	// After a rollback the Deployment controller reports the restored
	// revision complete: upstream's rules read success.
	restoredComplete := func(d *appsv1.Deployment) {
		rolledBack(d)
		completed(d)
	}
	const leftMessage = "Revision 3 (ReplicaSet web-h3) is failing: 1/1 new pods ErrImagePull for 1m0s; no known-good revision to roll back to, so it is left as it is."
	failingLeft := func(d *appsv1.Deployment) {
		withLedger(func(l *rollout.Ledger) { l.FailFastRevision = 3 })(d)
		annotate(vocab.AnnotationRollbackStatus, leftMessage)(d)
	}
	// The same in annotations only: what a tenant (or an earlier release's
	// copy) can write.
	failingForged := annotate(vocab.LegacyAnnotationFailFastRevision, "3", vocab.AnnotationRollbackStatus, leftMessage)

	tests := []struct {
		name        string
		d           *appsv1.Deployment
		wantPhase   string
		wantReason  string
		wantMessage string
	}{
		{name: "complete", d: deployment(completed), wantPhase: RolloutComplete, wantMessage: `deployment "web" successfully rolled out`},
		{name: "spec not observed", d: deployment(completed, notObserved), wantPhase: RolloutProgressing, wantMessage: "Waiting for deployment spec update to be observed..."},
		{name: "replicas being updated", d: deployment(updating), wantPhase: RolloutProgressing, wantMessage: "1 out of 3 new replicas have been updated"},
		{name: "old replicas pending termination", d: deployment(oldPending), wantPhase: RolloutProgressing, wantMessage: "1 old replicas are pending termination"},
		{name: "updated replicas not available", d: deployment(notAvailable), wantPhase: RolloutProgressing, wantMessage: "2 of 3 updated replicas are available"},
		{name: "paused waits, as with kubectl", d: deployment(updating, paused), wantPhase: RolloutProgressing},
		{name: "deadline exceeded", d: deployment(failed), wantPhase: RolloutFailed, wantReason: vocab.ProgressDeadlineExceeded, wantMessage: `deployment "web" exceeded its progress deadline: ReplicaSet "web-h3" has timed out progressing.`},
		{name: "rolled back by the guard, restored revision complete", d: deployment(restoredComplete), wantPhase: RolloutFailed, wantReason: vocab.ReasonAutoRollback, wantMessage: "Rolled back from revision 3 (ReplicaSet web-h3): 2/2 new pods ImagePullBackOff"},
		{name: "rollback accepted", d: deployment(restoredComplete, annotate(vocab.AnnotationAcceptRollback, "3")), wantPhase: RolloutComplete},
		{name: "a new template after a rollback waits for its own rollout", d: deployment(restoredComplete, notObserved, func(d *appsv1.Deployment) { d.Spec.Template = podTemplate("web:v5") }), wantPhase: RolloutProgressing},
		{name: "found failing, no known-good revision", d: deployment(updating, failingLeft), wantPhase: RolloutFailed, wantReason: vocab.ReasonRolloutFailing, wantMessage: "is failing: 1/1 new pods ErrImagePull"},
		{name: "found failing only in forged annotations", d: deployment(updating, failingForged), wantPhase: RolloutProgressing, wantMessage: "1 out of 3 new replicas have been updated"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rs1, rs2, rs3 := history(tt.d)
			got := ReadRollout(tt.d, []*appsv1.ReplicaSet{rs1, rs2, rs3})
			assert.Equal(t, tt.wantPhase, got.Phase, got.Message)
			assert.Equal(t, tt.wantReason, got.Reason)
			assert.Contains(t, got.Message, tt.wantMessage)
		})
	}
}

// The guard's declaration before its rollback reads as a failure too.
func TestReadRolloutDeclaredFailure(t *testing.T) {
	d := deployment(inProgress, func(d *appsv1.Deployment) {
		setProgressing(d, appsv1.DeploymentCondition{Status: corev1.ConditionFalse, Reason: vocab.ProgressDeadlineExceeded,
			Message: DeclaredFailureMessage("web-h3", "2/2 new pods ErrImagePull for 15s (container web, image web:v3)")})
	})
	rs1, rs2, rs3 := history(d)
	got := ReadRollout(d, []*appsv1.ReplicaSet{rs1, rs2, rs3})
	assert.Equal(t, RolloutFailed, got.Phase)
	assert.Contains(t, got.Message, "2/2 new pods ErrImagePull")
}
