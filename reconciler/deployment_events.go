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
	actionIgnore        = "Ignore"
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

// Event actions of the cleanup on deletion.
const (
	actionDrain           = "Drain"
	actionRecord          = "Record"
	actionSkipCleanup     = "SkipCleanup"
	actionRemoveFinalizer = "RemoveFinalizer"
)

// actionForStep is the Event action of a cleanup step.
func actionForStep(s CleanupStep) string {
	switch s {
	case StepDrain:
		return actionDrain
	case StepRecord:
		return actionRecord
	case StepSkipAll:
		return actionSkipCleanup
	default:
		return actionRemoveFinalizer
	}
}

// emitCleanupEvent tells about a cleanup step of a Deployment being deleted. A
// terminating namespace refuses every new object, Events included, so there
// the Event is told about the Namespace instead (cluster-scoped: it lands in the
// default namespace, and `kubectl describe namespace` shows it), with the
// Deployment as the related object. An empty eventtype tells nothing.
func (r *DeploymentReconciler) emitCleanupEvent(d *appsv1.Deployment, ns namespaceState, eventtype, reason, action, message string) {
	if eventtype == "" {
		return
	}
	if ns.Terminating {
		r.Recorder.Eventf(namespaceRef(ns), d, eventtype, reason, action, "Deployment %s: %s", d.Name, message)
		return
	}
	r.Recorder.Eventf(d, nil, eventtype, reason, action, "%s", message)
}
