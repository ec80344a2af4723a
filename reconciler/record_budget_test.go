package reconciler

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/deployguard/deployguard/reconciler/vocab"
)

// recordMeta is a record's metadata as a metadata-only list returns it.
func recordMeta(name string, expires time.Time, bytes string) metav1.PartialObjectMetadata {
	m := metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{
		vocab.AnnotationRecordExpires: expires.UTC().Format(time.RFC3339),
	}}}
	if bytes != "" {
		m.Annotations[vocab.AnnotationRecordBytes] = bytes
	}
	return m
}

func TestRecordsToEvict(t *testing.T) {
	budget := RecordBudget{Records: 3, Bytes: 1000, RecordBytes: 500}
	unreadable := recordMeta("odd", t0, "100")
	unreadable.Annotations[vocab.AnnotationRecordExpires] = "soon"
	tests := []struct {
		name      string
		records   []metav1.PartialObjectMetadata
		keepBytes int64
		want      []string
	}{
		{name: "within the budget: none", keepBytes: 100,
			records: []metav1.PartialObjectMetadata{recordMeta("a", t0, "100"), recordMeta("b", t0.Add(time.Hour), "100")}},
		{name: "one too many: the oldest goes", keepBytes: 100,
			records: []metav1.PartialObjectMetadata{recordMeta("b", t0.Add(time.Hour), "100"), recordMeta("a", t0, "100"), recordMeta("c", t0.Add(2*time.Hour), "100")},
			want:    []string{"a"}},
		{name: "over the bytes: the oldest go until it fits", keepBytes: 500,
			records: []metav1.PartialObjectMetadata{recordMeta("a", t0, "300"), recordMeta("b", t0.Add(time.Hour), "300")},
			want:    []string{"a"}},
		{name: "the record kept is never evicted, and counted once", keepBytes: 400,
			records: []metav1.PartialObjectMetadata{recordMeta("keep", t0, "400"), recordMeta("a", t0.Add(time.Hour), "500")}},
		{name: "a record without a readable size counts as the largest", keepBytes: 100,
			records: []metav1.PartialObjectMetadata{recordMeta("a", t0, ""), recordMeta("b", t0.Add(time.Hour), "forged")},
			want:    []string{"a"}},
		{name: "a record without a readable expiry goes first", keepBytes: 100,
			records: []metav1.PartialObjectMetadata{recordMeta("a", t0, "100"), recordMeta("b", t0.Add(time.Hour), "100"), recordMeta("c", t0.Add(2*time.Hour), "100"), unreadable},
			want:    []string{"odd", "a"}},
		{name: "same expiry: by name, so that two guards choose alike", keepBytes: 100,
			records: []metav1.PartialObjectMetadata{recordMeta("z", t0, "100"), recordMeta("y", t0, "100"), recordMeta("x", t0, "100")},
			want:    []string{"x"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			for _, m := range RecordsToEvict(tt.records, "keep", t0.Add(24*time.Hour), tt.keepBytes, budget) {
				got = append(got, m.Name)
			}
			assert.Equal(t, tt.want, got)
		})
	}
}

// Deletions of a namespace recorded at once: each pass evicts only records
// not newer than its own, so no two evict each other's; every pass chooses
// the same oldest records, its own among them when it is one of those, so
// the namespace ends within its budget whichever pass runs last.
func TestRecordsToEvictTwoNewRecords(t *testing.T) {
	tests := []struct {
		name    string
		budget  RecordBudget
		records []metav1.PartialObjectMetadata
		// want is, for each new record's pass, the records it evicts.
		want map[string][]string
	}{
		{name: "the two alone past the budget: both passes evict the older, never the newer",
			budget:  RecordBudget{Records: 3, Bytes: 1000, RecordBytes: 600},
			records: []metav1.PartialObjectMetadata{recordMeta("x", t0.Add(time.Hour), "600"), recordMeta("y", t0.Add(2*time.Hour), "600")},
			want:    map[string][]string{"x": {"x"}, "y": {"x"}}},
		{name: "the same expiry: the name decides which is older, one way only",
			budget:  RecordBudget{Records: 3, Bytes: 1000, RecordBytes: 600},
			records: []metav1.PartialObjectMetadata{recordMeta("y", t0.Add(time.Hour), "600"), recordMeta("x", t0.Add(time.Hour), "600")},
			want:    map[string][]string{"x": {"x"}, "y": {"x"}}},
		{name: "a budget the config accepts: both passes evict the older records, both new ones stay",
			budget: RecordBudget{Records: 2, Bytes: 1000, RecordBytes: 500},
			records: []metav1.PartialObjectMetadata{recordMeta("old", t0, "300"),
				recordMeta("x", t0.Add(time.Hour), "500"), recordMeta("y", t0.Add(2*time.Hour), "500")},
			want: map[string][]string{"x": {"old"}, "y": {"old"}}},
		{name: "three at once, room for two: every pass evicts the oldest new one",
			budget: RecordBudget{Records: 2, Bytes: 1000, RecordBytes: 500},
			records: []metav1.PartialObjectMetadata{recordMeta("x", t0.Add(time.Hour), "100"),
				recordMeta("y", t0.Add(2*time.Hour), "100"), recordMeta("z", t0.Add(3*time.Hour), "100")},
			want: map[string][]string{"x": {"x"}, "y": {"x"}, "z": {"x"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for own, want := range tt.want {
				var ownMeta metav1.PartialObjectMetadata
				for _, m := range tt.records {
					if m.Name == own {
						ownMeta = m
					}
				}
				expires, ok := RecordExpiry(&ownMeta)
				require.True(t, ok)
				var got []string
				for _, m := range RecordsToEvict(tt.records, own, expires, recordBytesOf(&ownMeta, tt.budget), tt.budget) {
					got = append(got, m.Name)
				}
				assert.Equal(t, want, got, "the pass of %s", own)
			}
		})
	}
}

func TestRecordBudgetDefaults(t *testing.T) {
	assert.Equal(t, RecordBudget{Records: DefaultRecordsPerNamespace, Bytes: DefaultRecordBytesPerNamespace, RecordBytes: MaxConfigMapBytes}, RecordBudget{}.withDefaults())
	assert.Equal(t, RecordBudget{Records: 2, Bytes: 10, RecordBytes: 5}, RecordBudget{Records: 2, Bytes: 10, RecordBytes: 5}.withDefaults())
}

// recordOf is the record the guard wrote of Deployment namespace/name,
// expiring at expires.
func recordOf(t *testing.T, namespace, name string, expires time.Time) *corev1.ConfigMap {
	t.Helper()
	d := deployment(func(d *appsv1.Deployment) {
		d.Namespace, d.Name, d.UID = namespace, name, types.UID("uid-"+namespace+"-"+name)
	})
	cm, err := BuildRecord(d, nil, guardNamespace, expires)
	require.NoError(t, err)
	return cm
}

// The deletions of one namespace keep at most its budget of records in the
// guard's namespace: the oldest of that namespace go (and the user is told),
// those of other namespaces stay, and the deletion is never held for it.
func TestRecordBudgetEvictsTheOldestOfTheNamespace(t *testing.T) {
	oldest := recordOf(t, "shop", "a", t0.Add(time.Hour))
	older := recordOf(t, "shop", "b", t0.Add(2*time.Hour))
	otherNS := recordOf(t, "blog", "a", t0)
	d := deployment(deleting(vocab.FinalizerRecord))
	e := newEnv(t, namespace(nil), d, oldest, older, otherNS)
	e.r.Options.RecordBudget = RecordBudget{Records: 2}

	e.reconcileResult()

	assert.Equal(t, []string{"create ConfigMap deployguard-record-shop.web", "delete ConfigMap deployguard-record-shop.a"}, e.writes,
		"wrote, then made room, by metadata only")
	var left corev1.ConfigMapList
	require.NoError(t, e.client.List(context.Background(), &left, client.InNamespace(guardNamespace)))
	var names []string
	for _, cm := range left.Items {
		names = append(names, cm.Name)
	}
	assert.ElementsMatch(t, []string{"deployguard-record-shop.b", "deployguard-record-shop.web", "deployguard-record-blog.a"}, names)
	evs := e.events()
	assert.Equal(t, []string{vocab.ReasonRecordsEvicted, vocab.ReasonRecorded}, eventReasons(evs))
	assert.Contains(t, evs[0], "Warning")
	assert.Contains(t, evs[0], "shop/a")
	assert.Equal(t, 1.0, counterValue(t, e.r.Metrics.recordsEvicted))
	e.assertDeleted()

	rec := e.record()
	assert.Equal(t, "shop", rec.Labels[vocab.LabelRecordNamespace])
	assert.Equal(t, strconv.FormatInt(RecordBytes(rec), 10), rec.Annotations[vocab.AnnotationRecordBytes])
}

// A record larger than one record may be is not written; the user is told,
// and the deletion goes on.
func TestRecordTooLargeIsNotWritten(t *testing.T) {
	d := deployment(deleting(vocab.FinalizerRecord), func(d *appsv1.Deployment) {
		d.Spec.Template.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "BIG", Value: strings.Repeat("x", 4096)}}
	})
	kept := recordOf(t, "shop", "a", t0.Add(time.Hour))
	e := newEnv(t, namespace(nil), d, kept)
	e.r.Options.RecordBudget = RecordBudget{RecordBytes: 2048}

	e.reconcileResult()

	assert.Empty(t, e.writes, "no record written, none evicted for it")
	evs := e.events()
	assert.Equal(t, []string{vocab.ReasonRecordFailed}, eventReasons(evs))
	assert.Contains(t, evs[0], "more than the 2048 bytes one record may hold (cleanup.maxRecordBytes)")
	assert.Equal(t, 1.0, e.cleanupSteps(stepRecord, resultFailed))
	e.assertDeleted()
}

// A guard stopped after writing a record, before making room for it, makes
// room when it finds the record done.
func TestRecordBudgetAfterRestart(t *testing.T) {
	d := deployment(deleting(vocab.FinalizerRecord))
	done, err := BuildRecord(d, nil, guardNamespace, t0.Add(3*time.Hour))
	require.NoError(t, err)
	e := newEnv(t, namespace(nil), d, done, recordOf(t, "shop", "a", t0.Add(time.Hour)), recordOf(t, "shop", "b", t0.Add(2*time.Hour)))
	e.r.Options.RecordBudget = RecordBudget{Records: 2}

	e.reconcileResult()

	assert.Equal(t, []string{"delete ConfigMap deployguard-record-shop.a"}, e.writes)
	assert.Equal(t, []string{vocab.ReasonRecordsEvicted, vocab.ReasonRecorded}, eventReasons(e.events()))
}

// assertDeleted checks that the Deployment being deleted is gone: its
// finalizers were removed, and the deletion went on.
func (e *env) assertDeleted() {
	e.t.Helper()
	err := e.client.Get(context.Background(), webKey, &appsv1.Deployment{})
	assert.True(e.t, apierrors.IsNotFound(err), "the deletion goes on: %v", err)
}

// Neither the sweeper nor the record step ever lists whole records: their
// data (up to 1 MiB each, as many as tenants deleted) is never read to
// bound or sweep them.
func TestRecordsAreListedByMetadataOnly(t *testing.T) {
	var listed []string
	scheme := runtime.NewScheme()
	require.NoError(t, clientgoscheme.AddToScheme(scheme))
	objs := []client.Object{recordOf(t, "shop", "a", t0), recordOf(t, "shop", "b", t0.Add(time.Hour))}
	reader := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).WithInterceptorFuncs(interceptor.Funcs{
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			listed = append(listed, fmt.Sprintf("%T", list))
			return c.List(ctx, list, opts...)
		},
	}).Build()

	s := &RecordSweeper{Namespace: guardNamespace, Reader: reader, Client: reader, Clock: clocktesting.NewFakeClock(t0.Add(30 * time.Minute)), Interval: 10 * time.Minute, Metrics: newEnv(t).r.Metrics}
	_, err := s.Sweep(context.Background())
	require.NoError(t, err)

	e := newEnv(t)
	e.r.APIReader, e.r.Client = reader, reader
	e.r.Options.RecordBudget = RecordBudget{Records: 1}
	gone, _, err := e.r.makeRoomForRecord(context.Background(), "shop", "deployguard-record-shop.web", t0.Add(3*time.Hour), 10)
	require.NoError(t, err)
	assert.Equal(t, []string{"shop/b"}, gone, "the one the sweeper left, to make room")

	assert.Equal(t, []string{"*v1.PartialObjectMetadataList", "*v1.PartialObjectMetadataList"}, listed)
}

// failingRecords fails the record step's list of records (metadata only),
// its deletes of records, or its write of the record, with the errors set.
type failingRecords struct {
	client.Client
	list, del, write error
}

func (f failingRecords) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if _, ok := list.(*metav1.PartialObjectMetadataList); ok && f.list != nil {
		return f.list
	}
	return f.Client.List(ctx, list, opts...)
}

func (f failingRecords) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	if _, ok := obj.(*metav1.PartialObjectMetadata); ok && f.del != nil {
		return f.del
	}
	return f.Client.Delete(ctx, obj, opts...)
}

func (f failingRecords) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	if _, ok := obj.(*corev1.ConfigMap); ok && f.write != nil {
		return f.write
	}
	return f.Client.Create(ctx, obj, opts...)
}

// A list or delete of records that fails never holds the deletion: the
// record is saved, the user is told in a Warning (with a bounded part of the
// API server's answer), and the finalizer goes.
func TestRecordBudgetFailureDoesNotHoldTheDeletion(t *testing.T) {
	long := apierrors.NewInternalError(fmt.Errorf("etcd said %s", strings.Repeat("x", 10_000)))
	tests := []struct {
		name      string
		list, del error
		// done: the record was written before a restart.
		done bool
	}{
		{name: "the list fails", list: long},
		{name: "a delete fails", del: apierrors.NewServiceUnavailable("the API server is going away")},
		{name: "the list fails after a restart, the record written", list: long, done: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := deployment(deleting(vocab.FinalizerRecord))
			objs := []client.Object{namespace(nil), d, recordOf(t, "shop", "a", t0.Add(time.Hour)), recordOf(t, "shop", "b", t0.Add(2*time.Hour))}
			if tt.done {
				rec, err := BuildRecord(d, nil, guardNamespace, t0.Add(3*time.Hour))
				require.NoError(t, err)
				objs = append(objs, rec)
			}
			e := newEnv(t, objs...)
			e.r.Options.RecordBudget = RecordBudget{Records: 2}
			e.r.Client = failingRecords{Client: e.r.Client, list: tt.list, del: tt.del}
			e.r.APIReader = failingRecords{Client: e.client, list: tt.list, del: tt.del}

			e.reconcileResult()

			for _, w := range e.writes {
				assert.NotContains(t, w, "delete ConfigMap", "no record evicted")
			}
			evs := e.events()
			require.Equal(t, []string{vocab.ReasonRecordsEvicted, vocab.ReasonRecorded}, eventReasons(evs))
			assert.Contains(t, evs[0], "Warning")
			assert.Contains(t, evs[0], "Could not keep the records of namespace shop within their budget")
			assert.Contains(t, evs[0], "The deletion goes on")
			assert.Less(t, len(evs[0]), 1000, "the API server's answer is cut")
			assert.Equal(t, 1.0, e.cleanupSteps(stepRecord, resultCompleted))
			assert.Zero(t, counterValue(t, e.r.Metrics.recordsEvicted))
			e.assertDeleted()
			assert.NotNil(t, e.record(), "the record is saved")
		})
	}
}

// A write of the record that fails evicts nothing: room is made only once
// the record is written.
func TestRecordWriteFailureEvictsNothing(t *testing.T) {
	d := deployment(deleting(vocab.FinalizerRecord))
	e := newEnv(t, namespace(nil), d, recordOf(t, "shop", "a", t0.Add(time.Hour)), recordOf(t, "shop", "b", t0.Add(2*time.Hour)))
	e.r.Options.RecordBudget = RecordBudget{Records: 2}
	e.r.Client = failingRecords{Client: e.r.Client, write: apierrors.NewServiceUnavailable("the API server is going away")}

	require.Error(t, e.reconcile())

	assert.Empty(t, e.writes, "no record evicted")
	assert.Zero(t, counterValue(t, e.r.Metrics.recordsEvicted))
	var left corev1.ConfigMapList
	require.NoError(t, e.client.List(context.Background(), &left, client.InNamespace(guardNamespace)))
	assert.Len(t, left.Items, 2, "both records kept")
}

// A record written after newer ones of its namespace (deletions recorded at
// once, in another order than their age) is itself the oldest past the
// budget: it goes, and the step says no record is kept.
func TestRecordOldestPastTheBudgetGoesItself(t *testing.T) {
	d := deployment(deleting(vocab.FinalizerRecord))
	later := t0.Add(365 * 24 * time.Hour)
	e := newEnv(t, namespace(nil), d, recordOf(t, "shop", "a", later), recordOf(t, "shop", "b", later))
	e.r.Options.RecordBudget = RecordBudget{Records: 2}

	e.reconcileResult()

	assert.Equal(t, []string{"create ConfigMap deployguard-record-shop.web", "delete ConfigMap deployguard-record-shop.web"}, e.writes,
		"the newer records stay")
	evs := e.events()
	require.Equal(t, []string{vocab.ReasonRecordsEvicted, vocab.ReasonRecordFailed}, eventReasons(evs))
	assert.Contains(t, evs[0], "shop/web")
	assert.Contains(t, evs[1], "No record kept")
	assert.Equal(t, 1.0, e.cleanupSteps(stepRecord, resultFailed))
	e.assertDeleted()
}
