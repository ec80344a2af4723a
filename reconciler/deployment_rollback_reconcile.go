package reconciler

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
)

// reconcileRollback acts on ShouldRollBack's decision, in named steps:
//
//  1. decideOnFresh: decided again on the Deployment and the target as the
//     API server has them (the cache holds them without pod templates);
//  2. rollbackGates: each may defer a rollback or turn it into a hold
//     (uninstalled, a transient failure waited out, the config restored
//     already, the policies in force);
//  3. rollBack or hold: the writes, each carrying the resourceVersion that
//     was read, so that none overwrites a change it has not seen (on a
//     conflict the request is retried and decided again from a fresh read);
//  4. tellDecision: Events and metrics, after the writes succeeded, so each
//     decision is told once.
//
// Fail-fast and a failed metric check arrive here as a declared failure
// (ShouldRollBack), so that all three share this one path.
func (r *DeploymentReconciler) reconcileRollback(ctx context.Context, d *appsv1.Deployment, rss []*appsv1.ReplicaSet) (time.Duration, error) {
	if dec := ShouldRollBack(d, rss, r.Options); dec.Action == ActionNone {
		if dec.Reason != ReasonRolloutNotFailed {
			ctrl.LoggerFrom(ctx).V(4).Info("Not acting on failed rollout", "reason", dec.Reason, "failedRevision", dec.FailedRevision)
		}
		return 0, nil
	}
	dec, err := r.decideOnFresh(ctx, d, rss)
	if err != nil || dec.Action == ActionNone {
		return 0, err
	}
	if dec.Action == ActionRollBack {
		var wait time.Duration
		if dec, wait, err = r.rollbackGates(ctx, d, dec); err != nil || wait > 0 || dec.Action == ActionNone {
			return wait, err
		}
	}
	if dec.Action == ActionRollBack {
		err = r.rollBack(ctx, d, dec)
	} else {
		err = r.hold(ctx, d, dec)
	}
	if err != nil {
		return 0, err
	}
	r.tellDecision(ctx, d, dec)
	return 0, nil
}

// rollbackGate looks at a rollback before it is written: it passes it on,
// turns it into a hold or into nothing, or defers it (wait > 0).
type rollbackGate func(ctx context.Context, d *appsv1.Deployment, dec Decision) (Decision, time.Duration, error)

// rollbackGates passes a rollback through the gates in order; the first that
// does not pass it on decides.
func (r *DeploymentReconciler) rollbackGates(ctx context.Context, d *appsv1.Deployment, dec Decision) (Decision, time.Duration, error) {
	for _, gate := range []rollbackGate{r.gateInstalled, r.gateTransient, r.gateRestoredConfig, r.gatePolicies} {
		var wait time.Duration
		var err error
		if dec, wait, err = gate(ctx, d, dec); err != nil || wait > 0 || dec.Action != ActionRollBack {
			return dec, wait, err
		}
	}
	return dec, 0, nil
}

// gateInstalled: uninstalled (the webhook configurations are gone) while
// this replica still runs, a rollback would leave a verdict that nothing
// ends any more.
func (r *DeploymentReconciler) gateInstalled(ctx context.Context, _ *appsv1.Deployment, dec Decision) (Decision, time.Duration, error) {
	if r.Installed == nil {
		return dec, 0, nil
	}
	installed, err := r.Installed(ctx)
	if err != nil {
		return dec, 0, fmt.Errorf("checking that the guard is installed: %w", err)
	}
	if !installed {
		ctrl.LoggerFrom(ctx).Info("Not rolling back: the guard's webhook configuration is gone (uninstall)", "failedRevision", dec.FailedRevision)
		return Decision{Action: ActionNone, Reason: dec.Reason}, 0, nil
	}
	return dec, 0, nil
}

// gateTransient waits out a registry blip on upstream's deadline. Fail-fast's
// declaration and a metric check's failure weighed their evidence already.
func (r *DeploymentReconciler) gateTransient(ctx context.Context, d *appsv1.Deployment, dec Decision) (Decision, time.Duration, error) {
	if dec.Evidence != "" {
		return dec, 0, nil
	}
	h, err := r.transientHold(ctx, d, dec)
	if err != nil {
		return dec, 0, err
	}
	if h.Wait > 0 {
		return dec, h.Wait, r.deferRollback(ctx, d, dec, h)
	}
	if suffix := h.RollbackSuffix(); suffix != "" {
		dec.Message = strings.TrimSuffix(dec.Message, ".") + suffix + "."
	}
	return dec, 0, nil
}

// gateRestoredConfig sets the template written: the target's, with the
// config the known-good revision ran with where it drifted. If that is the
// failing template (an earlier rollback restored it with its config, a
// template of its own, so never known-good yet), restoring it again would
// change nothing: a hold.
func (r *DeploymentReconciler) gateRestoredConfig(ctx context.Context, d *appsv1.Deployment, dec Decision) (Decision, time.Duration, error) {
	tmpl, plan, err := r.restoredTemplate(ctx, d, dec.Target)
	if err != nil {
		return dec, 0, err
	}
	dec.Template = tmpl
	dec.Message += plan.Sentence()
	if vocab.TemplateHash(tmpl) == rollout.TemplateHash(&d.Spec.Template) {
		return dec.restoredAlready(), 0, nil
	}
	return dec, 0, nil
}

// gatePolicies judges the template actually written by the policies in
// force; the guard never restores what the tenant could not apply itself.
func (r *DeploymentReconciler) gatePolicies(ctx context.Context, d *appsv1.Deployment, dec Decision) (Decision, time.Duration, error) {
	if r.Judge == nil {
		return dec, 0, nil
	}
	restored := d.DeepCopy()
	restored.Spec.Template = *dec.Template
	restored.Annotations = RollbackAnnotations(d, dec.Target)
	refusals, err := r.Judge.JudgeRollback(ctx, restored, d)
	if err != nil {
		// Nothing is written before the judge can tell: a rollback restored
		// under the guard's identity, judged by fewer policies than are in
		// force, could bring back what one refuses.
		ctrl.LoggerFrom(ctx).Info("The rollback waits for the policies in force", "reason", "PoliciesNotLoaded", "error", err.Error())
		return dec, judgeRetry, nil
	}
	if len(refusals) > 0 {
		return dec.refusedByPolicy(refusals), 0, nil
	}
	return dec, 0, nil
}

// rollBack writes a rollback in three steps: the report that it is pending,
// the template and annotations, then the ledger settles it. It is told before
// it is done: once the template is restored the Deployment controller reports
// the rollout complete within seconds, and no deploying tool may read that as
// the failed revision's success (reconcileVerdict). A guard stopped between
// the steps settles it on its next pass (reconcilePending): made if the
// Deployment runs the restored template, dropped and decided again if not.
func (r *DeploymentReconciler) rollBack(ctx context.Context, d *appsv1.Deployment, dec Decision) error {
	log := ctrl.LoggerFrom(ctx).WithValues("reason", dec.Reason, "failedRevision", dec.FailedRevision, "replicaSet", klog.KObj(dec.NewRS))
	pending := rollout.PendingRollback{
		FailedRevision: dec.FailedRevision, To: dec.Target.Name, Template: vocab.TemplateHash(dec.Template),
		Deadline: dec.Deadline.LastTransitionTime.UTC().Format(time.RFC3339), FailFast: dec.Evidence != "",
	}
	if _, err := r.reportRollbackPending(ctx, d, rollout.StalledMessage(d, dec.Message, rollout.FormatRevision(dec.FailedRevision)), &pending); err != nil {
		if apierrors.IsConflict(err) {
			r.Metrics.rollbacks.WithLabelValues(resultConflict).Inc()
		}
		return err
	}

	patch := client.MergeFromWithOptions(d.DeepCopy(), client.MergeFromWithOptimisticLock{})
	// The failed template is the Deployment's as read, hashed the way the
	// validating webhook hashes the template a GitOps tool applies again.
	failedHash := vocab.TemplateHash(&d.Spec.Template)
	d.Spec.Template = *dec.Template.DeepCopy()
	d.Annotations = RollbackAnnotations(d, dec.Target)
	setLabel(d, vocab.LabelRolledBack, rollout.FormatRevision(dec.FailedRevision))
	d.Annotations[vocab.AnnotationQuarantinedTemplates] = FormatTemplateList(
		AddQuarantined(vocab.QuarantinedTemplates(d), failedHash, r.Options.QuarantineLimit))
	AlignQuarantineLabel(d)
	setRollbackStatus(d, dec.Message)
	err := r.Client.Patch(ctx, d, patch, client.FieldOwner(FieldManager))
	if apierrors.IsConflict(err) {
		r.Metrics.rollbacks.WithLabelValues(resultConflict).Inc()
		log.V(2).Info("Deployment changed since it was read; deciding again")
		return fmt.Errorf("deployment changed while deciding about revision %d: %w", dec.FailedRevision, err)
	}
	if err != nil {
		if landed, ok := r.rollbackLanded(ctx, d, err, dec); ok {
			// A time-out or a dropped connection after the API server had
			// applied the write: it is done, and told once, as a success.
			log.Info("The rollback's write succeeded though its response was lost", "error", err.Error())
			*d, err = *landed, nil
		}
	}
	if err != nil {
		r.Metrics.rollbacks.WithLabelValues(resultFailed).Inc()
		r.emitRollbackWarningEvent(d, vocab.ReasonRollbackFailed, fmt.Sprintf("Rolling back from revision %d to known-good revision %d failed: %v", dec.FailedRevision, dec.TargetRevision, err))
		return fmt.Errorf("rolling back revision %d: %w", dec.FailedRevision, err)
	}

	if _, err := r.updateLedger(ctx, d, func(l rollout.Ledger) rollout.Ledger { return l.Settled(pending) }); err != nil {
		// Rolled back, and not recorded: the next pass finds the deadline
		// stale and the verdict unreported; say so.
		r.emitRollbackWarningEvent(d, vocab.ReasonRollbackFailed, fmt.Sprintf("Rolled back from revision %d, but could not record it: %v", dec.FailedRevision, err))
		return fmt.Errorf("recording decision %s about revision %d: %w", dec.Reason, dec.FailedRevision, err)
	}
	return nil
}

// hold records a decision to leave the template alone: in the ledger, once
// per deadline (the decision itself), then in words for people.
func (r *DeploymentReconciler) hold(ctx context.Context, d *appsv1.Deployment, dec Decision) error {
	handled := dec.Deadline.LastTransitionTime.UTC().Format(time.RFC3339)
	if _, err := r.updateLedger(ctx, d, func(l rollout.Ledger) rollout.Ledger {
		l.HandledDeadline = handled
		return l
	}); err != nil {
		return fmt.Errorf("recording decision %s about revision %d: %w", dec.Reason, dec.FailedRevision, err)
	}
	r.writeRollbackStatus(ctx, d, dec.Message)
	return nil
}

// tellDecision emits the decision's Event and counts it, once it is written.
func (r *DeploymentReconciler) tellDecision(ctx context.Context, d *appsv1.Deployment, dec Decision) {
	log := ctrl.LoggerFrom(ctx).WithValues("reason", dec.Reason, "failedRevision", dec.FailedRevision, "replicaSet", klog.KObj(dec.NewRS))
	switch dec.Reason {
	case ReasonAutoRollback:
		r.releaseTemplate(ctx, d)
		r.Metrics.rollbacks.WithLabelValues(resultRolledBack).Inc()
		if reaction := r.Clock.Since(dec.Deadline.LastTransitionTime.Time); reaction >= 0 {
			r.Metrics.rollbackReaction.Observe(reaction.Seconds())
		}
		if first, ok := checkFailedFirst(d, dec); ok {
			r.Metrics.checkReaction.Observe(r.Clock.Since(first).Seconds())
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
}

// setRollbackStatus is the one place the rollback-status annotation is set:
// what the guard last decided, in words for people (kubectl describe,
// deployguard status, the verdict's message). The decision itself is the
// ledger's. It reports whether the annotation changed.
func setRollbackStatus(d *appsv1.Deployment, message string) bool {
	if d.Annotations[vocab.AnnotationRollbackStatus] == message {
		return false
	}
	if d.Annotations == nil {
		d.Annotations = map[string]string{}
	}
	d.Annotations[vocab.AnnotationRollbackStatus] = message
	return true
}

// writeRollbackStatus writes the rollback-status annotation alone, after
// the ledger recorded the decision it tells of. A failure is logged, not
// returned: the decision stands, and retrying it would tell it twice.
func (r *DeploymentReconciler) writeRollbackStatus(ctx context.Context, d *appsv1.Deployment, message string) {
	patch := client.MergeFrom(d.DeepCopy())
	if !setRollbackStatus(d, message) {
		return
	}
	if err := r.Client.Patch(ctx, d, patch, client.FieldOwner(FieldManager)); err != nil {
		ctrl.LoggerFrom(ctx).Info("Could not write the decision's message on the Deployment", "error", err.Error())
	}
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
