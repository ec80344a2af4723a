package reconciler

import (
	"context"
	"fmt"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
)

// TransientHold is what the progress deadline's path does about a registry
// blip. Upstream's deadline does not look at why the new pods are not Ready:
// a Deployment whose progressDeadlineSeconds is shorter than the transient
// window would be rolled back during a blip that fail-fast itself waits out.
type TransientHold struct {
	// Wait is how long the rollback still waits; 0: roll back now.
	Wait time.Duration
	// Until is when the transient window ends, counted from Since, when the
	// evidence was first seen.
	Since, Until time.Time
	// Class is the new pods' evidence's (EvidenceClass), Causes its words.
	Class  string
	Causes []string
	Window time.Duration
}

// DecideTransientHold decides whether a rollback on the progress deadline
// waits: while the transient window, from since, has not ended, and either
// every piece of the new pods' evidence is a transient failure, or the
// rollback was already deferred (held) and the new pods show no evidence any
// more: the blip is over and they are starting or Ready, and upstream's
// condition has yet to say so. Any permanent or unclassified evidence rolls
// back at once; so does a deadline with no evidence that was never deferred
// (pods slow for reasons of their own). since zero is now.
func DecideTransientHold(pods []PodState, since, now time.Time, window time.Duration, held bool) TransientHold {
	var evidence []PodFailure
	for _, p := range pods {
		if p.Failure != nil {
			evidence = append(evidence, *p.Failure)
		}
	}
	h := TransientHold{Class: EvidenceClass(evidence), Window: window, Since: since}
	recovering := held && len(evidence) == 0
	if recovering {
		h.Class = ClassTransient
	}
	if h.Class != ClassTransient || window <= 0 {
		return h
	}
	if h.Since.IsZero() || h.Since.After(now) {
		h.Since = now
	}
	seen := map[string]bool{}
	for _, e := range evidence {
		if e.Cause != "" && !seen[e.Cause] {
			seen[e.Cause] = true
			h.Causes = append(h.Causes, e.Cause)
		}
	}
	h.Until = h.Since.Add(window)
	h.Wait = max(h.Until.Sub(now), 0)
	return h
}

// DeferMessage is the rollback-status and the Event while the hold lasts.
func (h TransientHold) DeferMessage(dec Decision) string {
	return fmt.Sprintf("%s (%s): not rolling back before %s, the end of the transient window of %s, in case the registry recovers.",
		deferredPrefix(dec), strings.Join(h.Causes, ", "), h.Until.UTC().Format(time.RFC3339), h.Window)
}

// deferredPrefix starts the rollback-status of a deferred rollback of dec's
// revision at dec's deadline: while it stands, the rollback is held. The
// deadline's time is in it, so that a later deadline of the same revision
// is never taken for one already deferred.
func deferredPrefix(dec Decision) string {
	at := ""
	if dec.Deadline != nil {
		at = " at " + dec.Deadline.LastTransitionTime.UTC().Format(time.RFC3339)
	}
	return fmt.Sprintf("Revision %d (ReplicaSet %s) exceeded its progress deadline%s, but its new pods fail only transiently", dec.FailedRevision, dec.NewRS.Name, at)
}

// deferralKey is what the ledger keeps of a deferral (Ledger.DeferredFor):
// the newRS and the deadline it was held at.
func deferralKey(rs *appsv1.ReplicaSet, deadline *appsv1.DeploymentCondition) string {
	at := ""
	if deadline != nil {
		at = deadline.LastTransitionTime.UTC().Format(time.RFC3339)
	}
	return rs.Name + " " + at
}

// deferralStands reports whether the deadline's path holds a rollback of
// d's newRS now: the ledger records a deferral at the deadline the
// Deployment still shows. Fail-fast then keeps the record of when the
// evidence was first seen, where the window starts.
func deferralStands(d *appsv1.Deployment, rss []*appsv1.ReplicaSet) bool {
	cond := rollout.ProgressingCondition(d)
	if cond == nil || cond.Reason != vocab.ProgressDeadlineExceeded {
		return false
	}
	newRS := rollout.FindNewReplicaSet(d, rss)
	if newRS == nil {
		return false
	}
	l, _ := rollout.ReadLedger(d)
	return heldBy(l, newRS, cond)
}

// heldBy reports whether the ledger holds rs's rollback at deadline. The
// release before this one kept the ReplicaSet's name alone: a hold it
// recorded still stands until its deadline's rollback is decided.
func heldBy(l rollout.Ledger, rs *appsv1.ReplicaSet, deadline *appsv1.DeploymentCondition) bool {
	return l.DeferredFor == deferralKey(rs, deadline) || l.DeferredFor == rs.Name
}

// RollbackSuffix is what a rollback after a whole transient window adds to
// its message.
func (h TransientHold) RollbackSuffix() string {
	if h.Class != ClassTransient {
		return ""
	}
	if len(h.Causes) == 0 {
		return fmt.Sprintf("; its new pods failed transiently, then were not Ready by the end of the transient window of %s", h.Window)
	}
	return fmt.Sprintf("; a transient failure (%s) for the whole transient window of %s", strings.Join(h.Causes, ", "), h.Window)
}

// transientHold reads the new pods of a rollout past its deadline and
// decides whether its rollback waits. The start of the window is
// fail-fast's record of when evidence was first seen, if it made one.
func (r *DeploymentReconciler) transientHold(ctx context.Context, d *appsv1.Deployment, dec Decision) (TransientHold, error) {
	o, on := r.failFastFor(d)
	if !on || o.TransientWindow <= 0 || dec.NewRS == nil {
		// Fail-fast turned off for it: the deadline applies as upstream's.
		return TransientHold{}, nil
	}
	pods, err := r.newPods(ctx, d, dec.NewRS)
	if err != nil {
		return TransientHold{}, err
	}
	now := r.Clock.Now()
	states := make([]PodState, 0, len(pods))
	for i := range pods {
		states = append(states, PodStateOf(&pods[i], now, o))
	}
	l, _ := rollout.ReadLedger(d)
	held := heldBy(l, dec.NewRS, dec.Deadline)
	// As fail-fast's: never shorter than the Deployment's own window.
	return DecideTransientHold(states, failingSince(d, dec.NewRS.Name), now, max(o.TransientWindow, o.Window), held), nil
}

// deferRollback records the hold once: when the evidence was first seen
// (so that a restart keeps the window's start) and the decision in words,
// with one Event. Later passes find both recorded and write nothing.
func (r *DeploymentReconciler) deferRollback(ctx context.Context, d *appsv1.Deployment, dec Decision, h TransientHold) error {
	since := rollout.FailingSinceValue(h.Since, dec.NewRS.Name)
	msg := h.DeferMessage(dec)
	if l, _ := rollout.ReadLedger(d); l.FailingSince == since && l.DeferredFor == deferralKey(dec.NewRS, dec.Deadline) {
		// Deferred already (its causes may have changed since, or cleared:
		// the window and its end are the same).
		return nil
	}
	// The window's start in the ledger (a restart keeps it), the decision
	// in words for people.
	if _, err := r.updateLedger(ctx, d, func(l rollout.Ledger) rollout.Ledger {
		l.FailingSince, l.DeferredFor = since, deferralKey(dec.NewRS, dec.Deadline)
		return l
	}); err != nil {
		return fmt.Errorf("recording the deferred rollback of revision %d: %w", dec.FailedRevision, err)
	}
	r.writeRollbackStatus(ctx, d, msg)
	ctrl.LoggerFrom(ctx).Info("Rollback deferred: the new pods fail only transiently", "replicaSet", klog.KObj(dec.NewRS),
		"failedRevision", dec.FailedRevision, "until", h.Until, "causes", h.Causes)
	r.Recorder.Eventf(d, dec.NewRS, corev1.EventTypeNormal, vocab.ReasonRollbackDeferred, actionHold, "%s", msg)
	return nil
}
