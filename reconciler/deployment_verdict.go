package reconciler

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
)

// The verdict phase keeps the guard's word on a rolled-back Deployment, as
// rollout.DecideVerdict decides it, in its Stalled condition, its label and
// its ledger.

// reconcileVerdict brings the Stalled condition in line with
// rollout.DecideVerdict.
// Both writes are conditional on the resourceVersion read; the condition is
// written before the annotation is removed, so that a restart between them
// decides the same again.
func (r *DeploymentReconciler) reconcileVerdict(ctx context.Context, d *appsv1.Deployment, rss []*appsv1.ReplicaSet) error {
	if !rollout.SpecObserved(d) && !newReplicaSetRecorded(d, rss) {
		return nil
	}
	return r.applyVerdict(ctx, d, rollout.DecideVerdict(d, rss))
}

// releaseVerdict ends the guard's verdict on a Deployment of a namespace
// opted out of the guard: nothing there ends it otherwise, and the
// Deployment controller copies the condition into every status it writes,
// so that every later deploy would read as failed. Nothing is written for a
// Deployment without one.
func (r *DeploymentReconciler) releaseVerdict(ctx context.Context, d *appsv1.Deployment) error {
	if !rollout.SpecObserved(d) || !rollout.HasVerdict(d) {
		return nil
	}
	return r.applyVerdict(ctx, d, rollout.Verdict{Clear: true, Why: "the namespace is opted out of the guard"})
}

// applyVerdict brings the Deployment's condition, label and annotation in
// line with v.
func (r *DeploymentReconciler) applyVerdict(ctx context.Context, d *appsv1.Deployment, v rollout.Verdict) error {
	cur := rollout.GuardStalled(&d.Status)
	log := ctrl.LoggerFrom(ctx)

	switch {
	case v.Stalled:
		reported, err := r.reportRollback(ctx, d, v.Message)
		if err != nil {
			return err
		}
		if reported {
			log.Info("Rollback reported on the Deployment's status", "condition", vocab.ConditionStalled, "failedRevision", rolledBackRevision(d))
		}
		if _, ok := d.Labels[vocab.LabelRolledBack]; !ok {
			// A rollback by an earlier release, which set no label: without
			// it the verdict webhook never sees this Deployment's status.
			// Best effort: the reconciler still ends the verdict without it.
			patch := client.MergeFromWithOptions(d.DeepCopy(), client.MergeFromWithOptimisticLock{})
			setLabel(d, vocab.LabelRolledBack, rolledBackRevision(d))
			if err := r.Client.Patch(ctx, d, patch); err != nil {
				log.Info("Could not label the rolled-back Deployment; its verdict ends after the new generation is observed", "label", vocab.LabelRolledBack, "error", err.Error())
			}
		}
	case cur != nil:
		patch := client.MergeFromWithOptions(d.DeepCopy(), client.MergeFromWithOptimisticLock{})
		rollout.RemoveStalled(&d.Status)
		if err := r.Client.Status().Patch(ctx, d, patch); err != nil {
			return fmt.Errorf("clearing the rollback from the Deployment's status: %w", err)
		}
		log.Info("Rollback no longer reported", "why", v.Why)
	}
	// The label goes with the verdict however it ended (an annotation
	// removed by hand, an earlier release's end of it), so that it lists
	// only the Deployments that stand rolled back.
	if l, _ := rollout.ReadLedger(d); v.Clear && l.RolledBackTo != "" {
		if _, err := r.updateLedger(ctx, d, func(l rollout.Ledger) rollout.Ledger { l.RolledBackTo = ""; return l }); err != nil {
			return fmt.Errorf("forgetting the rollback: %w", err)
		}
	}
	if _, labelled := d.Labels[vocab.LabelRolledBack]; !v.Stalled && labelled {
		patch := client.MergeFromWithOptions(d.DeepCopy(), client.MergeFromWithOptimisticLock{})
		delete(d.Labels, vocab.LabelRolledBack)
		if err := r.Client.Patch(ctx, d, patch); err != nil {
			return fmt.Errorf("forgetting the rollback: %w", err)
		}
	}
	return nil
}

// rolledBackRevision is the ledger's rolled-back revision, as a label value
// and in messages ("" when none).
func rolledBackRevision(d *appsv1.Deployment) string {
	if l, _ := rollout.ReadLedger(d); l.RolledBackRevision != 0 {
		return rollout.FormatRevision(l.RolledBackRevision)
	}
	return ""
}

// reportRollback sets the guard's Stalled condition with message, unless it
// is already so, with a status write conditional on the resourceVersion read.
// The rollback writes it before its own write, so that no client can read
// the Deployment between the rollback and its report; the verdict phase
// keeps it afterwards.
func (r *DeploymentReconciler) reportRollback(ctx context.Context, d *appsv1.Deployment, message string) (bool, error) {
	return r.reportRollbackPending(ctx, d, message, nil)
}

// reportRollbackPending is reportRollback that also records, in the same
// status write, the rollback about to be made (rollout.Ledger.Pending), when pending
// is set.
func (r *DeploymentReconciler) reportRollbackPending(ctx context.Context, d *appsv1.Deployment, message string, pending *rollout.PendingRollback) (bool, error) {
	l, _ := rollout.ReadLedger(d)
	if cur := rollout.GuardStalled(&d.Status); cur != nil && cur.Status == corev1.ConditionTrue && cur.Message == message && (pending == nil || equalPending(l.Pending, pending)) {
		return false, nil
	}
	patch := client.MergeFromWithOptions(d.DeepCopy(), client.MergeFromWithOptimisticLock{})
	rollout.SetCondition(&d.Status, appsv1.DeploymentCondition{
		Type: vocab.ConditionStalled, Status: corev1.ConditionTrue, Reason: vocab.ReasonAutoRollback, Message: message,
	}, r.Clock.Now())
	if pending != nil {
		l.Pending = pending
		rollout.SetLedger(&d.Status, l, r.Clock.Now())
	}
	if err := r.Client.Status().Patch(ctx, d, patch); err != nil {
		return false, fmt.Errorf("reporting the rollback on the Deployment's status: %w", err)
	}
	return true, nil
}
