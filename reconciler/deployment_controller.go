// Package reconciler watches every apps/v1 Deployment's rollout to its end. When
// a rollout completes, its ReplicaSet is marked known-good; when one exceeds its
// progress deadline, the Deployment's template is restored from the newest
// known-good ReplicaSet, exactly once, and the failed template is quarantined.
// When a guarded Deployment is deleted, the cleanup steps of its finalizers run
// in order (drain, record; see CLEANUP.md). All state lives on the objects
// themselves: what the reconciler acts on in a status condition of each
// Deployment (its ledger, ledger.go), what people set and read in annotations
// (names in package vocab), and the record ConfigMaps of deleted Deployments, in
// the guard's own namespace. There is no CRD, and nothing is kept in memory
// between reconciles.
package reconciler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

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
	// FailFast says when a rollout in progress is judged failing by its new
	// pods, before its progress deadline.
	FailFast FailFastOptions
	// LegacyCutoff is when this release first ran in the cluster: the
	// Deployments created before it have their ledger adopted from an earlier
	// release's annotations (AdoptLegacy), once. Zero adopts nothing.
	LegacyCutoff time.Time
	// CleanupFinalizers are the cleanup finalizers of a Deployment without the
	// vocab.AnnotationCleanup annotation (vocab.ParseCleanupSteps); none by
	// default. Live Deployments are kept in line with it.
	CleanupFinalizers []string
	// DrainTimeout bounds the drain step of the cleanup on deletion; after it the
	// cleanup goes on, and says so in an Event. Zero or less means
	// DefaultDrainTimeout.
	DrainTimeout time.Duration
	// RecordNamespace is the guard's own namespace, where the cleanup's record
	// step writes the records of deleted Deployments and the RecordSweeper
	// deletes expired ones: tenants cannot write there, so a record is the
	// guard's alone. SetupWithManager requires it.
	RecordNamespace string
	// RecordRetention is how long the record of a deleted Deployment is kept
	// before the guard deletes it. Zero or less means DefaultRecordRetention.
	RecordRetention time.Duration
	// RecordBudget bounds the records the deletions of one namespace keep in
	// RecordNamespace (count, bytes, and the size of one record).
	RecordBudget RecordBudget
	// Snapshots say what the guard keeps of the config a known-good revision
	// ran with, and restores on rollback.
	Snapshots SnapshotOptions
	// RecordSweepInterval is how often, at the most, the guard looks for expired
	// records besides waking at the next known expiry. Zero or less means
	// DefaultRecordSweepInterval (capped at the retention).
	RecordSweepInterval time.Duration
}

func (o Options) drainTimeout() time.Duration {
	if o.DrainTimeout <= 0 {
		return DefaultDrainTimeout
	}
	return o.DrainTimeout
}

func (o Options) recordRetention() time.Duration {
	if o.RecordRetention <= 0 {
		return DefaultRecordRetention
	}
	return o.RecordRetention
}

func (o Options) recordSweepInterval() time.Duration {
	v := o.RecordSweepInterval
	if v <= 0 {
		v = DefaultRecordSweepInterval
	}
	return min(v, o.recordRetention())
}

// DefaultOptions returns the options of a guard nobody has configured.
func DefaultOptions() Options {
	return Options{
		AutoRollback:            true,
		QuarantineLimit:         DefaultQuarantineLimit,
		FailFast:                DefaultFailFastOptions(),
		MaxConcurrentReconciles: 2,
		DrainTimeout:            DefaultDrainTimeout,
		RecordRetention:         DefaultRecordRetention,
		RecordSweepInterval:     DefaultRecordSweepInterval,
		Snapshots:               DefaultSnapshotOptions(),
	}
}

// DeploymentReconciler reconciles every apps/v1 Deployment's rollout. Fields left
// nil are filled in by SetupWithManager; a test can set them and call Reconcile
// directly.
type DeploymentReconciler struct {
	// Client reads from the manager's cache and writes to the API server.
	Client client.Client
	// APIReader reads from the API server directly: the pods of a Deployment
	// being drained, which are not cached, and record ConfigMaps, read fresh
	// (a record written just before a restart may not be in a cache yet).
	APIReader client.Reader
	// Recorder emits Events (events.k8s.io/v1) about the Deployments.
	Recorder events.EventRecorder
	// Clock is the time the reconciler sees.
	Clock clock.PassiveClock
	// Metrics are the reconciler's metrics; see NewMetrics.
	Metrics *Metrics
	// Installed reports whether the guard is installed (its webhook
	// configurations exist); cleanup finalizers are added only then. Nil
	// means always.
	Installed func(ctx context.Context) (bool, error)
	// Judge, when set, judges the Deployment a rollback would leave with the
	// platform's admission policies (the webhook's RollbackJudge): the guard
	// restores under its own identity, which no admission policy judges, and
	// restores nothing they refuse.
	Judge RollbackJudge
	// CacheIndexed says that IndexFields already registered the reconciler's
	// index on the manager's cache: the guard runs a manager per leadership
	// term over one cache, and an informer takes indexes only before it starts.
	CacheIndexed bool
	// Checks turns metric checks on: each new revision is measured by the
	// checks that select its Deployment (deployment_checks.go). Nil: off.
	Checks  *MetricChecks
	Options Options
}

// RollbackJudge judges the Deployment a rollback would leave (restored, an
// update of current) and returns the policies' refusals, one line each;
// none when they admit it. An error means it cannot judge yet (the policies
// in force are not known): the rollback waits, and nothing is written.
type RollbackJudge interface {
	JudgeRollback(ctx context.Context, restored, current *appsv1.Deployment) ([]string, error)
}

// IndexFields registers the cache index the reconciler reads (ReplicaSets by
// their controlling Deployment), before the cache starts.
func IndexFields(ctx context.Context, fi client.FieldIndexer) error {
	if err := fi.IndexField(ctx, &appsv1.ReplicaSet{}, replicaSetControllerKey, indexReplicaSetByController); err != nil {
		return fmt.Errorf("indexing ReplicaSets by controlling Deployment: %w", err)
	}
	return nil
}

// The rights it needs are config/rbac/role.yaml's (the chart's are tested
// against it); no markers generate them.

// SetupWithManager fills in the fields left nil (Client, APIReader, Recorder
// named "deployguard", a real Clock, unregistered Metrics) and registers the
// controller with the manager: it watches Deployments, the ReplicaSets they
// control (mapped to their Deployment) and the guard label and deletion of
// Namespaces. It also adds the RecordSweeper, which deletes expired records on
// the leader. ctx is used to set up the cache index.
func (r *DeploymentReconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	if r.Options.RecordNamespace == "" {
		return errors.New("setting up the rollout reconciler: Options.RecordNamespace (the guard's own namespace, where records live) is required")
	}
	if r.Client == nil {
		r.Client = mgr.GetClient()
	}
	if r.APIReader == nil {
		r.APIReader = mgr.GetAPIReader()
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
	if !r.CacheIndexed {
		if err := IndexFields(ctx, mgr.GetFieldIndexer()); err != nil {
			return err
		}
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
			builder.WithPredicates(namespaceChanged())).
		WithOptions(controller.Options{MaxConcurrentReconciles: max(r.Options.MaxConcurrentReconciles, 1)}).
		Complete(r)
	if err != nil {
		return fmt.Errorf("setting up %s controller: %w", ControllerName, err)
	}
	sweeper := &RecordSweeper{
		Namespace: r.Options.RecordNamespace,
		Reader:    r.APIReader,
		Client:    r.Client,
		Clock:     clock.RealClock{},
		Interval:  r.Options.recordSweepInterval(),
		Metrics:   r.Metrics,
	}
	if err := mgr.Add(sweeper); err != nil {
		return fmt.Errorf("adding the record sweeper: %w", err)
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
	ns, err := r.namespaceState(ctx, d.Namespace)
	if err != nil {
		return ctrl.Result{}, err
	}
	if !d.DeletionTimestamp.IsZero() {
		// Even in an opted-out namespace: the guard lets go of its finalizers
		// there, or the deletion would wait for ever.
		return r.reconcileDelete(ctx, d, ns)
	}
	if ns.Disabled {
		if err := r.releaseVerdict(ctx, d); err != nil {
			return requeueOnConflict(ctx, err, "Deployment changed while releasing its rollback verdict")
		}
		return ctrl.Result{}, nil
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
		r.reconcileFinalizers,
		r.reconcileLedger,
		r.reconcilePending,
	}
	for _, phase := range phases {
		if err := phase(ctx, d, allRSs); err != nil {
			return requeueOnConflict(ctx, err, "Deployment changed while reconciling; requeued")
		}
	}
	// The metric checks measure the new revision; a completed one is known-good
	// only once their bake window has passed, with no check failing it.
	measure, hold, err := r.reconcileChecks(ctx, d, allRSs)
	if err != nil {
		return requeueOnConflict(ctx, err, "Deployment changed while measuring its revision; requeued")
	}
	if !hold {
		if err := r.reconcileKnownGood(ctx, d, allRSs); err != nil {
			return requeueOnConflict(ctx, err, "Deployment changed while reconciling; requeued")
		}
	}
	// Fail-fast declares a failing rollout failed, in upstream's words
	// (Progressing=False, ProgressDeadlineExceeded); it never rolls back.
	again, err := r.reconcileFailFast(ctx, d, allRSs)
	if err != nil {
		return requeueOnConflict(ctx, err, "Deployment changed while judging its rollout; requeued")
	}
	// The rollback phase acts on a failure, declared or upstream's deadline,
	// once. On the deadline it may wait out a registry blip: it says until
	// when.
	held, err := r.reconcileRollback(ctx, d, allRSs)
	if err != nil {
		return requeueOnConflict(ctx, err, "Deployment changed while reconciling; requeued")
	}
	// After every phase that may roll back: it tells the deploying tools.
	if err := r.reconcileVerdict(ctx, d, allRSs); err != nil {
		return requeueOnConflict(ctx, err, "Deployment changed while reporting its rollback; requeued")
	}
	// After the phases that may quarantine a template, whose writes carry
	// the label themselves: this one catches the rest.
	if err := r.reconcileQuarantineLabel(ctx, d, allRSs); err != nil {
		return requeueOnConflict(ctx, err, "Deployment changed while labelling its quarantine; requeued")
	}
	// After the verdict, which holds the Stalled condition when it has one.
	scale, err := r.reconcileScaleUp(ctx, d, allRSs)
	if err != nil {
		return requeueOnConflict(ctx, err, "Deployment changed while judging its scale-up; requeued")
	}
	for _, next := range []time.Duration{held, scale, measure} {
		if next > 0 && (again == 0 || next < again) {
			again = next
		}
	}
	return ctrl.Result{RequeueAfter: again}, nil
}

// namespaceState reads whether the namespace carries the guard's opt-out label
// and whether it is terminating, from the namespace's metadata in the cache. A
// namespace not found is neither.
func (r *DeploymentReconciler) namespaceState(ctx context.Context, namespace string) (namespaceState, error) {
	st := namespaceState{Name: namespace}
	ns := &metav1.PartialObjectMetadata{}
	ns.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Namespace"))
	if err := r.Client.Get(ctx, types.NamespacedName{Name: namespace}, ns); err != nil {
		if apierrors.IsNotFound(err) {
			return st, nil
		}
		return st, fmt.Errorf("reading namespace %s: %w", namespace, err)
	}
	st.UID = ns.UID
	st.Disabled = ns.Labels[vocab.LabelGuard] == vocab.LabelGuardDisabled
	// The namespace controller sets phase Terminating together with the
	// deletionTimestamp; the metadata cache holds only the latter.
	st.Terminating = ns.DeletionTimestamp != nil
	return st, nil
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

// namespaceChanged passes namespace updates that change the guard label, and
// the start of a namespace's deletion: a drain waiting in it stops waiting at
// once. The initial list of namespaces is not passed: every Deployment is
// reconciled at start through its own watch.
func namespaceChanged() predicate.Funcs {
	return predicate.Funcs{
		CreateFunc:  func(event.CreateEvent) bool { return false },
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
		UpdateFunc: func(e event.UpdateEvent) bool {
			return e.ObjectOld.GetLabels()[vocab.LabelGuard] != e.ObjectNew.GetLabels()[vocab.LabelGuard] ||
				(e.ObjectOld.GetDeletionTimestamp() == nil && e.ObjectNew.GetDeletionTimestamp() != nil)
		},
	}
}

// conflictRetry is when a request whose write lost a race is decided again.
// The watch event of the winning write usually brings it back sooner.
const conflictRetry = 250 * time.Millisecond

// judgeRetry is when a rollback waiting for the policies in force (a leader
// started before the policy ConfigMaps loaded, which takes milliseconds) is
// decided again.
const judgeRetry = time.Second

// requeueOnConflict turns a conflict into a quiet requeue: someone wrote first,
// an ordinary race decided again from a fresh read, not an error for the logs.
// Any other error is returned as it is.
func requeueOnConflict(ctx context.Context, err error, msg string, keysAndValues ...any) (ctrl.Result, error) {
	if !apierrors.IsConflict(err) {
		return ctrl.Result{}, err
	}
	ctrl.LoggerFrom(ctx).V(1).Info(msg, append([]any{"reason", "Conflict"}, keysAndValues...)...)
	return ctrl.Result{RequeueAfter: conflictRetry}, nil
}
