package rollout

import (
	"fmt"
	"slices"

	appsv1 "k8s.io/api/apps/v1"

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
		failed = FormatRevision(l.RolledBackRevision)
	}
	if failed != "" && d.Annotations[vocab.AnnotationAcceptRollback] == failed {
		return Verdict{Clear: true, Why: "accepted"}
	}
	if l.RolledBackToTemplate != "" {
		if TemplateHash(&d.Spec.Template) != l.RolledBackToTemplate {
			return Verdict{Clear: true, Why: "new template"}
		}
		return Verdict{Stalled: true, Message: StalledMessage(d, d.Annotations[vocab.AnnotationRollbackStatus], failed), Why: "rolled back"}
	}
	// A rollback adopted from an earlier release names only the ReplicaSet.
	var restored *appsv1.ReplicaSet
	for _, rs := range rss {
		if rs.Name == to {
			restored = rs
		}
	}
	if restored == nil || !SameTemplate(d, restored) {
		// A new template (or the restored ReplicaSet is gone, which the
		// Deployment controller does only once it is an old one).
		return Verdict{Clear: true, Why: "new template"}
	}
	return Verdict{Stalled: true, Message: StalledMessage(d, d.Annotations[vocab.AnnotationRollbackStatus], failed), Why: "rolled back"}
}

// StalledMessage is the rollback's decision, and how to end it.
func StalledMessage(d *appsv1.Deployment, decision, failed string) string {
	if decision == "" {
		decision = fmt.Sprintf("The guard rolled back revision %s.", failed)
	}
	return fmt.Sprintf("%s Revision %s is not running. Apply a fixed template, or accept the rollback: kubectl annotate deployment -n %s %s %s=%s",
		decision, failed, d.Namespace, d.Name, vocab.AnnotationAcceptRollback, failed)
}

// GuardStalled returns the guard's Stalled condition on the Deployment, or
// nil. A Stalled condition of another reason is another controller's, and
// left alone.
func GuardStalled(s *appsv1.DeploymentStatus) *appsv1.DeploymentCondition {
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
	if GuardStalled(&d.Status) == nil || d.DeletionTimestamp != nil ||
		!SpecObserved(d) || old.Status.ObservedGeneration == d.Generation {
		return false, false
	}
	l, _ := ReadLedger(d)
	return l.RolledBackTo == "" || l.RolledBackToTemplate != "", true
}
