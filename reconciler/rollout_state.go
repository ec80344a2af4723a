package reconciler

import (
	"fmt"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
)

// Phases of a rollout as ReadRollout reads it.
const (
	RolloutProgressing = "Progressing"
	RolloutComplete    = "Complete"
	RolloutFailed      = "Failed"
)

// RolloutState is how a rollout reads to a deploying tool that asks the
// guard (`deployguard rollout status`): upstream's rules, as kubectl's
// rollout status viewer applies them, with the guard's verdicts first.
type RolloutState struct {
	// Phase is RolloutProgressing, RolloutComplete or RolloutFailed.
	Phase string `json:"phase"`
	// Reason is why it failed: vocab.ReasonAutoRollback (the guard rolled
	// it back), vocab.ReasonRolloutFailing (the guard found it failing and
	// left it: no known-good revision, or automatic rollback off), or
	// ProgressDeadlineExceeded.
	Reason string `json:"reason,omitempty"`
	// Message says what happened or what the rollout waits for.
	Message string `json:"message"`
	// Revision is the Deployment's revision; FailedRevision the one that
	// failed (Failed only, when known).
	Revision       int64  `json:"revision,omitempty"`
	FailedRevision string `json:"failedRevision,omitempty"`
}

// ReadRollout reads the state of the Deployment's latest rollout. rss are
// the ReplicaSets it controls, read from the API server. The guard's verdict
// comes first, because after a rollback upstream's conditions read as a
// success: a rollback that stands (rollout.DecideVerdict) is Failed, and so is a
// revision fail-fast found failing and could not roll back. Then upstream's
// ProgressDeadlineExceeded is Failed, and the rest is kubectl's rollout
// status: spec observed, every replica updated, no old one left, the updated
// ones available. Like kubectl, it ignores spec.paused: a paused rollout
// waits.
func ReadRollout(d *appsv1.Deployment, rss []*appsv1.ReplicaSet) RolloutState {
	st := RolloutState{Phase: RolloutProgressing}
	st.Revision, _ = rollout.Revision(d)
	if d.Generation > d.Status.ObservedGeneration {
		st.Message = "Waiting for deployment spec update to be observed..."
		return st
	}
	if v := rollout.DecideVerdict(d, rss); v.Stalled {
		st.Phase, st.Reason, st.Message = RolloutFailed, vocab.ReasonAutoRollback, v.Message
		st.FailedRevision = rolledBackRevision(d)
		return st
	}
	ledger, _ := rollout.ReadLedger(d)
	if newRS := rollout.FindNewReplicaSet(d, rss); newRS != nil && !ledger.IsKnownGood(newRS) {
		if rev, err := rollout.Revision(newRS); err == nil && rev != 0 && ledger.FailFastRevision == rev {
			// Found failing and left as it is (no known-good revision, or
			// automatic rollback off): the decision's message says which.
			st.Phase, st.Reason, st.FailedRevision = RolloutFailed, vocab.ReasonRolloutFailing, rollout.FormatRevision(rev)
			st.Message = d.Annotations[vocab.AnnotationRollbackStatus]
			return st
		}
	}
	if c := rollout.ProgressingCondition(d); c != nil && c.Reason == vocab.ProgressDeadlineExceeded {
		st.Phase, st.Reason, st.Message = RolloutFailed, vocab.ProgressDeadlineExceeded, fmt.Sprintf("deployment %q exceeded its progress deadline: %s", d.Name, c.Message)
		if decision := d.Annotations[vocab.AnnotationRollbackStatus]; decision != "" && ledger.HandledDeadline != "" {
			st.Message += " deployguard: " + decision
		}
		return st
	}
	want := rollout.Replicas(d)
	s := d.Status
	switch {
	case s.UpdatedReplicas < want:
		st.Message = fmt.Sprintf("Waiting for deployment %q rollout to finish: %d out of %d new replicas have been updated...", d.Name, s.UpdatedReplicas, want)
	case s.Replicas > s.UpdatedReplicas:
		st.Message = fmt.Sprintf("Waiting for deployment %q rollout to finish: %d old replicas are pending termination...", d.Name, s.Replicas-s.UpdatedReplicas)
	case s.AvailableReplicas < s.UpdatedReplicas:
		st.Message = fmt.Sprintf("Waiting for deployment %q rollout to finish: %d of %d updated replicas are available...", d.Name, s.AvailableReplicas, s.UpdatedReplicas)
	default:
		st.Phase, st.Message = RolloutComplete, fmt.Sprintf("deployment %q successfully rolled out", d.Name)
	}
	return st
}
