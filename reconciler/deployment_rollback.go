package reconciler

import (
	"fmt"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
)

// Action is what the rollback phase does about a Deployment.
type Action string

const (
	// ActionNone writes nothing: there is no failed rollout, or it is not ours to
	// touch, or it has been decided about already.
	ActionNone Action = "None"
	// ActionRollBack restores the template of Decision.Target.
	ActionRollBack Action = "RollBack"
	// ActionHold leaves the template alone and records why, once per deadline.
	ActionHold Action = "Hold"
)

// Reasons for a Decision. Those of ActionRollBack and ActionHold that users see
// as Events are the vocab event reasons.
const (
	ReasonRolloutNotFailed       = "RolloutNotFailed"
	ReasonAutoRollbackDisabled   = "AutoRollbackDisabled"
	ReasonGenerationNotObserved  = "GenerationNotObserved"
	ReasonDeadlineAlreadyHandled = "DeadlineAlreadyHandled"
	ReasonNoNewReplicaSet        = "NoNewReplicaSet"
	ReasonAlreadyRolledBack      = "AlreadyRolledBack"
	ReasonStaleCondition         = "StaleCondition"
	ReasonPaused                 = "Paused"
	ReasonRollbackLoop           = vocab.ReasonRollbackLoop
	ReasonNoKnownGoodRevision    = vocab.ReasonNoKnownGoodRevision
	ReasonAutoRollback           = vocab.ReasonAutoRollback
	ReasonRollbackRefused        = vocab.ReasonRollbackRefused
)

// Decision is what ShouldRollBack concluded.
type Decision struct {
	Action Action
	// Reason is one of the Reason constants.
	Reason string
	// Message is a sentence for the rollback-status annotation and the Event
	// (empty for ActionNone).
	Message string
	// Deadline is the Progressing=False/ProgressDeadlineExceeded condition
	// decided about (nil if there is none).
	Deadline *appsv1.DeploymentCondition
	// NewRS is the ReplicaSet whose rollout failed, FailedRevision its revision.
	NewRS          *appsv1.ReplicaSet
	FailedRevision int64
	// Target is the known-good ReplicaSet to restore (ActionRollBack only),
	// TargetRevision its revision.
	Target         *appsv1.ReplicaSet
	TargetRevision int64
	// Template is the template the rollback writes (ActionRollBack, once
	// decided on fresh objects): the target's, with the references whose
	// config drifted pointing at their snapshots (restoredTemplate).
	Template *corev1.PodTemplateSpec
	// Evidence is set when fail-fast declared the failure before the
	// deadline (see DeclaredFailureMessage): what the new pods showed.
	Evidence string
}

// ShouldRollBack decides what to do about a Deployment whose rollout may have
// exceeded its progress deadline. rss are the ReplicaSets the Deployment
// controls. The decision reads only the objects, never memory, so that it comes
// out the same after a restart or a change of leader.
//
// Staleness is the subtle part. Right after the rollback write, the Deployment
// controller has not yet synced: the old ProgressDeadlineExceeded condition and
// the old revision are still there. Until it observes the new generation,
// GenerationNotObserved holds. After that, it adopts the known-good ReplicaSet
// as its newRS and bumps its revision, but leaves the Progressing condition as it
// was until a replica makes progress (SetDeploymentCondition keeps a condition of
// the same status and reason): for a while the stale deadline seems to be about
// the restored revision. Three things keep it from being read so:
//   - the ledger's handled deadline: the rollback records the condition's
//     lastTransitionTime, and a genuinely new deadline is a new transition
//     (False → True on progress → False progressDeadlineSeconds later), so it is
//     strictly later, even at the one-second resolution of the field;
//   - the condition names the ReplicaSet that timed out ("ReplicaSet %q has
//     timed out progressing."); if that is not the newRS, it is stale;
//   - the ledger's rolled-back revision: revisions only grow, so the failed
//     revision never comes back as a newRS revision.
func ShouldRollBack(d *appsv1.Deployment, rss []*appsv1.ReplicaSet, opts Options) Decision {
	cond := rollout.ProgressingCondition(d)
	if cond == nil || cond.Status != corev1.ConditionFalse || cond.Reason != vocab.ProgressDeadlineExceeded {
		// A metric check's failure is declared in the ledger, not on the
		// Progressing condition: the Deployment controller would replace
		// that with NewReplicaSetAvailable on a rollout that completed.
		if cond = checkFailure(d, rss); cond == nil {
			return Decision{Action: ActionNone, Reason: ReasonRolloutNotFailed}
		}
	}
	dec := Decision{Action: ActionNone, Deadline: cond}
	_, dec.Evidence, _ = declaredFailure(cond.Message)

	if !opts.AutoRollback || autoRollbackOptedOut(d) {
		dec.Reason = ReasonAutoRollbackDisabled
		return dec
	}
	// The condition may be about an older generation: the Deployment controller
	// has not seen the latest spec yet (perhaps our own rollback).
	if d.Status.ObservedGeneration != d.Generation {
		dec.Reason = ReasonGenerationNotObserved
		return dec
	}
	ledger, _ := rollout.ReadLedger(d)
	if handled, ok := ledger.HandledDeadlineTime(); ok && cond.LastTransitionTime.Unix() <= handled.Unix() {
		dec.Reason = ReasonDeadlineAlreadyHandled
		return dec
	}

	newRS := rollout.FindNewReplicaSet(d, rss)
	if newRS == nil {
		// Our ReplicaSet cache is behind; its watch event will bring us back.
		dec.Reason = ReasonNoNewReplicaSet
		return dec
	}
	dec.NewRS = newRS
	failedRevision, err := rollout.Revision(newRS)
	if err != nil {
		dec.Reason = ReasonNoNewReplicaSet
		return dec
	}
	dec.FailedRevision = failedRevision
	if ledger.RolledBackRevision == failedRevision {
		dec.Reason = ReasonAlreadyRolledBack
		return dec
	}
	if name, ok := failedReplicaSetName(cond.Message); ok && name != newRS.Name {
		dec.Reason = ReasonStaleCondition
		return dec
	}

	dec.Action = ActionHold
	switch {
	case d.Spec.Paused:
		// Upstream does not replace a ProgressDeadlineExceeded condition with
		// DeploymentPaused, so a Deployment paused right after it failed still
		// shows the deadline. Record it as decided: after the resume the guard acts
		// only on a new deadline, counted from DeploymentResumed.
		dec.Reason = ReasonPaused
		dec.Message = fmt.Sprintf("Revision %d %s while the Deployment was being paused; the guard does not roll back a paused Deployment and will act only on a new deadline after it is resumed.", failedRevision, dec.failedHow())
	case ledger.IsKnownGood(newRS) && ledger.RolledBackRevision != 0:
		dec.Reason = ReasonRollbackLoop
		dec.Message = fmt.Sprintf("Revision %d (ReplicaSet %s) %s, but it is the known-good revision the guard rolled back to; stopped to avoid a rollback loop. The failure is likely outside the template.", failedRevision, newRS.Name, dec.failedHow())
	case ledger.IsKnownGood(newRS):
		dec.Reason = ReasonRollbackLoop
		dec.Message = fmt.Sprintf("Revision %d (ReplicaSet %s) %s, but it completed before and is known-good; not rolling back from one known-good revision to another. The failure is likely outside the template.", failedRevision, newRS.Name, dec.failedHow())
	default:
		target, why := FindKnownGoodTarget(d, rss)
		if target == nil {
			dec.Reason = ReasonNoKnownGoodRevision
			if why != "" {
				dec.Message = fmt.Sprintf("Revision %d (ReplicaSet %s) %s; %s, so it is left as it is (the guard restores only the newest known-good revision).", failedRevision, newRS.Name, dec.failedHow(), why)
			} else {
				dec.Message = fmt.Sprintf("Revision %d (ReplicaSet %s) %s; no known-good revision to roll back to, so it is left as it is.", failedRevision, newRS.Name, dec.failedHow())
			}
			return dec
		}
		targetRevision, _ := rollout.Revision(target) // KnownGoodTarget skips unparsable revisions.
		dec.Action = ActionRollBack
		dec.Reason = ReasonAutoRollback
		dec.Target, dec.TargetRevision = target, targetRevision
		if dec.Evidence != "" {
			// Fail-fast's words, as before it declared the failure first.
			dec.Message = fmt.Sprintf("Rolled back from revision %d (ReplicaSet %s): %s, to known-good revision %d (ReplicaSet %s).", failedRevision, newRS.Name, dec.Evidence, targetRevision, target.Name)
		} else {
			dec.Message = fmt.Sprintf("Rolled back from revision %d (ReplicaSet %s), which exceeded its progress deadline, to known-good revision %d (ReplicaSet %s).", failedRevision, newRS.Name, targetRevision, target.Name)
		}
	}
	return dec
}

// failedHow says how the revision failed, for the decision's message.
func (d Decision) failedHow() string {
	if d.Evidence != "" {
		return "is failing: " + d.Evidence
	}
	return "exceeded its progress deadline"
}

// RollbackTemplate is the template `kubectl rollout undo` restores from a
// ReplicaSet: its template without the pod-template-hash label.
func RollbackTemplate(rs *appsv1.ReplicaSet) *corev1.PodTemplateSpec {
	t := rs.Spec.Template.DeepCopy()
	delete(t.Labels, appsv1.DefaultDeploymentUniqueLabelKey)
	return t
}

// Annotations of the Deployment controller and kubectl that a rollback keeps from
// the Deployment rather than taking from the ReplicaSet: kubectl's
// annotationsToSkip (k8s.io/kubectl pkg/polymorphichelpers/rollback.go), which is
// also the Deployment controller's.
var annotationsToSkip = map[string]bool{
	corev1.LastAppliedConfigAnnotation:          true,
	vocab.RevisionAnnotation:                    true,
	"deployment.kubernetes.io/revision-history": true,
	"deployment.kubernetes.io/desired-replicas": true,
	"deployment.kubernetes.io/max-replicas":     true,
	appsv1.DeprecatedRollbackTo:                 true,
}

// RollbackAnnotations returns the Deployment's annotations after a rollback to
// rs, as `kubectl rollout undo` computes them: the annotations kubectl skips are
// kept from the Deployment, everything else is replaced by the ReplicaSet's
// annotations (which the Deployment controller copied from the Deployment when
// the ReplicaSet was its newRS, so change-cause and friends go back too).
//
// One departure, for the guard's own domain: its annotations on the Deployment
// are kept from the Deployment, and those on the ReplicaSet are not copied. The
// ReplicaSet's copies are stale (an older quarantine list, an older opt-out or
// protection). An earlier release's marks go (isLegacyMark).
func RollbackAnnotations(d *appsv1.Deployment, rs *appsv1.ReplicaSet) map[string]string {
	out := map[string]string{}
	for k, v := range d.Annotations {
		if annotationsToSkip[k] || (isGuardAnnotation(k) && !isLegacyMark(k)) {
			out[k] = v
		}
	}
	for k, v := range rs.Annotations {
		if !annotationsToSkip[k] && !isGuardAnnotation(k) {
			out[k] = v
		}
	}
	return out
}

func isGuardAnnotation(k string) bool { return strings.HasPrefix(k, vocab.Domain+"/") }

// isLegacyMark reports an annotation in which an earlier release kept a
// fact now in the ledger: a rollback drops it, so that nothing copies it on.
func isLegacyMark(k string) bool {
	switch k {
	case vocab.LegacyAnnotationKnownGood, vocab.LegacyAnnotationKnownGoodHash, vocab.LegacyAnnotationKnownGoodRevision,
		vocab.LegacyAnnotationRolledBackRevision, vocab.LegacyAnnotationRolledBackTo, vocab.LegacyAnnotationFailFastRevision,
		vocab.LegacyAnnotationHandledDeadline, vocab.LegacyAnnotationFailingSince:
		return true
	}
	return false
}

// restoredAlready turns a rollback into a hold: the template it would write
// is the failing one, which an earlier rollback restored.
func (d Decision) restoredAlready() Decision {
	out := d
	out.Action, out.Reason = ActionHold, ReasonRollbackLoop
	out.Message = fmt.Sprintf("Revision %d (ReplicaSet %s) %s, but it is known-good revision %d (ReplicaSet %s) as the guard restored it, with its config; stopped to avoid a rollback loop. The failure is likely outside the template and its config.",
		d.FailedRevision, d.NewRS.Name, d.failedHow(), d.TargetRevision, d.Target.Name)
	return out
}

// refusedByPolicy turns a rollback into a hold: the policies in force refuse
// the known-good template (refusals, one line each). The guard never restores
// what the tenant could not apply itself.
func (d Decision) refusedByPolicy(refusals []string) Decision {
	out := d
	out.Action, out.Reason = ActionHold, ReasonRollbackRefused
	out.Message = fmt.Sprintf("Revision %d (ReplicaSet %s) %s; known-good revision %d (ReplicaSet %s) is refused by the policies in force, so nothing is restored: %s. Apply a template that fixes the failure and passes the policies.",
		d.FailedRevision, d.NewRS.Name, d.failedHow(), d.TargetRevision, d.Target.Name, strings.Join(refusals, "; "))
	return out
}

// autoRollbackOptedOut reports whether the Deployment's annotation turns
// automatic rollback off. Only a value that parses as false does (strconv rules:
// "false", "False", "0", …); anything else leaves the guard on.
func autoRollbackOptedOut(d *appsv1.Deployment) bool {
	v, ok := d.Annotations[vocab.AnnotationAutoRollback]
	if !ok {
		return false
	}
	on, err := strconv.ParseBool(strings.TrimSpace(v))
	return err == nil && !on
}

// failedReplicaSetName returns the ReplicaSet named by a
// ProgressDeadlineExceeded message: upstream's (syncRolloutStatus)
//
//	ReplicaSet "web-5d8f7c9b4" has timed out progressing.
//
// or the guard's own (DeclaredFailureMessage). An unrecognised message
// (another format, or the "Deployment %q" variant used when there was no
// newRS) gives false, and the check is skipped.
func failedReplicaSetName(msg string) (string, bool) {
	if name, _, ok := declaredFailure(msg); ok {
		return name, true
	}
	rest, ok := strings.CutPrefix(msg, "ReplicaSet ")
	if !ok {
		return "", false
	}
	quoted, ok := strings.CutSuffix(rest, " has timed out progressing.")
	if !ok {
		return "", false
	}
	name, err := strconv.Unquote(quoted)
	if err != nil {
		return "", false
	}
	return name, true
}

// declaredFailureVerb is what tells the guard's ProgressDeadlineExceeded
// message from upstream's "has timed out progressing.".
const declaredFailureVerb = " has failed progressing: "

// DeclaredFailureMessage is the message of the Progressing=False condition,
// reason ProgressDeadlineExceeded, with which fail-fast declares the newRS
// failed before its deadline, in upstream's form:
//
//	ReplicaSet "web-5d8f7c9b4" has failed progressing: 2/2 new pods ImagePullBackOff for 1m0s (container web, image shop:1.4-typo).
func DeclaredFailureMessage(rs, evidence string) string {
	return "ReplicaSet " + strconv.Quote(rs) + declaredFailureVerb + evidence + "."
}

// declaredFailure parses DeclaredFailureMessage.
func declaredFailure(msg string) (rs, evidence string, ok bool) {
	rest, ok := strings.CutPrefix(msg, "ReplicaSet ")
	if !ok {
		return "", "", false
	}
	quoted, evidence, ok := strings.Cut(rest, declaredFailureVerb)
	if !ok {
		return "", "", false
	}
	rs, err := strconv.Unquote(quoted)
	evidence = strings.TrimSuffix(evidence, ".")
	if err != nil || evidence == "" {
		return "", "", false
	}
	return rs, evidence, true
}
