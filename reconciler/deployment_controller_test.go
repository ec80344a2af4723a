package reconciler

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
)

// env is a reconciler on a fake API server, with every write recorded.
type env struct {
	t        *testing.T
	client   client.Client
	r        *DeploymentReconciler
	recorder *events.FakeRecorder
	clock    *clocktesting.FakeClock
	// patches holds every patch: the kind of object and the patch body.
	patches []recordedPatch
	// writes holds every create, update and delete, as "verb kind name".
	writes []string
	// statusPatches holds every patch of a status subresource.
	statusPatches []recordedPatch
	// sequence is every patch in order: "Deployment" or "Deployment/status".
	sequence []string
	// beforePatch, when set, runs before a write reaches the API server.
	beforePatch func(ctx context.Context, c client.WithWatch, obj client.Object)
}

type recordedPatch struct {
	kind string
	body map[string]any
}

func newEnv(t *testing.T, objs ...client.Object) *env {
	t.Helper()
	scheme := runtime.NewScheme()
	require.NoError(t, clientgoscheme.AddToScheme(scheme))
	e := &env{t: t, recorder: events.NewFakeRecorder(20), clock: clocktesting.NewFakeClock(t0.Add(20*time.Minute + 300*time.Millisecond))}
	e.client = fake.NewClientBuilder().
		WithScheme(scheme).
		WithObjects(objs...).
		WithStatusSubresource(&appsv1.Deployment{}, &appsv1.ReplicaSet{}).
		WithIndex(&appsv1.ReplicaSet{}, replicaSetControllerKey, indexReplicaSetByController).
		WithInterceptorFuncs(interceptor.Funcs{
			Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
				data, err := patch.Data(obj)
				require.NoError(t, err)
				require.NotContains(t, string(data), rollout.CachedTemplateHash, "what the cache holds in place of templates is never written")
				var body map[string]any
				require.NoError(t, json.Unmarshal(data, &body))
				e.patches = append(e.patches, recordedPatch{kind: kindOf(obj), body: body})
				e.sequence = append(e.sequence, kindOf(obj))
				if e.beforePatch != nil {
					e.beforePatch(ctx, c, obj)
				}
				return c.Patch(ctx, obj, patch, opts...)
			},
			SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
				data, err := patch.Data(obj)
				require.NoError(t, err)
				require.NotContains(t, string(data), rollout.CachedTemplateHash, "what the cache holds in place of templates is never written")
				var body map[string]any
				require.NoError(t, json.Unmarshal(data, &body))
				e.statusPatches = append(e.statusPatches, recordedPatch{kind: kindOf(obj) + "/" + sub, body: body})
				e.sequence = append(e.sequence, kindOf(obj)+"/"+sub)
				return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
			},
			Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
				e.writes = append(e.writes, "create "+kindOf(obj)+" "+obj.GetName())
				return c.Create(ctx, obj, opts...)
			},
			Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
				if tmpl := podTemplateOf(obj); tmpl != nil {
					require.False(t, rollout.Stripped(tmpl), "a cached object is never written whole")
				}
				e.writes = append(e.writes, "update "+kindOf(obj)+" "+obj.GetName())
				return c.Update(ctx, obj, opts...)
			},
			Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
				e.writes = append(e.writes, "delete "+kindOf(obj)+" "+obj.GetName())
				return c.Delete(ctx, obj, opts...)
			},
		}).
		Build()
	metrics, err := NewMetrics(prometheus.NewRegistry())
	require.NoError(t, err)
	e.r = &DeploymentReconciler{
		// Reads through the cache transform, as the manager's cache serves
		// them: every test runs on Deployments and ReplicaSets without pod
		// templates, as the guard does.
		Client:    cacheReads{e.client},
		APIReader: e.client,
		Recorder:  e.recorder,
		Clock:     e.clock,
		Metrics:   metrics,
		Options:   testOptions(),
	}
	return e
}

// guardNamespace is the guard's own namespace in these tests, where records
// live.
const guardNamespace = "deployguard-system"

// testOptions are DefaultOptions with the guard's namespace set, as serve
// sets it.
func testOptions() Options {
	o := DefaultOptions()
	o.RecordNamespace = guardNamespace
	return o
}

// cacheReads serves Get and List as the manager's cache does: through
// StripForCache.
type cacheReads struct{ client.Client }

func (c cacheReads) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if err := c.Client.Get(ctx, key, obj, opts...); err != nil {
		return err
	}
	_, err := StripForCache(obj)
	return err
}

func (c cacheReads) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if err := c.Client.List(ctx, list, opts...); err != nil {
		return err
	}
	return meta.EachListItem(list, func(o runtime.Object) error {
		_, err := StripForCache(o)
		return err
	})
}

// podTemplateOf returns the pod template of a Deployment or ReplicaSet, nil
// for other objects.
func podTemplateOf(obj client.Object) *corev1.PodTemplateSpec {
	switch o := obj.(type) {
	case *appsv1.Deployment:
		return &o.Spec.Template
	case *appsv1.ReplicaSet:
		return &o.Spec.Template
	}
	return nil
}

// writes counts every write of the Deployment and its ReplicaSets so far:
// patches of objects and of their status, creates, updates and deletes.
func (e *env) writeCount() int { return len(e.patches) + len(e.statusPatches) + len(e.writes) }

// kindOf names the kind of a typed object.
func kindOf(obj client.Object) string {
	switch o := obj.(type) {
	case *appsv1.Deployment:
		return "Deployment"
	case *appsv1.ReplicaSet:
		return "ReplicaSet"
	case *corev1.ConfigMap:
		return "ConfigMap"
	case *corev1.Pod:
		return "Pod"
	case *metav1.PartialObjectMetadata:
		return o.Kind
	default:
		return fmt.Sprintf("%T", obj)
	}
}

func (e *env) reconcile() error {
	e.t.Helper()
	_, err := e.r.Reconcile(ctrl.LoggerInto(context.Background(), ctrl.Log), ctrl.Request{NamespacedName: client.ObjectKey{Namespace: "shop", Name: "web"}})
	return err
}

func (e *env) deployment() *appsv1.Deployment {
	e.t.Helper()
	d := &appsv1.Deployment{}
	require.NoError(e.t, e.client.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "web"}, d))
	return d
}

func (e *env) replicaSet(name string) *appsv1.ReplicaSet {
	e.t.Helper()
	rs := &appsv1.ReplicaSet{}
	require.NoError(e.t, e.client.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: name}, rs))
	return rs
}

// events drains the events emitted so far, as "Type Reason message".
func (e *env) events() []string {
	var out []string
	for {
		select {
		case ev := <-e.recorder.Events:
			out = append(out, ev)
		default:
			return out
		}
	}
}

func (e *env) rollbacks(result string) float64 {
	return counterValue(e.t, e.r.Metrics.rollbacks.WithLabelValues(result))
}

// counterValue reads a counter the way a scrape would.
func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	require.NoError(t, c.Write(&m))
	return m.GetCounter().GetValue()
}

func eventReasons(evs []string) []string {
	var out []string
	for _, ev := range evs {
		out = append(out, strings.Fields(ev)[1])
	}
	return out
}

func namespace(labels map[string]string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop", Labels: labels}}
}

func TestReconcileMarksKnownGoodOnce(t *testing.T) {
	d := deployment(completed, annotate(vocab.AnnotationQuarantinedTemplates, "other,"+vocab.TemplateHash(&deployment().Spec.Template)))
	rs1, rs2, rs3 := history(d)
	e := newEnv(t, namespace(nil), d, rs1, rs2, rs3)

	require.NoError(t, e.reconcile())

	marked := e.replicaSet("web-h3")
	got := e.deployment()
	assert.True(t, IsKnownGood(got, marked), "the newRS is recorded in the Deployment's ledger")
	l := ledgerOf(t, got)
	require.NotNil(t, l.Newest())
	assert.Equal(t, rollout.KnownGoodEntry{
		ReplicaSet: "web-h3", UID: marked.UID, Template: vocab.TemplateHash(&marked.Spec.Template),
		Revision: 3, At: e.clock.Now().UTC().Format(time.RFC3339),
	}, *l.Newest(), "bound to the ReplicaSet's UID and template, the time the guard saw it complete")
	assert.Equal(t, []string{"web-h1", "web-h2", "web-h3"}, knownGoodNames(l), "the older entries stay, oldest first")
	assert.NotContains(t, marked.Annotations, vocab.LegacyAnnotationKnownGood, "nothing is written on the ReplicaSet")
	assert.NotContains(t, got.Annotations, vocab.LegacyAnnotationKnownGoodRevision, "nor an annotation on the Deployment")
	for _, p := range e.patches {
		assert.Equal(t, "Deployment", p.kind, "no ReplicaSet is written")
	}
	assert.Equal(t, "other", got.Annotations[vocab.AnnotationQuarantinedTemplates], "a template that completed leaves quarantine")
	assert.Equal(t, []string{vocab.ReasonKnownGood}, eventReasons(e.events()))
	assert.Equal(t, 1.0, counterValue(t, e.r.Metrics.knownGoodMarked))

	writes := e.writeCount()
	require.NoError(t, e.reconcile())
	assert.Equal(t, writes, e.writeCount(), "already recorded: no write")
	assert.Empty(t, e.events(), "already marked: no event")
	assert.Equal(t, 1.0, counterValue(t, e.r.Metrics.knownGoodMarked))
}

// The label follows the quarantine list, in the write that changes the
// list: labelled while a template is left, gone with the last one.
func TestReconcileReleasesTheQuarantineLabel(t *testing.T) {
	hash := vocab.TemplateHash(&deployment().Spec.Template)
	for _, tt := range []struct {
		name, list string
		labelled   bool
	}{
		{"another template left", "other," + hash, true},
		{"the last one released", hash, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d := deployment(completed, annotate(vocab.AnnotationQuarantinedTemplates, tt.list))
			d.Labels = map[string]string{"app": "web", vocab.LabelQuarantined: vocab.LabelQuarantinedValue}
			rs1, rs2, rs3 := history(d)
			e := newEnv(t, namespace(nil), d, rs1, rs2, rs3)

			require.NoError(t, e.reconcile())

			got := e.deployment()
			_, labelled := got.Labels[vocab.LabelQuarantined]
			assert.Equal(t, tt.labelled, labelled)
			assert.Equal(t, "web", got.Labels["app"])
			deploymentWrites := 0
			for _, p := range e.patches {
				if p.kind == "Deployment" {
					deploymentWrites++
				}
			}
			assert.Equal(t, 1, deploymentWrites, "the label goes in the write that releases the template")
		})
	}
}

func TestReconcileDoesNotMarkPaused(t *testing.T) {
	d := deployment(completed, paused)
	rs1, rs2, rs3 := history(d)
	e := newEnv(t, namespace(nil), d, rs1, rs2, rs3)

	require.NoError(t, e.reconcile())

	assert.Empty(t, e.patches)
	assert.Empty(t, e.statusPatches)
	assert.False(t, IsKnownGood(e.deployment(), e.replicaSet("web-h3")))
}

func TestReconcileRollsBackInOneWrite(t *testing.T) {
	d := deployment(failed, annotate(vocab.AnnotationQuarantinedTemplates, "older", "kubernetes.io/change-cause", "deploy v3"))
	failedHash := vocab.TemplateHash(&d.Spec.Template)
	rs1, rs2, rs3 := history(d)
	rs2.Annotations["kubernetes.io/change-cause"] = "deploy v2"
	e := newEnv(t, namespace(nil), d, rs1, rs2, rs3)

	require.NoError(t, e.reconcile())

	require.Len(t, e.patches, 1, "one write carries the template and every annotation")
	p := e.patches[0]
	assert.Equal(t, "Deployment", p.kind)
	meta := p.body["metadata"].(map[string]any)
	assert.NotEmpty(t, meta["resourceVersion"], "the write is conditional on the version read")
	assert.Contains(t, p.body, "spec")

	got := e.deployment()
	assert.Equal(t, *RollbackTemplate(rs2), got.Spec.Template, "the template kubectl rollout undo --to-revision=2 restores")
	l := ledgerOf(t, got)
	assert.Equal(t, int64(3), l.RolledBackRevision, "recorded in the ledger, after the rollback's write")
	assert.Equal(t, "web-h2", l.RolledBackTo)
	assert.Equal(t, vocab.TemplateHash(RollbackTemplate(rs2)), l.RolledBackToTemplate, "the restored template, which the verdict webhook compares")
	assert.Empty(t, l.FailFastRevision, "a deadline's rollback, not fail-fast's")
	assert.Equal(t, "Deployment/status", e.sequence[len(e.sequence)-1], "the ledger is written last")
	assert.Equal(t, "older,"+failedHash, got.Annotations[vocab.AnnotationQuarantinedTemplates])
	assert.Equal(t, vocab.LabelQuarantinedValue, got.Labels[vocab.LabelQuarantined],
		"labelled in the same write, for the enforce entry's objectSelector (an earlier release's quarantine had no label)")
	assert.Contains(t, got.Annotations[vocab.AnnotationRollbackStatus], "known-good revision 2")
	assert.Equal(t, t0.Add(20*time.Minute).Format(time.RFC3339), l.HandledDeadline)
	assert.Equal(t, "deploy v2", got.Annotations["kubernetes.io/change-cause"], "annotations come back from the ReplicaSet as with kubectl")
	assert.Equal(t, "3", got.Annotations[vocab.RevisionAnnotation])
	assert.False(t, got.Spec.Paused)

	evs := e.events()
	assert.Equal(t, []string{vocab.ReasonAutoRollback}, eventReasons(evs))
	assert.Equal(t, 1.0, e.rollbacks(resultRolledBack))
	var h dto.Metric
	require.NoError(t, e.r.Metrics.rollbackReaction.Write(&h))
	assert.Equal(t, uint64(1), h.GetHistogram().GetSampleCount())
	assert.InDelta(t, 0.3, h.GetHistogram().GetSampleSum(), 0.001, "reaction measured from the condition's transition")

	// The Deployment controller has not synced: the deadline condition is
	// still there (and the fake API server does not even bump the generation).
	writes := e.writeCount()
	e.clock.Step(time.Second)
	require.NoError(t, e.reconcile())
	assert.Equal(t, writes, e.writeCount(), "second reconcile: no second write")
	assert.Empty(t, e.events())

	// It syncs: revision 2's ReplicaSet is the newRS again, as revision 4, and
	// no replica has progressed yet, so the old condition stays.
	rs2 = e.replicaSet("web-h2")
	rs2.Annotations[vocab.RevisionAnnotation] = "4"
	require.NoError(t, e.client.Update(context.Background(), rs2))
	got = e.deployment()
	got.Annotations[vocab.RevisionAnnotation] = "4"
	require.NoError(t, e.client.Update(context.Background(), got))
	writes = e.writeCount()
	require.NoError(t, e.reconcile())
	assert.Equal(t, writes, e.writeCount(), "stale deadline after the sync: still nothing")
	assert.Empty(t, e.events())
	assert.Equal(t, 1.0, e.rollbacks(resultRolledBack))
}

func TestReconcileRollbackConflictDecidesAgain(t *testing.T) {
	d := deployment(failed)
	rs1, rs2, rs3 := history(d)
	e := newEnv(t, namespace(nil), d, rs1, rs2, rs3)

	// Someone else writes the Deployment between our read and our write.
	var raced atomic.Bool
	e.beforePatch = func(ctx context.Context, c client.WithWatch, obj client.Object) {
		if _, ok := obj.(*appsv1.Deployment); !ok || raced.Swap(true) {
			return
		}
		other := &appsv1.Deployment{}
		require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(obj), other))
		other.Annotations["someone"] = "else"
		require.NoError(t, c.Update(ctx, other))
	}

	res, err := e.r.Reconcile(ctrl.LoggerInto(context.Background(), ctrl.Log), ctrl.Request{NamespacedName: client.ObjectKey{Namespace: "shop", Name: "web"}})
	require.NoError(t, err, "a conflict is an ordinary race, not an error")
	assert.Equal(t, conflictRetry, res.RequeueAfter, "the conflict is requeued so the request is decided again")
	assert.Equal(t, 1.0, e.rollbacks(resultConflict))
	assert.Empty(t, e.events(), "nothing told about a write that did not happen")
	got := e.deployment()
	assert.Equal(t, "else", got.Annotations["someone"], "their change is kept")
	assert.Equal(t, "web:v3", got.Spec.Template.Spec.Containers[0].Image, "our write did not land")

	// The retry reads afresh and decides again.
	require.NoError(t, e.reconcile())
	got = e.deployment()
	assert.Equal(t, "web:v2", got.Spec.Template.Spec.Containers[0].Image)
	assert.Equal(t, int64(3), ledgerOf(t, got).RolledBackRevision)
	assert.Equal(t, []string{vocab.ReasonAutoRollback}, eventReasons(e.events()))
	assert.Equal(t, 1.0, e.rollbacks(resultRolledBack))
}

func TestReconcileHolds(t *testing.T) {
	tests := []struct {
		name       string
		d          *appsv1.Deployment
		rss        func(*appsv1.Deployment) []client.Object
		wantEvent  []string
		wantResult string
		wantStatus string
	}{
		{
			name: "no known-good revision",
			d:    deployment(failed),
			rss: func(d *appsv1.Deployment) []client.Object {
				return []client.Object{replicaSet(d, 1, "web:v1"), replicaSet(d, 2, "web:v2"), replicaSet(d, 3, "web:v3")}
			},
			wantEvent: []string{vocab.ReasonNoKnownGoodRevision}, wantResult: resultNoKnownGood,
			wantStatus: "no known-good revision",
		},
		{
			name: "restored revision fails too",
			d: deployment(failedAt("web-h3", t0.Add(40*time.Minute)), withLedger(func(l *rollout.Ledger) {
				l.RolledBackRevision, l.HandledDeadline = 2, t0.Add(10*time.Minute).Format(time.RFC3339)
			})),
			rss: func(d *appsv1.Deployment) []client.Object {
				rs1, rs3 := replicaSet(d, 1, "web:v1"), replicaSet(d, 3, "web:v3")
				withKnownGood(d, rs1, rs3)
				return []client.Object{rs1, rs3}
			},
			wantEvent: []string{vocab.ReasonRollbackLoop}, wantResult: resultLoopStopped,
			wantStatus: "rollback loop",
		},
		{
			name:       "paused after the deadline",
			d:          deployment(failed, paused),
			wantStatus: "paused",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			objs := []client.Object{namespace(nil), tt.d}
			if tt.rss != nil {
				objs = append(objs, tt.rss(tt.d)...)
			} else {
				rs1, rs2, rs3 := history(tt.d)
				objs = append(objs, rs1, rs2, rs3)
			}
			e := newEnv(t, objs...)

			require.NoError(t, e.reconcile())

			got := e.deployment()
			assert.Equal(t, tt.d.Spec.Template, got.Spec.Template, "template untouched")
			assert.Equal(t, tt.d.Spec.Paused, got.Spec.Paused)
			assert.Contains(t, got.Annotations[vocab.AnnotationRollbackStatus], tt.wantStatus)
			l := ledgerOf(t, got)
			assert.Equal(t, progressing(tt.d).LastTransitionTime.UTC().Format(time.RFC3339), l.HandledDeadline, "the deadline decided about, in the ledger")
			assert.Empty(t, l.RolledBackTo, "nothing rolled back")
			assert.Equal(t, tt.wantEvent, eventReasons(e.events()))
			if tt.wantResult != "" {
				assert.Equal(t, 1.0, e.rollbacks(tt.wantResult))
			}

			// Once per deadline, not on every reconcile; and for the paused
			// case, not after the resume either.
			got.Spec.Paused = false
			require.NoError(t, e.client.Update(context.Background(), got))
			writes := e.writeCount()
			require.NoError(t, e.reconcile())
			assert.Equal(t, writes, e.writeCount())
			assert.Empty(t, e.events())
			assert.Equal(t, "web:v3", e.deployment().Spec.Template.Spec.Containers[0].Image)
		})
	}
}

func TestReconcileLeavesAlone(t *testing.T) {
	tests := []struct {
		name string
		ns   *corev1.Namespace
		d    *appsv1.Deployment
		opts func(*Options)
	}{
		{name: "namespace opted out", ns: namespace(map[string]string{vocab.LabelGuard: vocab.LabelGuardDisabled}), d: deployment(failed)},
		{name: "namespace opted out: no known-good mark either", ns: namespace(map[string]string{vocab.LabelGuard: vocab.LabelGuardDisabled}), d: deployment(completed)},
		{name: "namespace ignored by the options", ns: namespace(nil), d: deployment(failed), opts: func(o *Options) { o.IgnoredNamespaces = []string{"kube-system", "shop"} }},
		{name: "Deployment opted out", ns: namespace(nil), d: deployment(failed, annotate(vocab.AnnotationAutoRollback, "false"))},
		{name: "turned off cluster-wide", ns: namespace(nil), d: deployment(failed), opts: func(o *Options) { o.AutoRollback = false }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rs1, rs2, rs3 := history(tt.d)
			e := newEnv(t, tt.ns, tt.d, rs1, rs2, rs3)
			if tt.opts != nil {
				tt.opts(&e.r.Options)
			}

			require.NoError(t, e.reconcile())

			assert.Empty(t, e.patches)
			assert.Empty(t, e.statusPatches)
			assert.Empty(t, e.events())
		})
	}
}

func TestReconcileDeploymentGone(t *testing.T) {
	e := newEnv(t, namespace(nil))
	assert.NoError(t, e.reconcile())
}

func TestKnownGoodThenRollbackAcrossRevisions(t *testing.T) {
	// Revision 2 completes and is marked; revision 3 then fails and is rolled
	// back to it.
	d := deployment(func(d *appsv1.Deployment) {
		d.Spec.Template = podTemplate("web:v2")
		d.Annotations[vocab.RevisionAnnotation] = "2"
		completed(d)
	})
	rs1 := replicaSet(d, 1, "web:v1")
	rs2 := replicaSet(d, 2, "web:v2")
	e := newEnv(t, namespace(nil), d, rs1, rs2)
	require.NoError(t, e.reconcile())
	require.True(t, IsKnownGood(e.deployment(), e.replicaSet("web-h2")))
	e.events()

	// An earlier release marked revision 2, and an earlier `kubectl rollout
	// undo` to it copied its mark onto the Deployment. The user rolls out v3:
	// the Deployment controller copies the Deployment's annotations, mark
	// included, onto the new ReplicaSet. It fails.
	cur := e.deployment()
	cur.Spec.Template = podTemplate("web:v3")
	cur.Annotations[vocab.RevisionAnnotation] = "3"
	cur.Annotations[vocab.LegacyAnnotationKnownGood] = t0.Format(time.RFC3339)
	cur.Annotations[vocab.LegacyAnnotationKnownGoodHash] = "h2"
	require.NoError(t, e.client.Update(context.Background(), cur))
	cur = e.deployment()
	failed(cur)
	require.NoError(t, e.client.Status().Update(context.Background(), cur))
	require.NoError(t, e.client.Create(context.Background(), replicaSet(cur, 3, "web:v3")))

	require.NoError(t, e.reconcile())

	got := e.deployment()
	assert.Equal(t, "web:v2", got.Spec.Template.Spec.Containers[0].Image)
	assert.Equal(t, []string{vocab.ReasonAnnotationsIgnored, vocab.ReasonAutoRollback}, eventReasons(e.events()), "the copied marks ignored, with a word")
	rs3 := e.replicaSet("web-h3")
	require.Contains(t, rs3.Annotations, vocab.LegacyAnnotationKnownGood, "the copied mark is there")
	assert.False(t, IsKnownGood(got, rs3), "but it is not an entry: no rollback loop is seen")
	assert.Equal(t, []string{"web-h2"}, knownGoodNames(ledgerOf(t, got)))
	assert.NotContains(t, got.Annotations, vocab.LegacyAnnotationKnownGood, "the stray mark left the Deployment with the rollback")
	assert.NotContains(t, got.Annotations, vocab.LegacyAnnotationKnownGoodHash)
}

// The cache keeps no pod templates; the rollback reads the Deployment and its
// target from the API server, so that what the failed template added (a node
// selector, an env var) is gone after the rollback, not merged with the
// known-good template.
func TestRollbackRemovesWhatTheFailedTemplateAdded(t *testing.T) {
	d := deployment(failed, func(d *appsv1.Deployment) {
		d.Spec.Template.Spec.NodeSelector = map[string]string{"pool": "gone"}
		d.Spec.Template.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "BROKEN", Value: "1"}}
	})
	rs1, rs2, rs3 := history(d)
	rs3.Spec.Template.Spec = *d.Spec.Template.Spec.DeepCopy()
	e := newEnv(t, namespace(nil), d, rs1, rs2, rs3)

	require.NoError(t, e.reconcile())

	got := e.deployment()
	assert.Equal(t, *RollbackTemplate(rs2), got.Spec.Template)
	assert.Empty(t, got.Spec.Template.Spec.NodeSelector)
	assert.Empty(t, got.Spec.Template.Spec.Containers[0].Env)
	assert.NotContains(t, got.Annotations, rollout.CachedTemplateHash, "the cache's hash never reaches the API server")
	assert.NotContains(t, got.Spec.Template.Annotations, rollout.CachedTemplateHash, "the cache's hash never reaches the API server")
}
