// Package reconciler watches every apps/v1 Deployment's rollout to its end. When
// a rollout completes, its ReplicaSet is marked known-good; when one exceeds its
// progress deadline, the Deployment's template is restored from the newest
// known-good ReplicaSet, exactly once, and the failed template is quarantined.
// All state lives in annotations on the Deployments and ReplicaSets themselves
// (names in package vocab): there is no CRD, and nothing is kept in memory
// between reconciles.
package reconciler

import (
	"context"
	"fmt"
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/deployguard/deployguard/reconciler/vocab"
)

// ControllerName names the controller in logs and controller-runtime metrics.
const ControllerName = "deployguard-rollout"

// Options are the reconciler's settings, parsed by the caller (cmd/deployguard).
// Start from DefaultOptions: the zero value has AutoRollback off.
type Options struct {
	// AutoRollback turns automatic rollback on cluster-wide. When off, failed
	// rollouts are left alone (known-good marking goes on, so that turning it on
	// later has a history to roll back to). A Deployment opts out by itself with
	// the vocab.AnnotationAutoRollback annotation set to "false".
	AutoRollback bool
	// IgnoredNamespaces are never reconciled (e.g. kube-system and the guard's
	// own namespace). Namespaces labelled vocab.LabelGuard=vocab.LabelGuardDisabled
	// are ignored as well.
	IgnoredNamespaces []string
	// QuarantineLimit bounds a Deployment's list of quarantined templates; the
	// oldest fall off. Below 1 means DefaultQuarantineLimit.
	QuarantineLimit int
	// MaxConcurrentReconciles is how many Deployments are reconciled at once.
	// Below 1 means 1.
	MaxConcurrentReconciles int
}

// DefaultOptions returns the options of a guard nobody has configured.
func DefaultOptions() Options {
	return Options{
		AutoRollback:            true,
		QuarantineLimit:         DefaultQuarantineLimit,
		MaxConcurrentReconciles: 2,
	}
}

// DeploymentReconciler reconciles every apps/v1 Deployment's rollout. Fields left
// nil are filled in by SetupWithManager; a test can set them and call Reconcile
// directly.
type DeploymentReconciler struct {
	// Client reads from the manager's cache and writes to the API server.
	Client client.Client
	// Recorder emits Events (events.k8s.io/v1) about the Deployments.
	Recorder events.EventRecorder
	// Clock is the time the reconciler sees.
	Clock clock.PassiveClock
	// Metrics are the reconciler's metrics; see NewMetrics.
	Metrics *Metrics
	Options Options
}

// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=apps,resources=replicasets,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// SetupWithManager fills in the fields left nil (Client, Recorder named
// "deployguard", a real Clock, unregistered Metrics) and registers the controller
// with the manager: it watches Deployments, the ReplicaSets they control (mapped
// to their Deployment) and the guard label of Namespaces. ctx is used to set up
// the cache index.
func (r *DeploymentReconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	if r.Client == nil {
		r.Client = mgr.GetClient()
	}
	if r.Recorder == nil {
		r.Recorder = mgr.GetEventRecorder("deployguard")
	}
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	if r.Metrics == nil {
		m, err := NewMetrics(nil)
		if err != nil {
			return err
		}
		r.Metrics = m
	}
	if err := mgr.GetFieldIndexer().IndexField(ctx, &appsv1.ReplicaSet{}, replicaSetControllerKey, indexReplicaSetByController); err != nil {
		return fmt.Errorf("indexing ReplicaSets by controlling Deployment: %w", err)
	}

	notIgnored := predicate.NewPredicateFuncs(func(o client.Object) bool {
		return !slices.Contains(r.Options.IgnoredNamespaces, o.GetNamespace())
	})
	err := ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		For(&appsv1.Deployment{}, builder.WithPredicates(notIgnored)).
		Owns(&appsv1.ReplicaSet{}, builder.WithPredicates(notIgnored)).
		WatchesMetadata(&corev1.Namespace{},
			handler.EnqueueRequestsFromMapFunc(r.deploymentsInNamespace),
			builder.WithPredicates(guardLabelChanged())).
		WithOptions(controller.Options{MaxConcurrentReconciles: max(r.Options.MaxConcurrentReconciles, 1)}).
		Complete(r)
	if err != nil {
		return fmt.Errorf("setting up %s controller: %w", ControllerName, err)
	}
	return nil
}

// Reconcile fetches the Deployment and hands it to reconcile; a Deployment that
// is gone needs nothing.
func (r *DeploymentReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	if slices.Contains(r.Options.IgnoredNamespaces, req.Namespace) {
		return ctrl.Result{}, nil
	}
	d := &appsv1.Deployment{}
	if err := r.Client.Get(ctx, req.NamespacedName, d); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}
	disabled, err := r.namespaceDisabled(ctx, d.Namespace)
	if err != nil {
		return ctrl.Result{}, err
	}
	if disabled {
		return ctrl.Result{}, nil
	}
	if !d.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, d)
	}
	return r.reconcile(ctx, d)
}

// reconcile runs the phases of a live Deployment in order. Each phase reads the
// Deployment as the previous one left it.
func (r *DeploymentReconciler) reconcile(ctx context.Context, d *appsv1.Deployment) (ctrl.Result, error) {
	allRSs, err := r.listReplicaSets(ctx, d)
	if err != nil {
		return ctrl.Result{}, err
	}
	phases := []func(context.Context, *appsv1.Deployment, []*appsv1.ReplicaSet) error{
		r.reconcileKnownGood,
		r.reconcileRollback,
	}
	for _, phase := range phases {
		if err := phase(ctx, d, allRSs); err != nil {
			if apierrors.IsConflict(err) {
				// Someone wrote first: an ordinary race, decided again from a
				// fresh read without an error in the logs.
				ctrl.LoggerFrom(ctx).V(1).Info("Deployment changed while reconciling; requeued", "reason", "Conflict")
				return ctrl.Result{Requeue: true}, nil
			}
			return ctrl.Result{}, err
		}
	}
	return ctrl.Result{}, nil
}

// reconcileDelete is where the guard's finalizers will run, in order, when a
// Deployment is being deleted. For now a Deployment being deleted is left alone:
// neither marked nor rolled back.
func (r *DeploymentReconciler) reconcileDelete(_ context.Context, _ *appsv1.Deployment) (ctrl.Result, error) {
	return ctrl.Result{}, nil
}

// namespaceDisabled reports whether the namespace carries the guard's opt-out
// label. It reads the namespace's metadata from the cache.
func (r *DeploymentReconciler) namespaceDisabled(ctx context.Context, namespace string) (bool, error) {
	ns := &metav1.PartialObjectMetadata{}
	ns.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Namespace"))
	if err := r.Client.Get(ctx, types.NamespacedName{Name: namespace}, ns); err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("reading namespace %s: %w", namespace, err)
	}
	return ns.Labels[vocab.LabelGuard] == vocab.LabelGuardDisabled, nil
}

// deploymentsInNamespace maps a namespace to the Deployments in it, so that a
// namespace taken back into the guard has its Deployments looked at at once.
func (r *DeploymentReconciler) deploymentsInNamespace(ctx context.Context, ns client.Object) []reconcile.Request {
	if slices.Contains(r.Options.IgnoredNamespaces, ns.GetName()) {
		return nil
	}
	var list appsv1.DeploymentList
	if err := r.Client.List(ctx, &list, client.InNamespace(ns.GetName())); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Listing Deployments of namespace", "namespace", ns.GetName())
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
	}
	return reqs
}

// guardLabelChanged passes namespace updates that change the guard label. The
// initial list of namespaces is not passed: every Deployment is reconciled at
// start through its own watch.
func guardLabelChanged() predicate.Funcs {
	return predicate.Funcs{
		CreateFunc:  func(event.CreateEvent) bool { return false },
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
		UpdateFunc: func(e event.UpdateEvent) bool {
			return e.ObjectOld.GetLabels()[vocab.LabelGuard] != e.ObjectNew.GetLabels()[vocab.LabelGuard]
		},
	}
}
