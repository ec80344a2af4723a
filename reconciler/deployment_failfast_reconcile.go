package reconciler

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
)

// FailFastPollInterval is how often the new pods of a rollout in progress are
// looked at. Pods are not watched (a watch of every pod would cache the
// cluster's largest population); a change of the newRS's status (a pod
// becoming ready) brings the Deployment back sooner.
const FailFastPollInterval = 5 * time.Second

// failFastFor returns the fail-fast options that apply to d, and whether
// fail-fast is on for it.
func (r *DeploymentReconciler) failFastFor(d *appsv1.Deployment) (FailFastOptions, bool) {
	o := r.Options.FailFast
	v, ok := d.Annotations[vocab.AnnotationFailFast]
	if !ok {
		return o, o.Enabled
	}
	v = strings.TrimSpace(v)
	if on, err := strconv.ParseBool(v); err == nil {
		return o, on && o.Window > 0
	}
	if w, err := time.ParseDuration(v); err == nil && w > 0 {
		o.Window = w
		return o, true
	}
	return o, o.Enabled // an unreadable value changes nothing
}

// RolloutInProgress returns the newRS of a rollout fail-fast may judge: the
// Deployment controller has seen the current generation, the rollout is not
// complete, not paused, not at zero replicas, not past its deadline (the
// deadline's own path decides then), its newRS is not known-good (a revision
// that completed before does not fail for its template) and fail-fast has not
// decided about it yet.
func RolloutInProgress(d *appsv1.Deployment, rss []*appsv1.ReplicaSet) *appsv1.ReplicaSet {
	if d.Spec.Paused || rollout.Replicas(d) == 0 || d.Status.ObservedGeneration != d.Generation || IsComplete(d) {
		return nil
	}
	if c := rollout.ProgressingCondition(d); c != nil && c.Reason == vocab.ProgressDeadlineExceeded {
		return nil
	}
	newRS := rollout.FindNewReplicaSet(d, rss)
	ledger, _ := rollout.ReadLedger(d)
	if newRS == nil || ledger.IsKnownGood(newRS) || newRS.DeletionTimestamp != nil {
		return nil
	}
	rev, err := rollout.Revision(newRS)
	if err != nil || rev == 0 || ledger.RolledBackRevision == rev || ledger.FailFastRevision == rev {
		return nil
	}
	return newRS
}

// failingSince reads the ledger's FailingSince for the ReplicaSet named rs;
// zero when it is absent, unreadable or about another ReplicaSet.
func failingSince(d *appsv1.Deployment, rs string) time.Time {
	l, _ := rollout.ReadLedger(d)
	return l.FailingSinceOf(rs)
}

// reconcileFailFast judges a rollout in progress by its new pods (see
// DecideFailFast), records when failure evidence was first seen, and when it
// has held for the window rolls back as on a deadline, or reports it. It
// returns when to look again.
func (r *DeploymentReconciler) reconcileFailFast(ctx context.Context, d *appsv1.Deployment, rss []*appsv1.ReplicaSet) (time.Duration, error) {
	o, on := r.failFastFor(d)
	if on && d.Status.ObservedGeneration != d.Generation && !d.Spec.Paused && rollout.Replicas(d) > 0 {
		// The Deployment controller has not caught up (a scale, an HPA's or
		// kubectl's): nothing is known yet, so the window keeps its start. Its
		// status update brings the Deployment back. Clearing it here would let
		// a Deployment scaled more often than the window never fail fast.
		return 0, nil
	}
	newRS := RolloutInProgress(d, rss)
	if !on || newRS == nil {
		if deferralStands(d, rss) || ShouldRollBack(d, rss, r.Options).Action == ActionRollBack {
			// Past the deadline, a rollback the deadline's path holds for a
			// registry blip: its window started at this record.
			return 0, nil
		}
		return 0, r.setFailingSince(ctx, d, "")
	}
	pods, err := r.newPods(ctx, d, newRS)
	if err != nil {
		return 0, err
	}
	now := r.Clock.Now()
	states := make([]PodState, 0, len(pods))
	for i := range pods {
		states = append(states, PodStateOf(&pods[i], now, o))
	}
	v := DecideFailFast(FailFastInput{Now: now, Pods: states, FailingSince: failingSince(d, newRS.Name), Window: o.Window,
		TransientWindow: o.TransientWindow, MinFailingPods: o.MinFailingPods})
	switch {
	case !v.Failing:
		return FailFastPollInterval, r.setFailingSince(ctx, d, "")
	case !v.Failed:
		if failingSince(d, newRS.Name).IsZero() {
			if err := r.setFailingSince(ctx, d, rollout.FailingSinceValue(v.Since, newRS.Name)); err != nil {
				return 0, err
			}
			ctrl.LoggerFrom(ctx).Info("New pods show failure evidence; fail-fast window started", "replicaSet", klog.KObj(newRS),
				"reason", v.Evidence[0].Reason, "class", v.Class, "window", v.Window.String(), "evidence", FailFastSummary(v, now))
		}
		return min(v.RequeueAfter, FailFastPollInterval), nil
	}
	return 0, r.failRevision(ctx, d, rss, newRS, v)
}

// newPods lists, from the API server, the pods of the newRS that are not
// terminating: only for rollouts in progress, so that what the guard reads
// grows with the rollouts under way, not with the cluster's pods.
func (r *DeploymentReconciler) newPods(ctx context.Context, d *appsv1.Deployment, newRS *appsv1.ReplicaSet) ([]corev1.Pod, error) {
	sel, err := selectorOf(d)
	if err != nil {
		return nil, err
	}
	if hash := newRS.Labels[appsv1.DefaultDeploymentUniqueLabelKey]; hash != "" {
		req, err := labels.NewRequirement(appsv1.DefaultDeploymentUniqueLabelKey, selection.Equals, []string{hash})
		if err != nil {
			return nil, err
		}
		sel = sel.Add(*req)
	}
	var list corev1.PodList
	if err := r.APIReader.List(ctx, &list, client.InNamespace(d.Namespace), client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return nil, fmt.Errorf("listing the new pods of Deployment %s: %w", d.Name, err)
	}
	out := list.Items[:0]
	for _, p := range list.Items {
		if ref := metav1.GetControllerOf(&p); ref != nil && ref.UID == newRS.UID && p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	return out, nil
}

// setFailingSince records in the ledger when failure evidence was first seen
// (forgets it when v is empty), only when that changes it.
func (r *DeploymentReconciler) setFailingSince(ctx context.Context, d *appsv1.Deployment, v string) error {
	if l, _ := rollout.ReadLedger(d); l.FailingSince == v {
		return nil
	}
	if _, err := r.updateLedger(ctx, d, func(l rollout.Ledger) rollout.Ledger { l.FailingSince = v; return l }); err != nil {
		return fmt.Errorf("recording when failure evidence was first seen: %w", err)
	}
	return nil
}

// failRevision acts on a revision fail-fast found failing. With a
// known-good revision to go to, it declares the revision failed in
// upstream's words (declareFailed), so that every client watching the
// rollout fails on it as it would at the deadline; the rollback phase, which
// runs next in the same pass, acts on it as on a deadline (reconcileRollback:
// same target, quarantine, exactly once), and after a restart it finds the
// declaration and does the same. Without a
// target, or with automatic rollback off, it reports the failure once and
// declares nothing: the Deployment then fails at its deadline as upstream's
// does. The decision is taken again on the Deployment as the API server has
// it.
func (r *DeploymentReconciler) failRevision(ctx context.Context, d *appsv1.Deployment, rss []*appsv1.ReplicaSet, newRS *appsv1.ReplicaSet, v FailFastVerdict) error {
	log := ctrl.LoggerFrom(ctx).WithValues("replicaSet", klog.KObj(newRS), "reason", v.Evidence[0].Reason)
	fresh := &appsv1.Deployment{}
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(d), fresh); err != nil {
		return fmt.Errorf("reading Deployment %s: %w", d.Name, err)
	}
	*d = *fresh
	now := r.Clock.Now()
	since := failingSince(d, newRS.Name)
	if RolloutInProgress(d, rss) != newRS || since.IsZero() || now.Sub(since) < v.Window {
		// Changed since the cache saw it; the watch event brings it back.
		return nil
	}
	failedRevision, _ := rollout.Revision(newRS)
	summary := FailFastSummary(v, now)
	rollBack := r.Options.AutoRollback && !autoRollbackOptedOut(d)

	if rollBack && KnownGoodTarget(d, rss) != nil {
		// Declared here; the rollback phase, which runs next, acts on it.
		if err := r.declareFailed(ctx, d, newRS, summary, now); err != nil {
			return err
		}
		r.Metrics.failFastDecisions.WithLabelValues(v.Evidence[0].Reason, resultRolledBack).Inc()
		r.Metrics.failFastReaction.Observe(now.Sub(since).Seconds())
		log.Info("Declared a failing rollout failed; the rollback phase rolls it back to its known-good revision", "failedRevision", failedRevision, "evidence", summary)
		return nil
	}

	var message, result string
	if rollBack {
		message = fmt.Sprintf("Revision %d (ReplicaSet %s) is failing: %s; %s, so it is left as it is.",
			failedRevision, newRS.Name, summary, noTargetWhy(d, rss))
		result = resultNoKnownGood
	} else {
		message = fmt.Sprintf("Revision %d (ReplicaSet %s) is failing: %s; automatic rollback is off for this Deployment.",
			failedRevision, newRS.Name, summary)
		result = resultReported
	}
	// The decision first (once, in the ledger), then its words for people.
	if _, err := r.updateLedger(ctx, d, func(l rollout.Ledger) rollout.Ledger {
		l.FailFastRevision, l.FailingSince = failedRevision, ""
		return l
	}); err != nil {
		if apierrors.IsConflict(err) {
			r.Metrics.rollbacks.WithLabelValues(resultConflict).Inc()
		}
		return fmt.Errorf("recording the fail-fast decision about revision %d: %w", failedRevision, err)
	}
	r.writeRollbackStatus(ctx, d, message)
	r.Metrics.failFastDecisions.WithLabelValues(v.Evidence[0].Reason, result).Inc()
	if result == resultNoKnownGood {
		r.Metrics.rollbacks.WithLabelValues(resultNoKnownGood).Inc()
		log.Info("Rollout failing and no known-good revision", "failedRevision", failedRevision, "evidence", summary)
		r.emitRollbackWarningEvent(d, vocab.ReasonNoKnownGoodRevision, message)
		return nil
	}
	log.Info("Rollout failing; automatic rollback off", "failedRevision", failedRevision, "evidence", summary)
	r.emitRollbackWarningEvent(d, vocab.ReasonRolloutFailing, message)
	return nil
}

// declareFailed sets the Deployment's Progressing condition to False, reason
// ProgressDeadlineExceeded, with the evidence in the message
// (DeclaredFailureMessage): the failure language every deploying tool
// already reads (kubectl rollout status, kstatus, Argo CD). It is a status
// write conditional on the resourceVersion read, so it never replaces a
// condition the Deployment controller wrote since; d takes the result.
func (r *DeploymentReconciler) declareFailed(ctx context.Context, d *appsv1.Deployment, newRS *appsv1.ReplicaSet, evidence string, now time.Time) error {
	patch := client.MergeFromWithOptions(d.DeepCopy(), client.MergeFromWithOptimisticLock{})
	rollout.SetCondition(&d.Status, appsv1.DeploymentCondition{
		Type: appsv1.DeploymentProgressing, Status: corev1.ConditionFalse, Reason: vocab.ProgressDeadlineExceeded,
		Message: DeclaredFailureMessage(newRS.Name, evidence),
	}, now)
	if err := r.Client.Status().Patch(ctx, d, patch); err != nil {
		return fmt.Errorf("declaring revision %s failed: %w", newRS.Annotations[vocab.RevisionAnnotation], err)
	}
	return nil
}

// noTargetWhy says why there is no known-good revision to roll back to.
func noTargetWhy(d *appsv1.Deployment, rss []*appsv1.ReplicaSet) string {
	if _, why := FindKnownGoodTarget(d, rss); why != "" {
		return why + " (the guard restores only the newest known-good revision)"
	}
	return "no known-good revision to roll back to"
}
