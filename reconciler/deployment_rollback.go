package reconciler

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

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

// reconcileRollback acts on ShouldRollBack's decision. Every write carries the
// resourceVersion that was read, so it never overwrites a change it has not
// seen; on a conflict the request is retried and decided again from a fresh
// read. Events are emitted after the write has succeeded, so each decision is
// told once.
func (r *DeploymentReconciler) reconcileRollback(ctx context.Context, d *appsv1.Deployment, rss []*appsv1.ReplicaSet) (time.Duration, error) {
	dec := ShouldRollBack(d, rss, r.Options)
	var err error
	log := ctrl.LoggerFrom(ctx)
	if dec.Action == ActionNone {
		if dec.Reason != ReasonRolloutNotFailed {
			log.V(4).Info("Not acting on failed rollout", "reason", dec.Reason, "failedRevision", dec.FailedRevision)
		}
		return 0, nil
	}
	// The cache holds Deployments and ReplicaSets without their pod templates
	// (CacheOptions). A decision to write is taken again on the Deployment as
	// the API server has it, and the template restored is the target's as the
	// API server has it; the write carries the resourceVersion of that read.
	if dec, err = r.decideOnFresh(ctx, d, rss); err != nil {
		return 0, err
	}
	if dec.Action == ActionNone {
		return 0, nil
	}
	if dec.Action == ActionRollBack && r.Installed != nil {
		// Uninstalled (the webhook configurations are gone) while this
		// replica still runs: a rollback now would leave a verdict that
		// nothing ends any more.
		installed, err := r.Installed(ctx)
		if err != nil {
			return 0, fmt.Errorf("checking that the guard is installed: %w", err)
		}
		if !installed {
			log.Info("Not rolling back: the guard's webhook configuration is gone (uninstall)", "failedRevision", dec.FailedRevision)
			return 0, nil
		}
	}
	if dec.Action == ActionRollBack && dec.Evidence == "" {
		// Upstream's deadline, not fail-fast's declaration (which weighed
		// the evidence's class already): a registry blip is waited out.
		h, err := r.transientHold(ctx, d, dec)
		if err != nil {
			return 0, err
		}
		if h.Wait > 0 {
			return h.Wait, r.deferRollback(ctx, d, dec, h)
		}
		if suffix := h.RollbackSuffix(); suffix != "" {
			dec.Message = strings.TrimSuffix(dec.Message, ".") + suffix + "."
		}
	}
	if dec.Action == ActionRollBack {
		// The config the known-good revision ran with, where it drifted.
		tmpl, plan, err := r.restoredTemplate(ctx, d, dec.Target)
		if err != nil {
			return 0, err
		}
		dec.Template = tmpl
		if s := plan.Sentence(); s != "" {
			dec.Message += s
		}
		if vocab.TemplateHash(tmpl) == rollout.TemplateHash(&d.Spec.Template) {
			// The failing revision is the one an earlier rollback restored
			// with its config (a template of its own, so never known-good
			// yet): restoring it again would change nothing.
			dec = dec.restoredAlready()
		}
	}
	if dec.Action == ActionRollBack && r.Judge != nil {
		// The template actually written is the one judged.
		restored := d.DeepCopy()
		restored.Spec.Template = *dec.Template
		restored.Annotations = RollbackAnnotations(d, dec.Target)
		refusals, err := r.Judge.JudgeRollback(ctx, restored, d)
		if err != nil {
			// Nothing is written before the judge can tell: a rollback
			// restored under the guard's identity, judged by fewer policies
			// than are in force, could bring back what one refuses.
			log.Info("The rollback waits for the policies in force", "reason", "PoliciesNotLoaded", "error", err.Error())
			return judgeRetry, nil
		}
		if len(refusals) > 0 {
			dec = dec.refusedByPolicy(refusals)
		}
	}
	log = log.WithValues("reason", dec.Reason, "failedRevision", dec.FailedRevision, "replicaSet", klog.KObj(dec.NewRS))
	var pending rollout.PendingRollback
	if dec.Action == ActionRollBack {
		// Told before it is done: once the template is restored the
		// Deployment controller reports the rollout complete within
		// seconds, and no deploying tool may read that as the failed
		// revision's success (reconcileVerdict). The same status write
		// records the rollback as pending, settled once it is made.
		pending = rollout.PendingRollback{
			FailedRevision: dec.FailedRevision, To: dec.Target.Name, Template: vocab.TemplateHash(dec.Template),
			Deadline: dec.Deadline.LastTransitionTime.UTC().Format(time.RFC3339), FailFast: dec.Evidence != "",
		}
		if _, err := r.reportRollbackPending(ctx, d, rollout.StalledMessage(d, dec.Message, rollout.FormatRevision(dec.FailedRevision)), &pending); err != nil {
			if apierrors.IsConflict(err) {
				r.Metrics.rollbacks.WithLabelValues(resultConflict).Inc()
			}
			return 0, err
		}
	}

	// The rollback was recorded as pending with its report; now the template
	// and annotations, then the ledger settles it. A guard stopped between
	// them settles it on its next pass (reconcilePending): made if the
	// Deployment runs the restored template, dropped and decided again if not.
	var failedHash string
	if dec.Action == ActionRollBack {
		patch := client.MergeFromWithOptions(d.DeepCopy(), client.MergeFromWithOptimisticLock{})
		// The failed template is the Deployment's as read, hashed the way the
		// validating webhook hashes the template a GitOps tool applies again.
		failedHash = vocab.TemplateHash(&d.Spec.Template)
		d.Spec.Template = *dec.Template.DeepCopy()
		d.Annotations = RollbackAnnotations(d, dec.Target)
		setLabel(d, vocab.LabelRolledBack, rollout.FormatRevision(dec.FailedRevision))
		d.Annotations[vocab.AnnotationQuarantinedTemplates] = FormatTemplateList(
			AddQuarantined(vocab.QuarantinedTemplates(d), failedHash, r.Options.QuarantineLimit))
		AlignQuarantineLabel(d)
		d.Annotations[vocab.AnnotationRollbackStatus] = dec.Message
		if err = r.Client.Patch(ctx, d, patch, client.FieldOwner(FieldManager)); err != nil {
			if apierrors.IsConflict(err) {
				r.Metrics.rollbacks.WithLabelValues(resultConflict).Inc()
				log.V(2).Info("Deployment changed since it was read; deciding again")
				return 0, fmt.Errorf("deployment changed while deciding about revision %d: %w", dec.FailedRevision, err)
			}
			if landed, ok := r.rollbackLanded(ctx, d, err, dec); ok {
				// A time-out or a dropped connection after the API server had
				// applied the write: it is done, and told once, as a success.
				log.Info("The rollback's write succeeded though its response was lost", "error", err.Error())
				*d = *landed
				err = nil
			}
		}
		if err != nil {
			r.Metrics.rollbacks.WithLabelValues(resultFailed).Inc()
			r.emitRollbackWarningEvent(d, vocab.ReasonRollbackFailed, fmt.Sprintf("Rolling back from revision %d to known-good revision %d failed: %v", dec.FailedRevision, dec.TargetRevision, err))
			return 0, fmt.Errorf("rolling back revision %d: %w", dec.FailedRevision, err)
		}
	}
	handled := dec.Deadline.LastTransitionTime.UTC().Format(time.RFC3339)
	if _, err = r.updateLedger(ctx, d, func(l rollout.Ledger) rollout.Ledger {
		if dec.Action == ActionRollBack {
			return l.Settled(pending)
		}
		l.HandledDeadline = handled
		return l
	}); err != nil {
		if dec.Action == ActionRollBack {
			// Rolled back, and not recorded: the next pass finds the
			// deadline stale and the verdict unreported; say so.
			r.emitRollbackWarningEvent(d, vocab.ReasonRollbackFailed, fmt.Sprintf("Rolled back from revision %d, but could not record it: %v", dec.FailedRevision, err))
		}
		return 0, fmt.Errorf("recording decision %s about revision %d: %w", dec.Reason, dec.FailedRevision, err)
	}
	if dec.Action == ActionHold && d.Annotations[vocab.AnnotationRollbackStatus] != dec.Message {
		// In words, for people (kubectl describe, deployguard status); the
		// decision itself is the ledger's.
		patch := client.MergeFrom(d.DeepCopy())
		if d.Annotations == nil {
			d.Annotations = map[string]string{}
		}
		d.Annotations[vocab.AnnotationRollbackStatus] = dec.Message
		if err := r.Client.Patch(ctx, d, patch, client.FieldOwner(FieldManager)); err != nil {
			log.Info("Could not write the decision's message on the Deployment", "error", err.Error())
		}
	}

	switch dec.Reason {
	case ReasonAutoRollback:
		r.releaseTemplate(ctx, d)
		r.Metrics.rollbacks.WithLabelValues(resultRolledBack).Inc()
		if reaction := r.Clock.Since(dec.Deadline.LastTransitionTime.Time); reaction >= 0 {
			r.Metrics.rollbackReaction.Observe(reaction.Seconds())
		}
		if l, _ := rollout.ReadLedger(d); l.Checks != nil {
			if first, ok := l.Checks.FirstFailedTime(); ok && l.Checks.Revision == dec.FailedRevision {
				r.Metrics.checkReaction.Observe(r.Clock.Since(first).Seconds())
			}
		}
		log.Info("Rolled back to known-good revision", "targetRevision", dec.TargetRevision, "target", klog.KObj(dec.Target))
		r.emitRollbackNormalEvent(d, dec.Target, dec.Message)
	case ReasonNoKnownGoodRevision:
		r.Metrics.rollbacks.WithLabelValues(resultNoKnownGood).Inc()
		log.Info("Rollout failed and there is no known-good revision")
		r.emitRollbackWarningEvent(d, vocab.ReasonNoKnownGoodRevision, dec.Message)
	case ReasonRollbackLoop:
		r.Metrics.rollbacks.WithLabelValues(resultLoopStopped).Inc()
		log.Info("Known-good revision failed too; not rolling back")
		r.emitRollbackWarningEvent(d, vocab.ReasonRollbackLoop, dec.Message)
	case ReasonPaused:
		log.Info("Rollout failed on a paused Deployment; left alone")
	case ReasonRollbackRefused:
		r.Metrics.rollbacks.WithLabelValues(resultRefused).Inc()
		log.Info("Not rolling back: the policies in force refuse the known-good template", "targetRevision", dec.TargetRevision, "target", klog.KObj(dec.Target))
		r.emitRollbackWarningEvent(d, vocab.ReasonRollbackRefused, dec.Message)
	}
	return 0, nil
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

// rollbackLanded reads the Deployment from the API server after a rollback
// write that failed without a conflict, and reports whether the write was
// applied all the same: the restored template and the rollback's message are
// on the Deployment as the API server has it.
func (r *DeploymentReconciler) rollbackLanded(ctx context.Context, want *appsv1.Deployment, err error, dec Decision) (*appsv1.Deployment, bool) {
	if !outcomeUnknown(err) {
		return nil, false
	}
	fresh := &appsv1.Deployment{}
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(want), fresh); err != nil {
		return nil, false
	}
	if fresh.Annotations[vocab.AnnotationRollbackStatus] != dec.Message || rollout.TemplateHash(&fresh.Spec.Template) != vocab.TemplateHash(dec.Template) {
		return nil, false
	}
	return fresh, true
}

// outcomeUnknown reports an error after which a write may have been applied:
// no answer from the API server (a dropped connection, the client's time-out)
// or one that says it did not finish in time. An answer that refuses the
// write (not found, invalid, forbidden, conflict) says it was not.
func outcomeUnknown(err error) bool {
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return true
	}
	return apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err) || apierrors.IsInternalError(err)
}

// decideOnFresh reads the Deployment from the API server into d, decides
// again on it, and reads the rollback target from the API server too, so that
// the template restored is whole.
func (r *DeploymentReconciler) decideOnFresh(ctx context.Context, d *appsv1.Deployment, rss []*appsv1.ReplicaSet) (Decision, error) {
	fresh := &appsv1.Deployment{}
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(d), fresh); err != nil {
		return Decision{}, fmt.Errorf("reading Deployment %s: %w", d.Name, err)
	}
	*d = *fresh
	dec := ShouldRollBack(d, rss, r.Options)
	if dec.Action != ActionRollBack {
		return dec, nil
	}
	target := &appsv1.ReplicaSet{}
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(dec.Target), target); err != nil {
		return Decision{}, fmt.Errorf("reading the known-good ReplicaSet %s: %w", dec.Target.Name, err)
	}
	if target.UID != dec.Target.UID || !IsKnownGood(d, target) || rollout.TemplateHash(&target.Spec.Template) != rollout.TemplateHash(&dec.Target.Spec.Template) {
		// Replaced or changed since the cache saw it: decided again on the
		// watch event that tells of it.
		return Decision{}, apierrors.NewConflict(appsv1.Resource("replicasets"), target.Name, fmt.Errorf("changed since it was read"))
	}
	dec.Target = target
	return dec, nil
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

// reconcilePending settles a rollback recorded as pending by a guard that
// stopped before it settled it: made, if the Deployment runs the restored
// template (the ledger then records it as a rollback written now would);
// not made otherwise (the pending record goes, and the rollback phase decides
// again).
func (r *DeploymentReconciler) reconcilePending(ctx context.Context, d *appsv1.Deployment, _ []*appsv1.ReplicaSet) error {
	l, _ := rollout.ReadLedger(d)
	if l.Pending == nil {
		return nil
	}
	p := *l.Pending
	made := rollout.TemplateHash(&d.Spec.Template) == p.Template
	if _, err := r.updateLedger(ctx, d, func(l rollout.Ledger) rollout.Ledger {
		if l.Pending == nil || *l.Pending != p {
			return l
		}
		if made {
			return l.Settled(p)
		}
		l.Pending = nil
		return l
	}); err != nil {
		return fmt.Errorf("settling the rollback of revision %d: %w", p.FailedRevision, err)
	}
	ctrl.LoggerFrom(ctx).Info("Settled a rollback an earlier pass left pending", "failedRevision", p.FailedRevision, "target", p.To, "made", made)
	return nil
}
