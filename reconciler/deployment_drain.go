package reconciler

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
)

// DrainAction is what the drain step does now.
type DrainAction string

const (
	// DrainSkip: nothing to drain here (DrainDecision.SkipReason says why).
	DrainSkip DrainAction = "Skip"
	// DrainStart records the start time and the replica count on the
	// Deployment and scales it to zero.
	DrainStart DrainAction = "Start"
	// DrainScale scales the Deployment's ReplicaSets to zero.
	DrainScale DrainAction = "Scale"
	// DrainWait waits for the pods to be told to stop.
	DrainWait DrainAction = "Wait"
	// DrainDone: every ReplicaSet is at zero and every pod has been told to
	// stop (it is terminating, or finished).
	DrainDone DrainAction = "Done"
	// DrainTimedOut: the timeout passed with pods left; the cleanup goes on
	// (they end when their ReplicaSets are garbage collected) and says so.
	DrainTimedOut DrainAction = "TimedOut"
)

// Why a drain is skipped (DrainDecision.SkipReason).
const (
	// DrainSkipNamespaceTerminating: the namespace controller deletes the pods
	// itself and waits for them; waiting here too would only hold the
	// namespace up.
	DrainSkipNamespaceTerminating = "NamespaceTerminating"
	// DrainSkipOrphan: the deletion orphans the ReplicaSets (propagation
	// Orphan). Their pods are meant to keep running, for a new owner to adopt.
	DrainSkipOrphan = "Orphan"
	// DrainSkipForeground: foreground deletion; the garbage collector deletes
	// the ReplicaSets and their pods, and the Deployment waits for that.
	DrainSkipForeground = "Foreground"
	// DrainSkipNoReplicaSets: no ReplicaSet is controlled by the Deployment
	// (any more: an orphaning deletion the garbage collector has already
	// carried out); there is nothing to drain.
	DrainSkipNoReplicaSets = "NoReplicaSets"
)

// DrainState is what DecideDrain decides from; all of it is read from the
// objects, so that a restarted guard decides the same.
type DrainState struct {
	NamespaceTerminating bool
	// Finalizers are the Deployment's: the garbage collector's "orphan" and
	// "foregroundDeletion" say how the deletion treats the ReplicaSets.
	Finalizers []string
	// Started is the drain-started annotation; zero if the drain has not started.
	Started time.Time
	Now     time.Time
	Timeout time.Duration
	// ReplicaSets counts the ReplicaSets the Deployment controls, as the API
	// server has them.
	ReplicaSets int
	// ScaledDown: every ReplicaSet of the Deployment is at spec.replicas 0.
	ScaledDown bool
	// PodsRunning counts the pods of the Deployment's ReplicaSets that have not
	// been told to stop: not terminating, not finished. Negative when not
	// counted.
	PodsRunning int
}

// DrainDecision is what DecideDrain concluded.
type DrainDecision struct {
	Action DrainAction
	// Elapsed is the time since the drain started.
	Elapsed time.Duration
	// RequeueAfter is when to look again (DrainScale, DrainWait): the poll
	// interval, or the time left before the timeout if that comes first.
	RequeueAfter time.Duration
	// SkipReason says why a drain is skipped (DrainSkip).
	SkipReason string
}

// DecideDrain decides the drain step. It is done once every pod has been told
// to stop, not when the last one is gone: the Deployment then disappears while
// its pods end gracefully, as they would without the guard, so a client that
// deletes it and waits for its pods finds it gone too. Done wins over the
// timeout: pods told to stop just in time are a drain that completed.
func DecideDrain(s DrainState) DrainDecision {
	switch {
	case s.NamespaceTerminating:
		return DrainDecision{Action: DrainSkip, SkipReason: DrainSkipNamespaceTerminating}
	case slices.Contains(s.Finalizers, metav1.FinalizerOrphanDependents):
		return DrainDecision{Action: DrainSkip, SkipReason: DrainSkipOrphan}
	case slices.Contains(s.Finalizers, metav1.FinalizerDeleteDependents):
		return DrainDecision{Action: DrainSkip, SkipReason: DrainSkipForeground}
	case s.ReplicaSets == 0:
		return DrainDecision{Action: DrainSkip, SkipReason: DrainSkipNoReplicaSets}
	}
	if s.Started.IsZero() {
		return DrainDecision{Action: DrainStart}
	}
	// A start time from the future (another replica's clock) counts as now.
	elapsed := max(s.Now.Sub(s.Started), 0)
	dec := DrainDecision{Elapsed: elapsed}
	switch {
	case s.ScaledDown && s.PodsRunning == 0:
		dec.Action = DrainDone
		return dec
	case elapsed >= s.Timeout:
		dec.Action = DrainTimedOut
		return dec
	case !s.ScaledDown:
		dec.Action = DrainScale
	default:
		dec.Action = DrainWait
	}
	dec.RequeueAfter = min(DrainPollInterval, s.Timeout-elapsed)
	return dec
}

// drainStarted returns the time in the drain-started annotation.
func drainStarted(d *appsv1.Deployment) (time.Time, bool) {
	return timeAnnotation(d.Annotations, vocab.AnnotationDrainStarted)
}

// drainReplicas returns the replica count recorded before the drain.
func drainReplicas(d *appsv1.Deployment) (int32, bool) {
	v, err := strconv.ParseInt(d.Annotations[vocab.AnnotationDrainReplicas], 10, 32)
	if err != nil || v < 0 {
		return 0, false
	}
	return int32(v), true
}

// reconcileDrain runs the drain step: scale to zero and wait, within the
// drain timeout, until every pod has been told to stop.
//
// The Deployment controller only syncs the status of a Deployment being
// deleted (syncDeployment → syncStatusOnly): scaling the Deployment to zero does
// not reach its ReplicaSets. So the guard records the drain on the Deployment
// (start time, replica count, spec.replicas 0, which is what users see) and
// scales the ReplicaSets itself; the ReplicaSet controller then deletes the
// pods gracefully while the ReplicaSets still exist.
func (r *DeploymentReconciler) reconcileDrain(ctx context.Context, d *appsv1.Deployment, ns namespaceState) (stepOutcome, error) {
	timeout := r.Options.drainTimeout()
	// The ReplicaSets as the API server has them, not as the cache last saw
	// them: an orphaning deletion takes them from the Deployment, and those are
	// never to be scaled down.
	rss, err := r.controlledReplicaSets(ctx, d)
	if err != nil {
		return stepOutcome{}, err
	}
	// At most one start and one scale per reconcile; the objects they return are
	// what the next decision reads, so nothing is written twice.
	for range 3 {
		started, _ := drainStarted(d)
		state := DrainState{NamespaceTerminating: ns.Terminating, Finalizers: d.Finalizers, ReplicaSets: len(rss),
			Started: started, Now: r.Clock.Now(), Timeout: timeout, ScaledDown: scaledDown(rss), PodsRunning: -1}
		if !started.IsZero() && state.ScaledDown {
			if state.PodsRunning, err = r.countRunningPods(ctx, d, rss); err != nil {
				return stepOutcome{}, err
			}
		}
		dec := DecideDrain(state)
		switch dec.Action {
		case DrainSkip:
			return drainSkipped(ns, dec.SkipReason), nil
		case DrainStart:
			if err := r.startDrain(ctx, d, timeout); err != nil {
				return stepOutcome{}, err
			}
		case DrainScale:
			if err := r.scaleDown(ctx, rss); err != nil {
				return stepOutcome{}, err
			}
		case DrainWait:
			ctrl.LoggerFrom(ctx).V(1).Info("Waiting for pods to be told to stop", "pods", state.PodsRunning, "elapsed", dec.Elapsed)
			return pending(dec.RequeueAfter), nil
		case DrainDone:
			return stepOutcome{done: true, result: resultCompleted, duration: dec.Elapsed, eventType: corev1.EventTypeNormal, reason: vocab.ReasonDrained,
				message: fmt.Sprintf("Drained: scaled to zero and every pod told to stop, %s after the drain started; they end gracefully.", dec.Elapsed.Round(time.Second))}, nil
		case DrainTimedOut:
			pods := "pods"
			if state.PodsRunning >= 0 {
				pods = fmt.Sprintf("%d pods", state.PodsRunning)
			}
			return stepOutcome{done: true, result: resultTimedOut, duration: dec.Elapsed, eventType: corev1.EventTypeWarning, reason: vocab.ReasonDrainTimedOut,
				message: fmt.Sprintf("Drain timed out after %s with %s still running; going on with the cleanup: they end when their ReplicaSets are garbage collected.", timeout, pods)}, nil
		}
	}
	return pending(DrainPollInterval), nil
}

// drainSkipped is the outcome of a drain there is nothing to do for.
func drainSkipped(ns namespaceState, reason string) stepOutcome {
	out := stepOutcome{done: true, result: resultSkipped, eventType: corev1.EventTypeNormal, reason: vocab.ReasonDrainSkipped}
	switch reason {
	case DrainSkipNamespaceTerminating:
		out.eventType, out.reason = corev1.EventTypeWarning, vocab.ReasonCleanupShortened
		out.message = fmt.Sprintf("namespace %s is terminating: drain skipped, not waited for; the namespace controller deletes the pods.", ns.Name)
	case DrainSkipOrphan:
		out.message = "Drain skipped: the deletion orphans the ReplicaSets (propagationPolicy Orphan), so their pods keep running for a new owner to adopt."
	case DrainSkipForeground:
		out.message = "Drain skipped: foreground deletion; the garbage collector deletes the ReplicaSets and their pods before the Deployment goes."
	case DrainSkipNoReplicaSets:
		out.message = "Drain skipped: the Deployment controls no ReplicaSet (an orphaning deletion has already handed them over, or none was created)."
	}
	return out
}

// startDrain records the start of the drain and the replica count on the
// Deployment and scales it to zero, in one write conditional on the
// resourceVersion read (the count must be the one read). The write goes
// through the validating webhook, which lets the guard's own account through
// the finalizer rules; if the webhook or a policy refuses a Deployment at zero
// replicas, the drain is recorded without it, and goes on through the
// ReplicaSets, which is what drains in any case.
func (r *DeploymentReconciler) startDrain(ctx context.Context, d *appsv1.Deployment, timeout time.Duration) error {
	log := ctrl.LoggerFrom(ctx)
	replicas := rollout.Replicas(d)
	orig := d.DeepCopy()
	mark := func(d *appsv1.Deployment) {
		if d.Annotations == nil {
			d.Annotations = map[string]string{}
		}
		d.Annotations[vocab.AnnotationDrainStarted] = r.Clock.Now().UTC().Format(time.RFC3339)
		d.Annotations[vocab.AnnotationDrainReplicas] = strconv.Itoa(int(replicas))
	}
	mark(d)
	d.Spec.Replicas = ptr.To[int32](0)
	err := r.Client.Patch(ctx, d, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{}))
	if err != nil && (apierrors.IsInvalid(err) || apierrors.IsForbidden(err)) {
		log.Info("Scaling the Deployment to zero was refused; draining through its ReplicaSets", "reason", vocab.ReasonScaleRefused, "error", err.Error())
		r.Recorder.Eventf(orig, nil, corev1.EventTypeWarning, vocab.ReasonScaleRefused, actionDrain,
			"Scaling the Deployment to zero for the drain was refused (%v); draining its ReplicaSets directly.", err)
		*d = *orig.DeepCopy()
		mark(d)
		err = r.Client.Patch(ctx, d, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{}))
	}
	if err != nil {
		// d may hold the unwritten change; a conflict is decided again from a
		// fresh read.
		*d = *orig
		return fmt.Errorf("starting the drain: %w", err)
	}
	log.Info("Drain started", "replicas", replicas)
	r.Recorder.Eventf(d, nil, corev1.EventTypeNormal, vocab.ReasonDrainStarted, actionDrain,
		"Scaling to zero from %d replicas and waiting up to %s for every pod to end.", replicas, timeout)
	return nil
}

// scaleDown sets every ReplicaSet not at zero to zero. rss are as the API
// server had them; each patch carries the resourceVersion read, so that a
// ReplicaSet the garbage collector orphaned meanwhile (an orphaning deletion)
// is never scaled: the conflict makes the drain decide again from a fresh
// read. The ReplicaSet controller's status writes cause such conflicts too;
// the retry a moment later converges. rss are updated from the responses.
func (r *DeploymentReconciler) scaleDown(ctx context.Context, rss []*appsv1.ReplicaSet) error {
	for _, rs := range rss {
		if rs.Spec.Replicas != nil && *rs.Spec.Replicas == 0 {
			continue
		}
		if rs.DeletionTimestamp != nil {
			continue
		}
		patch := client.MergeFromWithOptions(rs.DeepCopy(), client.MergeFromWithOptimisticLock{})
		rs.Spec.Replicas = ptr.To[int32](0)
		if err := r.Client.Patch(ctx, rs, patch); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return fmt.Errorf("scaling ReplicaSet %s to zero: %w", rs.Name, err)
		}
		ctrl.LoggerFrom(ctx).V(1).Info("Scaled ReplicaSet to zero", "replicaSet", klog.KObj(rs))
	}
	return nil
}

// controlledReplicaSets lists, from the API server, the ReplicaSets the
// Deployment controls (controller reference with its UID), among those its
// selector selects. Only a drain does this, a few times per deletion.
func (r *DeploymentReconciler) controlledReplicaSets(ctx context.Context, d *appsv1.Deployment) ([]*appsv1.ReplicaSet, error) {
	sel, err := selectorOf(d)
	if err != nil {
		return nil, err
	}
	var list appsv1.ReplicaSetList
	if err := r.APIReader.List(ctx, &list, client.InNamespace(d.Namespace), client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return nil, fmt.Errorf("listing ReplicaSets of Deployment %s: %w", d.Name, err)
	}
	var out []*appsv1.ReplicaSet
	for i := range list.Items {
		if ref := metav1.GetControllerOf(&list.Items[i]); ref != nil && ref.UID == d.UID {
			out = append(out, &list.Items[i])
		}
	}
	return out, nil
}

// scaledDown reports whether every ReplicaSet is at zero (or being deleted).
func scaledDown(rss []*appsv1.ReplicaSet) bool {
	for _, rs := range rss {
		if rs.DeletionTimestamp == nil && (rs.Spec.Replicas == nil || *rs.Spec.Replicas != 0) {
			return false
		}
	}
	return true
}

// countRunningPods counts the pods of the Deployment's ReplicaSets that have
// not been told to stop: pods whose controller is one of rss, not terminating,
// in neither phase Succeeded nor Failed (finished pods are not deleted by a
// scale-down; their containers are no longer running).
//
// Pods are listed from the API server (the reader that bypasses the cache), in
// the Deployment's namespace and with its selector, only while a drain waits:
// a cluster-wide pod cache would hold every pod of the cluster in memory for
// the few Deployments being drained at any time.
func (r *DeploymentReconciler) countRunningPods(ctx context.Context, d *appsv1.Deployment, rss []*appsv1.ReplicaSet) (int, error) {
	owners := map[types.UID]bool{}
	for _, rs := range rss {
		owners[rs.UID] = true
	}
	sel, err := selectorOf(d)
	if err != nil {
		return 0, err
	}
	var pods corev1.PodList
	if err := r.APIReader.List(ctx, &pods, client.InNamespace(d.Namespace), client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return 0, fmt.Errorf("listing pods of Deployment %s: %w", d.Name, err)
	}
	n := 0
	for i := range pods.Items {
		p := &pods.Items[i]
		ref := metav1.GetControllerOf(p)
		if ref == nil || !owners[ref.UID] {
			continue
		}
		if p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		n++
	}
	return n, nil
}
