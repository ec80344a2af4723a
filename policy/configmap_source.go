package policy

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
)

// policyLabelValue is the value of the policy label that makes a ConfigMap a
// policy source.
const policyLabelValue = "true"

// setRequestName names the single work item of the ConfigMap controller: every
// change rebuilds the whole set, so bursts of changes coalesce into one load.
const setRequestName = "policy-set"

// ConfigMapSource keeps an Engine's policy set in step with the labelled
// ConfigMaps of one namespace: on any change it loads Base plus every such
// ConfigMap and swaps the set in. A ConfigMap whose modules fail is left out
// (not replaced by an older version: every replica, restarted or not, then
// runs the same set), and its error goes to an annotation and a Warning Event
// on it.
//
// It needs get, list, watch and patch on ConfigMaps in Namespace, and create
// on events.k8s.io Events. It runs on every replica, not only the leader:
// each replica has its own Engine.
type ConfigMapSource struct {
	// Engine receives the sets.
	Engine *Engine
	// Base are the sources always in the set: Builtins and FromDir.
	Base []Source
	// Namespace is the guard's namespace; ConfigMaps elsewhere are ignored.
	Namespace string
	// LabelKey with value "true" marks a policy ConfigMap (vocab.LabelPolicy).
	LabelKey string
	// ErrorAnnotation holds a rejected ConfigMap's errors, with key and line
	// (e.g. "deployguard.io/policy-error"); it is removed once the ConfigMap loads.
	ErrorAnnotation string

	// Client reads ConfigMaps from the manager's cache and patches them;
	// Recorder emits Events. SetupWithManager fills them when nil.
	Client   client.Client
	Recorder events.EventRecorder

	loaded atomic.Bool
}

// SetupWithManager registers the controller. It does not need leader
// election, and triggers one load at start so that an empty namespace also
// yields a set with Base.
func (s *ConfigMapSource) SetupWithManager(mgr ctrl.Manager) error {
	if s.Engine == nil || s.Namespace == "" || s.LabelKey == "" || s.ErrorAnnotation == "" {
		return errors.New("policy ConfigMap source: Engine, Namespace, LabelKey and ErrorAnnotation are required")
	}
	if s.Client == nil {
		s.Client = mgr.GetClient()
	}
	if s.Recorder == nil {
		s.Recorder = mgr.GetEventRecorder("deployguard-policy")
	}
	initial := source.Func(func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
		q.Add(s.setRequest())
		return nil
	})
	err := ctrl.NewControllerManagedBy(mgr).
		Named("policy-configmaps").
		Watches(&corev1.ConfigMap{},
			handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
				return []reconcile.Request{s.setRequest()}
			}),
			builder.WithPredicates(s.policyChange())).
		WatchesRawSource(initial).
		WithOptions(controller.Options{NeedLeaderElection: ptr.To(false), MaxConcurrentReconciles: 1}).
		Complete(s)
	if err != nil {
		return fmt.Errorf("setting up policy ConfigMap controller: %w", err)
	}
	return nil
}

var _ reconcile.Reconciler = &ConfigMapSource{}

func (s *ConfigMapSource) setRequest() reconcile.Request {
	return reconcile.Request{NamespacedName: types.NamespacedName{Namespace: s.Namespace, Name: setRequestName}}
}

// Ready is a healthz.Checker: ready once a set including the ConfigMaps has
// been loaded, so a replica does not admit requests with Base alone.
func (s *ConfigMapSource) Ready(*http.Request) error {
	if !s.loaded.Load() {
		return errors.New("policy ConfigMaps not loaded yet")
	}
	return nil
}

// Reconcile rebuilds the set from Base and every labelled ConfigMap; the
// request itself is only a trigger.
func (s *ConfigMapSource) Reconcile(ctx context.Context, _ reconcile.Request) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	var list corev1.ConfigMapList
	if err := s.Client.List(ctx, &list, client.InNamespace(s.Namespace),
		client.MatchingLabels{s.LabelKey: policyLabelValue}); err != nil {
		return ctrl.Result{}, fmt.Errorf("listing policy ConfigMaps: %w", err)
	}
	// Name order decides which of two clashing ConfigMaps is rejected.
	slices.SortFunc(list.Items, func(a, b corev1.ConfigMap) int { return strings.Compare(a.Name, b.Name) })

	rejected, loadErr := s.Engine.loadTolerant(ctx, s.Base, configMapGroups(list.Items))
	if loadErr != nil {
		// Base is compiled into the binary or mounted at start; retrying
		// cannot fix it, so log and keep the last good set.
		log.Error(loadErr, "Policy set refused; the previous set stays active", "reason", "BaseSourcesFailed")
	} else {
		s.loaded.Store(true)
		log.Info("Policy set loaded", "policies", len(s.Engine.Policies()),
			"configMaps", len(list.Items)-len(rejected), "rejectedConfigMaps", len(rejected))
	}

	var errs []error
	for i := range list.Items {
		cm := &list.Items[i]
		lerr, isRejected := rejected[configMapGroupName(cm)]
		if loadErr != nil && !isRejected {
			// Nothing loaded, so nothing is known to be fixed: keep old errors.
			continue
		}
		if err := s.report(ctx, cm, lerr); err != nil {
			errs = append(errs, err)
		}
	}
	return ctrl.Result{}, kerrors.NewAggregate(errs)
}

// configMapGroups turns ConfigMaps into source groups, in the given order.
func configMapGroups(cms []corev1.ConfigMap) []sourceGroup {
	groups := make([]sourceGroup, 0, len(cms))
	for i := range cms {
		groups = append(groups, sourceGroup{name: configMapGroupName(&cms[i]), sources: FromConfigMap(&cms[i])})
	}
	return groups
}

func configMapGroupName(cm *corev1.ConfigMap) string {
	return "configmap/" + cm.Namespace + "/" + cm.Name
}

// policyChange passes events of policy ConfigMaps in Namespace, including one
// that just lost its label (its rules must go), and drops updates that touch
// neither data nor the label, such as our own annotation writes.
func (s *ConfigMapSource) policyChange() predicate.Predicate {
	isPolicy := func(o client.Object) bool {
		return o.GetNamespace() == s.Namespace && o.GetLabels()[s.LabelKey] == policyLabelValue
	}
	return predicate.Funcs{
		CreateFunc:  func(e event.CreateEvent) bool { return isPolicy(e.Object) },
		DeleteFunc:  func(e event.DeleteEvent) bool { return isPolicy(e.Object) },
		GenericFunc: func(e event.GenericEvent) bool { return isPolicy(e.Object) },
		UpdateFunc: func(e event.UpdateEvent) bool {
			was, is := isPolicy(e.ObjectOld), isPolicy(e.ObjectNew)
			if was != is {
				return true
			}
			if !is {
				return false
			}
			oldCM, ok1 := e.ObjectOld.(*corev1.ConfigMap)
			newCM, ok2 := e.ObjectNew.(*corev1.ConfigMap)
			return !ok1 || !ok2 || !maps.Equal(oldCM.Data, newCM.Data)
		},
	}
}
