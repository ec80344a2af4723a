package reconciler

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/vocab"
)

// Defaults of the cleanup options, the same as the config file's.
const (
	DefaultDrainTimeout    = 2 * time.Minute
	DefaultRecordRetention = 7 * 24 * time.Hour
	// DrainPollInterval is how often a drain that waits for pods looks again.
	// ReplicaSet status changes bring the reconciler back sooner; pods are not
	// watched (see countPods), so the last pod's disappearance is seen by polling.
	DrainPollInterval = 2 * time.Second
)

// CleanupStep is the step of the ordered cleanup that runs now.
type CleanupStep string

const (
	// StepNone: none of the guard's finalizers is left; nothing to do.
	StepNone CleanupStep = "None"
	// StepDrain runs the drain step (vocab.FinalizerDrain).
	StepDrain CleanupStep = "Drain"
	// StepRecord runs the record step (vocab.FinalizerRecord).
	StepRecord CleanupStep = "Record"
	// StepSkipAll removes every finalizer of the guard without running a step.
	StepSkipAll CleanupStep = "SkipAll"
	// StepUnknown removes a finalizer in the guard's domain that this version of
	// the guard has no step for: nobody else may remove it, and keeping it would
	// block the deletion for ever.
	StepUnknown CleanupStep = "Unknown"
)

// Why every step is skipped (CleanupPlan.Reason of StepSkipAll).
const (
	SkipReasonAnnotation        = "SkipCleanupAnnotation"
	SkipReasonNamespaceOptedOut = "NamespaceOptedOut"
)

// CleanupInput is what NextCleanupStep decides from.
type CleanupInput struct {
	// Finalizers is the Deployment's metadata.finalizers, in order.
	Finalizers []string
	// SkipCleanup is the vocab.AnnotationSkipCleanup annotation, parsed.
	SkipCleanup bool
	// NamespaceOptedOut: the namespace carries the guard's opt-out label, so the
	// guard runs no step there but still lets go of its finalizers.
	NamespaceOptedOut bool
}

// CleanupPlan is what NextCleanupStep decided.
type CleanupPlan struct {
	Step CleanupStep
	// Finalizer is the finalizer the step removes when it is done (StepDrain,
	// StepRecord, StepUnknown).
	Finalizer string
	// Reason says why the steps are skipped (StepSkipAll only).
	Reason string
}

// NextCleanupStep decides which step of the cleanup of a Deployment being
// deleted runs now. Only the first of the guard's own finalizers in the list is
// acted on; other controllers' finalizers are never looked at, wherever they
// stand. The step removes its finalizer when it is done, and the next call goes
// on to the next one, so the steps run in the order of metadata.finalizers.
func NextCleanupStep(in CleanupInput) CleanupPlan {
	i := slices.IndexFunc(in.Finalizers, vocab.IsGuardFinalizer)
	if i < 0 {
		return CleanupPlan{Step: StepNone}
	}
	switch {
	case in.SkipCleanup:
		return CleanupPlan{Step: StepSkipAll, Reason: SkipReasonAnnotation}
	case in.NamespaceOptedOut:
		return CleanupPlan{Step: StepSkipAll, Reason: SkipReasonNamespaceOptedOut}
	}
	f := in.Finalizers[i]
	switch f {
	case vocab.FinalizerDrain:
		return CleanupPlan{Step: StepDrain, Finalizer: f}
	case vocab.FinalizerRecord:
		return CleanupPlan{Step: StepRecord, Finalizer: f}
	default:
		return CleanupPlan{Step: StepUnknown, Finalizer: f}
	}
}

// WithoutGuardFinalizers returns the finalizers that are not the guard's, in
// their order. The input is not modified.
func WithoutGuardFinalizers(finalizers []string) []string {
	return slices.DeleteFunc(slices.Clone(finalizers), vocab.IsGuardFinalizer)
}

// skipCleanupRequested reports whether the Deployment asks for its cleanup to
// be skipped (strconv rules: "true", "True", "1", …).
func skipCleanupRequested(d *appsv1.Deployment) bool {
	on, err := strconv.ParseBool(strings.TrimSpace(d.Annotations[vocab.AnnotationSkipCleanup]))
	return err == nil && on
}

// namespaceState is what the reconciler knows of a Deployment's namespace,
// read from the metadata cache.
type namespaceState struct {
	Name string
	UID  types.UID
	// Disabled: labelled vocab.LabelGuard=vocab.LabelGuardDisabled.
	Disabled bool
	// Terminating: the namespace is being deleted (deletionTimestamp set, phase
	// Terminating). Nothing can be created in it any more, Events included.
	Terminating bool
}

// stepOutcome is what a step's reconcile came to.
type stepOutcome struct {
	// done: the step's finalizer is to be removed now. Otherwise the step is
	// waiting and is looked at again after requeueAfter.
	done         bool
	requeueAfter time.Duration
	// result is the metrics result (resultCompleted, …); duration, when
	// positive, is observed in the duration histogram.
	result   string
	duration time.Duration
	// The Event told once the finalizer is gone.
	eventType, reason, message string
	// namespaceTerminating: the step found the namespace terminating before the
	// cache did (a create refused with NamespaceTerminatingCause); the Event is
	// told about the Namespace.
	namespaceTerminating bool
}

func pending(after time.Duration) stepOutcome { return stepOutcome{requeueAfter: after} }

// reconcileDelete runs the guard's cleanup of a Deployment being deleted, one
// step per finalizer, in the order of metadata.finalizers (NextCleanupStep).
// A step that is done removes its finalizer with a patch conditional on the
// resourceVersion read; the loop then goes on with the Deployment that patch
// returned, so the steps that can finish at once do so in one reconcile. All
// the state a step needs lives on the objects (the drain-started annotation,
// the record ConfigMap), so a guard restarted in the middle of a step picks it
// up where it was, without repeating what was done.
func (r *DeploymentReconciler) reconcileDelete(ctx context.Context, d *appsv1.Deployment, ns namespaceState) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	// Each pass removes a finalizer or returns; one more pass sees none left.
	for range len(d.Finalizers) + 1 {
		plan := NextCleanupStep(CleanupInput{
			Finalizers:        d.Finalizers,
			SkipCleanup:       skipCleanupRequested(d),
			NamespaceOptedOut: ns.Disabled,
		})
		var (
			out stepOutcome
			err error
		)
		switch plan.Step {
		case StepNone:
			return ctrl.Result{}, nil
		case StepSkipAll:
			return r.skipCleanup(ctx, d, ns, plan)
		case StepUnknown:
			out = stepOutcome{done: true, result: resultSkipped, eventType: corev1.EventTypeWarning, reason: vocab.ReasonUnknownFinalizer,
				message: fmt.Sprintf("Finalizer %s has no cleanup step in this version of deployguard; removed it so that the deletion can complete.", plan.Finalizer)}
		case StepDrain:
			out, err = r.reconcileDrain(ctx, d, ns)
		case StepRecord:
			out, err = r.reconcileRecord(ctx, d, ns)
		}
		if err != nil {
			if apierrors.IsConflict(err) {
				return requeueOnConflict(ctx, err, "Object changed during a cleanup step; requeued", "step", plan.Step)
			}
			return ctrl.Result{}, fmt.Errorf("cleanup step %s: %w", plan.Step, err)
		}
		if !out.done {
			return ctrl.Result{RequeueAfter: out.requeueAfter}, nil
		}
		if err := r.removeFinalizers(ctx, d, func(f string) bool { return f == plan.Finalizer }); err != nil {
			if apierrors.IsConflict(err) {
				return requeueOnConflict(ctx, err, "Deployment changed before its finalizer was removed; requeued", "finalizer", plan.Finalizer)
			}
			if !outcomeUnknown(err) || !r.finalizerGone(ctx, d, plan.Finalizer) {
				r.emitRemovalRefused(d, ns, err)
				return ctrl.Result{}, fmt.Errorf("removing finalizer %s: %w", plan.Finalizer, err)
			}
			// Removed, though the response was lost: the step is done, and
			// told once, below.
			log.Info("The finalizer's removal succeeded though its response was lost", "finalizer", plan.Finalizer, "error", err.Error())
		}
		step := stepLabel(plan.Step)
		r.Metrics.cleanupSteps.WithLabelValues(step, out.result).Inc()
		if out.duration > 0 {
			r.Metrics.cleanupDuration.WithLabelValues(step).Observe(out.duration.Seconds())
		}
		log.Info("Cleanup step done; finalizer removed", "finalizer", plan.Finalizer, "result", out.result, "reason", out.reason)
		if out.namespaceTerminating {
			ns.Terminating = true
		}
		r.emitCleanupEvent(d, ns, out.eventType, out.reason, actionForStep(plan.Step), out.message)
	}
	return ctrl.Result{}, nil
}

// finalizerGone reads the Deployment from the API server after a removal that
// failed without a conflict, and reports whether the finalizer is gone all the
// same (or the Deployment with it).
func (r *DeploymentReconciler) finalizerGone(ctx context.Context, d *appsv1.Deployment, finalizer string) bool {
	fresh := &appsv1.Deployment{}
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(d), fresh); err != nil {
		return apierrors.IsNotFound(err)
	}
	return fresh.UID != d.UID || !slices.Contains(fresh.Finalizers, finalizer)
}

// skipCleanup removes every finalizer of the guard at once, running no step.
func (r *DeploymentReconciler) skipCleanup(ctx context.Context, d *appsv1.Deployment, ns namespaceState, plan CleanupPlan) (ctrl.Result, error) {
	removed := slices.DeleteFunc(slices.Clone(d.Finalizers), func(f string) bool { return !vocab.IsGuardFinalizer(f) })
	if err := r.removeFinalizers(ctx, d, vocab.IsGuardFinalizer); err != nil {
		if apierrors.IsConflict(err) {
			return requeueOnConflict(ctx, err, "Deployment changed before the guard's finalizers were removed; requeued")
		}
		r.emitRemovalRefused(d, ns, err)
		return ctrl.Result{}, fmt.Errorf("removing the guard's finalizers: %w", err)
	}
	for _, f := range removed {
		r.Metrics.cleanupSteps.WithLabelValues(stepLabelOf(f), resultSkipped).Inc()
	}
	why := fmt.Sprintf("the annotation %s=true", vocab.AnnotationSkipCleanup)
	if plan.Reason == SkipReasonNamespaceOptedOut {
		why = fmt.Sprintf("namespace %s is opted out of the guard (label %s=%s)", ns.Name, vocab.LabelGuard, vocab.LabelGuardDisabled)
	}
	ctrl.LoggerFrom(ctx).Info("Cleanup skipped; the guard's finalizers removed", "reason", plan.Reason, "finalizers", removed)
	r.emitCleanupEvent(d, ns, corev1.EventTypeNormal, vocab.ReasonCleanupSkipped, actionSkipCleanup,
		fmt.Sprintf("Removed the guard's finalizers %v without running their cleanup steps, because of %s: the pods were not drained and no record was saved.", removed, why))
	return ctrl.Result{}, nil
}

// removeFinalizers removes the finalizers drop selects, with a patch
// conditional on the resourceVersion read: a finalizer list changed meanwhile
// (by another controller, or a break-glass user) is a conflict, decided again
// from a fresh read, and never overwritten. d is updated from the response.
func (r *DeploymentReconciler) removeFinalizers(ctx context.Context, d *appsv1.Deployment, drop func(string) bool) error {
	patch := client.MergeFromWithOptions(d.DeepCopy(), client.MergeFromWithOptimisticLock{})
	d.Finalizers = slices.DeleteFunc(slices.Clone(d.Finalizers), drop)
	return r.Client.Patch(ctx, d, patch)
}

// emitRemovalRefused tells why a deletion is held up when an admission
// webhook or policy refuses the guard's own finalizer removal (its checks run
// on every update of the object, so a Deployment that broke a rule added after
// it was created can be refused): the user can see what to fix or whom to ask.
// Other errors (the API server unreachable, …) are only retried.
func (r *DeploymentReconciler) emitRemovalRefused(d *appsv1.Deployment, ns namespaceState, err error) {
	if !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err) {
		return
	}
	r.emitCleanupEvent(d, ns, corev1.EventTypeWarning, vocab.ReasonRemovalRefused, actionRemoveFinalizer,
		fmt.Sprintf("The guard's removal of its finalizer was refused, so the deletion waits: %v. Fix what the message names, or ask a member of a break-glass group to remove the finalizer; the guard retries.", err))
}

// stepLabel is the step label of the cleanup metrics.
func stepLabel(s CleanupStep) string {
	switch s {
	case StepDrain:
		return stepDrain
	case StepRecord:
		return stepRecord
	default:
		return stepUnknown
	}
}

// stepLabelOf is the step label of a guard finalizer.
func stepLabelOf(f string) string {
	switch f {
	case vocab.FinalizerDrain:
		return stepDrain
	case vocab.FinalizerRecord:
		return stepRecord
	default:
		return stepUnknown
	}
}

// namespaceRef is the Namespace object Events are told about when its
// Deployments cannot carry them (a terminating namespace refuses new Events).
func namespaceRef(ns namespaceState) *corev1.Namespace {
	return &corev1.Namespace{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"},
		ObjectMeta: metav1.ObjectMeta{Name: ns.Name, UID: ns.UID},
	}
}
