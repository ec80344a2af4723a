package reconciler

import (
	"context"
	"fmt"
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/vocab"
)

// A rollback restores a template that runs, so afterwards every deploying
// tool reads the Deployment as healthy: a failed deploy would read as a
// success. The verdict phase keeps the guard's word on the Deployment
// instead, as a Stalled condition (vocab.ConditionStalled), for as long as
// the Deployment runs the revision the guard restored and nobody accepted
// the rollback.

// Verdict is what the Deployment's status should say about the guard's last
// rollback.
type Verdict struct {
	// Stalled: the rollback stands, and the Deployment reads as failed.
	Stalled bool
	// Message is the Stalled condition's message (Stalled only).
	Message string
	// Clear: the rollback no longer stands (a new template, or accepted);
	// the ledger's RolledBackTo goes, so that coming back to the restored
	// template later does not bring the verdict back.
	Clear bool
	// Why says, for the log, why the verdict is what it is.
	Why string
}

// DecideVerdict decides whether the Deployment still reads as failed after
// the guard's rollback. The rollback stands while the Deployment runs the
// template it restored (the ledger's RolledBackToTemplate), that is until a new template
// is applied, and until a person accepts it (vocab.AnnotationAcceptRollback
// naming the failed revision). An identical template applied again, as a
// GitOps tool does after a revert, changes nothing: the guard cannot tell it
// from no write at all, so the acceptance is explicit.
func DecideVerdict(d *appsv1.Deployment, rss []*appsv1.ReplicaSet) Verdict {
	l, _ := ReadLedger(d)
	to := l.RolledBackTo
	if to == "" {
		return Verdict{Why: "no rollback"}
	}
	failed := ""
	if l.RolledBackRevision != 0 {
		failed = formatRevision(l.RolledBackRevision)
	}
	if failed != "" && d.Annotations[vocab.AnnotationAcceptRollback] == failed {
		return Verdict{Clear: true, Why: "accepted"}
	}
	if l.RolledBackToTemplate != "" {
		if templateHash(&d.ObjectMeta, &d.Spec.Template) != l.RolledBackToTemplate {
			return Verdict{Clear: true, Why: "new template"}
		}
		return Verdict{Stalled: true, Message: stalledMessage(d, d.Annotations[vocab.AnnotationRollbackStatus], failed), Why: "rolled back"}
	}
	// A rollback adopted from an earlier release names only the ReplicaSet.
	var restored *appsv1.ReplicaSet
	for _, rs := range rss {
		if rs.Name == to {
			restored = rs
		}
	}
	if restored == nil || !sameTemplate(d, restored) {
		// A new template (or the restored ReplicaSet is gone, which the
		// Deployment controller does only once it is an old one).
		return Verdict{Clear: true, Why: "new template"}
	}
	return Verdict{Stalled: true, Message: stalledMessage(d, d.Annotations[vocab.AnnotationRollbackStatus], failed), Why: "rolled back"}
}

// stalledMessage is the rollback's decision, and how to end it.
func stalledMessage(d *appsv1.Deployment, decision, failed string) string {
	if decision == "" {
		decision = fmt.Sprintf("The guard rolled back revision %s.", failed)
	}
	return fmt.Sprintf("%s Revision %s is not running. Apply a fixed template, or accept the rollback: kubectl annotate deployment -n %s %s %s=%s",
		decision, failed, d.Namespace, d.Name, vocab.AnnotationAcceptRollback, failed)
}

// guardStalled returns the guard's Stalled condition on the Deployment, or
// nil. A Stalled condition of another reason is another controller's, and
// left alone.
func guardStalled(s *appsv1.DeploymentStatus) *appsv1.DeploymentCondition {
	if i := StalledIndex(s); i >= 0 {
		return &s.Conditions[i]
	}
	return nil
}

// StalledIndex is the index of the guard's Stalled condition in the
// Deployment's conditions, or -1.
func StalledIndex(s *appsv1.DeploymentStatus) int {
	for i := range s.Conditions {
		if s.Conditions[i].Type == vocab.ConditionStalled && s.Conditions[i].Reason == vocab.ReasonAutoRollback {
			return i
		}
	}
	return -1
}

// HasVerdict reports whether any part of the guard's rollback verdict is on
// d: its Stalled condition, its label or the rollback's annotation.
func HasVerdict(d *appsv1.Deployment) bool {
	_, labelled := d.Labels[vocab.LabelRolledBack]
	l, _ := ReadLedger(d)
	return labelled || l.RolledBackTo != "" || StalledIndex(&d.Status) >= 0
}

// RemoveStalled removes the guard's Stalled condition, and only the guard's:
// one of another reason is another controller's. It reports whether there
// was one.
func RemoveStalled(s *appsv1.DeploymentStatus) bool {
	i := StalledIndex(s)
	if i < 0 {
		return false
	}
	s.Conditions = slices.Delete(s.Conditions, i, i+1)
	return true
}

// VerdictDue reports whether the status write from old to d records d's
// generation as observed while the guard's Stalled condition is on it, and
// whether DecideVerdict can decide it from d alone (the ledger names the
// restored template's hash, as every rollback of this release records it;
// one adopted from an earlier release names only a ReplicaSet, and is left
// to the reconciler). Deploying tools
// read a new spec's outcome from that write on (kstatus, so Helm 4 and
// Flux, reads conditions once observedGeneration is the generation). The
// Deployment controller makes it right after recording the newRS, and it
// copies every condition: a verdict ended by the reconciler after the newRS
// is recorded can land after it, and a fix then reads as failed. The
// guard's status webhook decides the verdict in this write instead. A
// Deployment being deleted is left to the cleanup, as the reconciler leaves
// it.
func VerdictDue(old, d *appsv1.Deployment) (selfContained, due bool) {
	if guardStalled(&d.Status) == nil || d.DeletionTimestamp != nil ||
		!specObserved(d) || old.Status.ObservedGeneration == d.Generation {
		return false, false
	}
	l, _ := ReadLedger(d)
	return l.RolledBackTo == "" || l.RolledBackToTemplate != "", true
}

// reconcileVerdict brings the Stalled condition in line with DecideVerdict.
// Both writes are conditional on the resourceVersion read; the condition is
// written before the annotation is removed, so that a restart between them
// decides the same again.
func (r *DeploymentReconciler) reconcileVerdict(ctx context.Context, d *appsv1.Deployment, rss []*appsv1.ReplicaSet) error {
	if !specObserved(d) && !newReplicaSetRecorded(d, rss) {
		return nil
	}
	return r.applyVerdict(ctx, d, DecideVerdict(d, rss))
}

// releaseVerdict ends the guard's verdict on a Deployment of a namespace
// opted out of the guard: nothing there ends it otherwise, and the
// Deployment controller copies the condition into every status it writes,
// so that every later deploy would read as failed. Nothing is written for a
// Deployment without one.
func (r *DeploymentReconciler) releaseVerdict(ctx context.Context, d *appsv1.Deployment) error {
	if !specObserved(d) || !HasVerdict(d) {
		return nil
	}
	return r.applyVerdict(ctx, d, Verdict{Clear: true, Why: "the namespace is opted out of the guard"})
}

// applyVerdict brings the Deployment's condition, label and annotation in
// line with v.
func (r *DeploymentReconciler) applyVerdict(ctx context.Context, d *appsv1.Deployment, v Verdict) error {
	cur := guardStalled(&d.Status)
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
		RemoveStalled(&d.Status)
		if err := r.Client.Status().Patch(ctx, d, patch); err != nil {
			return fmt.Errorf("clearing the rollback from the Deployment's status: %w", err)
		}
		log.Info("Rollback no longer reported", "why", v.Why)
	}
	// The label goes with the verdict however it ended (an annotation
	// removed by hand, an earlier release's end of it), so that it lists
	// only the Deployments that stand rolled back.
	if l, _ := ReadLedger(d); v.Clear && l.RolledBackTo != "" {
		if _, err := r.updateLedger(ctx, d, func(l Ledger) Ledger { l.RolledBackTo = ""; return l }); err != nil {
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
	if l, _ := ReadLedger(d); l.RolledBackRevision != 0 {
		return formatRevision(l.RolledBackRevision)
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
// status write, the rollback about to be made (Ledger.Pending), when pending
// is set.
func (r *DeploymentReconciler) reportRollbackPending(ctx context.Context, d *appsv1.Deployment, message string, pending *PendingRollback) (bool, error) {
	l, _ := ReadLedger(d)
	if cur := guardStalled(&d.Status); cur != nil && cur.Status == corev1.ConditionTrue && cur.Message == message && (pending == nil || equalPending(l.Pending, pending)) {
		return false, nil
	}
	patch := client.MergeFromWithOptions(d.DeepCopy(), client.MergeFromWithOptimisticLock{})
	setCondition(&d.Status, appsv1.DeploymentCondition{
		Type: vocab.ConditionStalled, Status: corev1.ConditionTrue, Reason: vocab.ReasonAutoRollback, Message: message,
	}, r.Clock.Now())
	if pending != nil {
		l.Pending = pending
		SetLedger(&d.Status, l, r.Clock.Now())
	}
	if err := r.Client.Status().Patch(ctx, d, patch); err != nil {
		return false, fmt.Errorf("reporting the rollback on the Deployment's status: %w", err)
	}
	return true, nil
}
