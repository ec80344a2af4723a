package reconciler

import (
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/deployguard/deployguard/reconciler/vocab"
)

// Event actions (events.k8s.io/v1 "action": what the guard did).
const (
	actionRollBack      = "RollBack"
	actionHold          = "Hold"
	actionMarkKnownGood = "MarkKnownGood"
)

// emitRollbackNormalEvent tells that the guard rolled the Deployment back to the
// target ReplicaSet, the related object.
func (r *DeploymentReconciler) emitRollbackNormalEvent(d *appsv1.Deployment, target *appsv1.ReplicaSet, message string) {
	r.Recorder.Eventf(d, target, corev1.EventTypeNormal, vocab.ReasonAutoRollback, actionRollBack, "%s", message)
}

// emitRollbackWarningEvent tells why the guard did not roll back a failed
// rollout, or that its rollback failed.
func (r *DeploymentReconciler) emitRollbackWarningEvent(d *appsv1.Deployment, reason, message string) {
	action := actionHold
	if reason == vocab.ReasonRollbackFailed {
		action = actionRollBack
	}
	r.Recorder.Eventf(d, nil, corev1.EventTypeWarning, reason, action, "%s", message)
}

// emitKnownGoodEvent tells that a revision completed and was recorded as
// known-good; the ReplicaSet is the related object.
func (r *DeploymentReconciler) emitKnownGoodEvent(d *appsv1.Deployment, rs *appsv1.ReplicaSet, message string) {
	r.Recorder.Eventf(d, rs, corev1.EventTypeNormal, vocab.ReasonKnownGood, actionMarkKnownGood, "%s", message)
}
