package integration

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/deployguard/deployguard/reconciler"
	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/test/harness"
)

// losingClient applies every write, but loses the response of the first one
// that lose matches: the API server has done it, the caller gets a time-out
// and its object as it was before the write, as when etcd is slow to answer or
// the connection drops once the request is sent.
type losingClient struct {
	client.Client
	lose func(obj client.Object) bool

	mu   sync.Mutex
	lost []string
}

func (c *losingClient) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	before := obj.DeepCopyObject()
	return c.after(obj, before, c.Client.Update(ctx, obj, opts...))
}

func (c *losingClient) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	before := obj.DeepCopyObject()
	return c.after(obj, before, c.Client.Create(ctx, obj, opts...))
}

func (c *losingClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	before := obj.DeepCopyObject()
	return c.after(obj, before, c.Client.Patch(ctx, obj, patch, opts...))
}

func (c *losingClient) after(obj client.Object, before any, err error) error {
	if err != nil || !c.lose(obj) {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.lost) > 0 {
		return nil
	}
	c.lost = append(c.lost, fmt.Sprintf("%T %s/%s", obj, obj.GetNamespace(), obj.GetName()))
	reflect.ValueOf(obj).Elem().Set(reflect.ValueOf(before).Elem())
	return apierrors.NewTimeoutError("the response to this write was lost", 1)
}

func (c *losingClient) lostWrites() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.lost...)
}

// startReconciler runs the guard's rollout reconciler as `serve` does (the
// same cache options, a manager of its own), writing through c.
func startReconciler(t *testing.T, wrap func(client.Client) client.Client) {
	t.Helper()
	// As the guard's service account: only it may remove the guard's
	// finalizers (the suite's webhooks enforce it).
	asGuard := rest.CopyConfig(cfg)
	asGuard.Impersonate = rest.ImpersonationConfig{UserName: guardUser}
	mgr, err := ctrl.NewManager(asGuard, ctrl.Options{
		Scheme:     scheme,
		Metrics:    metricsserver.Options{BindAddress: "0"},
		Cache:      cache.Options{ByObject: reconciler.CacheOptions(), DefaultTransform: cache.TransformStripManagedFields()},
		Controller: ctrlconfig.Controller{SkipNameValidation: ptr(true)},
	})
	require.NoError(t, err)
	m, err := reconciler.NewMetrics(nil)
	require.NoError(t, err)
	opts := reconciler.DefaultOptions()
	opts.RecordNamespace = harness.GuardNamespace
	r := &reconciler.DeploymentReconciler{Client: wrap(mgr.GetClient()), Metrics: m, Options: opts}
	ctx, cancel := context.WithCancel(context.Background())
	require.NoError(t, r.SetupWithManager(ctx, mgr))
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
}

// rolloutHistory stores what the Deployment controller and the guard would
// have left for a rollout of revision 2 that exceeded its deadline: revision 1
// completed and known-good in the guard's ledger (on the Deployment's status,
// bound to that ReplicaSet's UID and template), revision 2 the newRS, the
// Deployment's status at the deadline. (envtest runs no controllers, so the
// test writes it.)
func rolloutHistory(ctx context.Context, t *testing.T, ns, name string) *appsv1.Deployment {
	t.Helper()
	d := harness.Deployment(ns, name, appImage)
	require.NoError(t, k8s.Create(ctx, d))
	v1 := d.Spec.Template.DeepCopy()
	d.Spec.Template.Spec.Containers[0].Image = "nginx:no-such-tag"
	require.NoError(t, k8s.Update(ctx, d))

	rs := func(revision int, tmpl corev1.PodTemplateSpec) *appsv1.ReplicaSet {
		hash := fmt.Sprintf("rev%d", revision)
		tmpl = *tmpl.DeepCopy()
		tmpl.Labels[appsv1.DefaultDeploymentUniqueLabelKey] = hash
		sel := d.Spec.Selector.DeepCopy()
		sel.MatchLabels[appsv1.DefaultDeploymentUniqueLabelKey] = hash
		r := &appsv1.ReplicaSet{
			ObjectMeta: metav1.ObjectMeta{
				Namespace: ns, Name: name + "-" + hash, Labels: tmpl.Labels,
				Annotations: map[string]string{vocab.RevisionAnnotation: fmt.Sprint(revision)},
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "Deployment", Name: d.Name, UID: d.UID,
					Controller: ptr(true), BlockOwnerDeletion: ptr(true)}},
			},
			Spec: appsv1.ReplicaSetSpec{Replicas: ptr(int32(2)), Selector: sel, Template: tmpl},
		}
		require.NoError(t, k8s.Create(ctx, r))
		return r
	}
	good := rs(1, *v1)
	rs(2, d.Spec.Template)

	now := metav1.Now()
	updateStatus(ctx, t, d, func(d *appsv1.Deployment) {
		d.Status = appsv1.DeploymentStatus{
			ObservedGeneration: d.Generation, Replicas: 3, UpdatedReplicas: 1, ReadyReplicas: 2, AvailableReplicas: 2,
			Conditions: []appsv1.DeploymentCondition{{
				Type: appsv1.DeploymentProgressing, Status: corev1.ConditionFalse, Reason: vocab.ProgressDeadlineExceeded,
				Message: fmt.Sprintf("ReplicaSet %q has timed out progressing.", name+"-rev2"), LastUpdateTime: now, LastTransitionTime: now,
			}},
		}
		rollout.SetLedger(&d.Status, rollout.Ledger{}.WithKnownGood(good, 1, now.Time), now.Time)
	})
	l, ok := rollout.ReadLedger(d)
	require.True(t, ok, "the ledger is stored")
	require.Equal(t, []rollout.KnownGoodEntry{{ReplicaSet: good.Name, UID: good.UID, Template: vocab.TemplateHash(&good.Spec.Template),
		Revision: 1, At: now.UTC().Format(time.RFC3339)}}, l.KnownGood, "revision 1 known-good, as the guard records it")
	return d
}

// updateStatus writes the Deployment's status as change leaves it: a write of
// the status subresource (which no tenant can write) through the API server,
// on the Deployment read again and retried on conflicts with whatever else
// writes it. d takes the stored result.
func updateStatus(ctx context.Context, t *testing.T, d *appsv1.Deployment, change func(*appsv1.Deployment)) {
	t.Helper()
	require.NoError(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(d), d); err != nil {
			return err
		}
		change(d)
		return k8s.Status().Update(ctx, d)
	}))
}

// A rollback write whose response is lost is not written twice: the retry
// decides again from what the API server holds, finds the rollback done, and
// does nothing more.
func TestLostResponseOfARollbackIsNotRolledBackTwice(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, k8s, kept)
	// The rollback's write: the template restored, the Deployment labelled.
	losing := &losingClient{lose: func(obj client.Object) bool {
		d, ok := obj.(*appsv1.Deployment)
		return ok && d.Labels[vocab.LabelRolledBack] != ""
	}}
	startReconciler(t, func(c client.Client) client.Client { losing.Client = c; return losing })
	d := rolloutHistory(ctx, t, ns, "web")
	failedGeneration := d.Generation

	got := &appsv1.Deployment{}
	require.Eventually(t, func() bool {
		// The API server applies the write before the client hears back:
		// the rollback can be seen before its response is lost.
		return k8s.Get(ctx, client.ObjectKeyFromObject(d), got) == nil && got.Labels[vocab.LabelRolledBack] == "2" &&
			len(losing.lostWrites()) > 0
	}, 30*time.Second, 20*time.Millisecond, "rolled back")
	require.Equal(t, []string{"*v1.Deployment " + ns + "/web"}, losing.lostWrites(), "the rollback's response was lost")
	assert.Equal(t, "nginx:1.27.3", got.Spec.Template.Spec.Containers[0].Image)
	assert.Equal(t, failedGeneration+1, got.Generation, "one write of the template")
	// The rollback is recorded in the ledger (a status write, the response
	// of which is not lost) once the guard has found its write applied.
	require.Eventually(t, func() bool {
		cur := &appsv1.Deployment{}
		if k8s.Get(ctx, client.ObjectKeyFromObject(d), cur) != nil {
			return false
		}
		l, _ := rollout.ReadLedger(cur)
		return l.RolledBackRevision == 2 && l.RolledBackTo == "web-rev1"
	}, 10*time.Second, 20*time.Millisecond, "the rollback is recorded in the ledger, though its write's response was lost")

	// The retry runs within milliseconds (controller-runtime's backoff); give
	// it time to act twice, and check it did not.
	assert.Never(t, func() bool {
		cur := &appsv1.Deployment{}
		return k8s.Get(ctx, client.ObjectKeyFromObject(d), cur) == nil && cur.Generation != failedGeneration+1
	}, 3*time.Second, 50*time.Millisecond, "the Deployment was written again")
	reasons := func() map[string]int {
		var events eventsv1.EventList
		require.NoError(t, k8s.List(ctx, &events, client.InNamespace(ns)))
		n := map[string]int{}
		for _, e := range events.Items {
			n[e.Reason]++
		}
		return n
	}
	require.Eventually(t, func() bool { return reasons()[vocab.ReasonAutoRollback] > 0 }, 10*time.Second, 50*time.Millisecond,
		"the rollback is told, though its write's response was lost")
	got2 := reasons()
	assert.Equal(t, 1, got2[vocab.ReasonAutoRollback], "told once")
	assert.Zero(t, got2[vocab.ReasonRollbackFailed], "not told as failed: it was applied")
	t.Logf("lost response of the rollback write: %d write of the template, events %v", got.Generation-failedGeneration, got2)
}

// A cleanup step whose write's response is lost (the record's ConfigMap, or
// the removal of a finalizer) is done once and told once: the retry finds the
// record in place, or the finalizer gone, and goes on to the next step.
func TestLostResponsesDuringCleanup(t *testing.T) {
	tests := []struct {
		name string
		lose func(obj client.Object) bool
	}{
		{name: "the record's create", lose: func(obj client.Object) bool {
			cm, ok := obj.(*corev1.ConfigMap)
			return ok && cm.Labels[vocab.LabelRecord] == "true"
		}},
		{name: "the removal of the record finalizer", lose: func(obj client.Object) bool {
			d, ok := obj.(*appsv1.Deployment)
			return ok && d.DeletionTimestamp != nil
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			ns := harness.NewNamespace(t, k8s, kept)
			losing := &losingClient{lose: tc.lose}
			startReconciler(t, func(c client.Client) client.Client { losing.Client = c; return losing })
			d := harness.Deployment(ns, "web", appImage, func(d *appsv1.Deployment) {
				d.Annotations = map[string]string{vocab.AnnotationCleanup: "record,drain"}
			})
			require.NoError(t, k8s.Create(ctx, d))
			require.Equal(t, vocab.CanonicalFinalizers(), d.Finalizers)
			require.NoError(t, k8s.Delete(ctx, d))

			cur := &appsv1.Deployment{}
			if !assert.Eventually(t, func() bool {
				return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(d), cur))
			}, 30*time.Second, 20*time.Millisecond, "the Deployment's cleanup finished") {
				var events eventsv1.EventList
				_ = k8s.List(ctx, &events, client.InNamespace(ns))
				for _, e := range events.Items {
					t.Logf("event %s: %s", e.Reason, e.Note)
				}
				require.FailNow(t, "finalizers left", "finalizers %v, annotations %v", cur.Finalizers, cur.Annotations)
			}
			require.Eventually(t, func() bool { return len(losing.lostWrites()) == 1 }, 10*time.Second, 20*time.Millisecond, "a response was lost")

			var records corev1.ConfigMapList
			require.NoError(t, k8s.List(ctx, &records, client.InNamespace(harness.GuardNamespace), client.MatchingLabels{vocab.LabelRecord: "true"}))
			records.Items = slices.DeleteFunc(records.Items, func(cm corev1.ConfigMap) bool { return cm.Annotations[vocab.AnnotationRecordNamespace] != ns })
			assert.Len(t, records.Items, 1, "one record, in the guard's namespace")
			reasons := func() map[string]int {
				var events eventsv1.EventList
				require.NoError(t, k8s.List(ctx, &events, client.InNamespace(ns)))
				n := map[string]int{}
				for _, e := range events.Items {
					n[e.Reason]++
				}
				return n
			}
			require.Eventually(t, func() bool { return reasons()[vocab.ReasonDrainSkipped] > 0 }, 10*time.Second, 50*time.Millisecond, "events: %v", reasons())
			got := reasons()
			assert.Equal(t, 1, got[vocab.ReasonRecorded], "the record step told once: %v", got)
			assert.Equal(t, 1, got[vocab.ReasonDrainSkipped], "the drain step (no pods to drain without a controller-manager) told once: %v", got)
			assert.Zero(t, got[vocab.ReasonRemovalRefused], "a removal that was applied is not told as refused: %v", got)
			t.Logf("lost %v: events %v", losing.lostWrites(), got)
		})
	}
}
