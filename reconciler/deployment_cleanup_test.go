package reconciler

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/deployguard/deployguard/reconciler/vocab"
)

const otherFinalizer = "example.com/keep"

func TestNextCleanupStep(t *testing.T) {
	future := vocab.Domain + "/future-step"
	tests := []struct {
		name string
		in   CleanupInput
		want CleanupPlan
	}{
		{name: "no finalizers", in: CleanupInput{}, want: CleanupPlan{Step: StepNone}},
		{name: "only other controllers' finalizers", in: CleanupInput{Finalizers: []string{otherFinalizer, "foregroundDeletion"}}, want: CleanupPlan{Step: StepNone}},
		{name: "canonical order: record first", in: CleanupInput{Finalizers: vocab.CanonicalFinalizers()},
			want: CleanupPlan{Step: StepRecord, Finalizer: vocab.FinalizerRecord}},
		{name: "record done: drain next", in: CleanupInput{Finalizers: []string{vocab.FinalizerDrain}},
			want: CleanupPlan{Step: StepDrain, Finalizer: vocab.FinalizerDrain}},
		{name: "list order wins over canonical order (an earlier version's)", in: CleanupInput{Finalizers: []string{vocab.FinalizerDrain, vocab.FinalizerRecord}},
			want: CleanupPlan{Step: StepDrain, Finalizer: vocab.FinalizerDrain}},
		{name: "other finalizers before ours are not waited for", in: CleanupInput{Finalizers: []string{otherFinalizer, vocab.FinalizerDrain, vocab.FinalizerRecord}},
			want: CleanupPlan{Step: StepDrain, Finalizer: vocab.FinalizerDrain}},
		{name: "other finalizers between ours", in: CleanupInput{Finalizers: []string{vocab.FinalizerRecord, otherFinalizer, vocab.FinalizerDrain}},
			want: CleanupPlan{Step: StepRecord, Finalizer: vocab.FinalizerRecord}},
		{name: "unknown finalizer of the guard's domain first", in: CleanupInput{Finalizers: []string{future, vocab.FinalizerDrain}},
			want: CleanupPlan{Step: StepUnknown, Finalizer: future}},
		{name: "skip-cleanup annotation", in: CleanupInput{Finalizers: []string{otherFinalizer, vocab.FinalizerDrain, vocab.FinalizerRecord}, SkipCleanup: true},
			want: CleanupPlan{Step: StepSkipAll, Reason: SkipReasonAnnotation}},
		{name: "skip-cleanup annotation with nothing of ours left", in: CleanupInput{Finalizers: []string{otherFinalizer}, SkipCleanup: true},
			want: CleanupPlan{Step: StepNone}},
		{name: "namespace opted out", in: CleanupInput{Finalizers: []string{vocab.FinalizerRecord}, NamespaceOptedOut: true},
			want: CleanupPlan{Step: StepSkipAll, Reason: SkipReasonNamespaceOptedOut}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, NextCleanupStep(tt.in))
		})
	}
}

func TestDecideDrain(t *testing.T) {
	now := t0.Add(time.Hour)
	timeout := 2 * time.Minute
	tests := []struct {
		name  string
		state DrainState
		want  DrainDecision
		// noReplicaSets: the Deployment controls none; two otherwise.
		noReplicaSets bool
	}{
		{name: "namespace terminating: not even started", state: DrainState{NamespaceTerminating: true, PodsRunning: -1},
			want: DrainDecision{Action: DrainSkip, SkipReason: DrainSkipNamespaceTerminating}},
		{name: "namespace terminating while waiting", state: DrainState{NamespaceTerminating: true, Started: now.Add(-time.Second), ScaledDown: true, PodsRunning: 3},
			want: DrainDecision{Action: DrainSkip, SkipReason: DrainSkipNamespaceTerminating}},
		{name: "an orphaning deletion keeps the ReplicaSets' pods running", state: DrainState{Finalizers: []string{vocab.FinalizerDrain, metav1.FinalizerOrphanDependents}, PodsRunning: -1},
			want: DrainDecision{Action: DrainSkip, SkipReason: DrainSkipOrphan}},
		{name: "a foreground deletion leaves the pods to the garbage collector", state: DrainState{Finalizers: []string{metav1.FinalizerDeleteDependents, vocab.FinalizerDrain}, PodsRunning: -1},
			want: DrainDecision{Action: DrainSkip, SkipReason: DrainSkipForeground}},
		{name: "no ReplicaSet controlled any more: nothing to drain", noReplicaSets: true, state: DrainState{PodsRunning: -1},
			want: DrainDecision{Action: DrainSkip, SkipReason: DrainSkipNoReplicaSets}},
		{name: "not started", state: DrainState{PodsRunning: -1},
			want: DrainDecision{Action: DrainStart}},
		{name: "started, ReplicaSets not at zero yet", state: DrainState{Started: now.Add(-10 * time.Second), ScaledDown: false, PodsRunning: -1},
			want: DrainDecision{Action: DrainScale, Elapsed: 10 * time.Second, RequeueAfter: DrainPollInterval}},
		{name: "pods still running", state: DrainState{Started: now.Add(-10 * time.Second), ScaledDown: true, PodsRunning: 2},
			want: DrainDecision{Action: DrainWait, Elapsed: 10 * time.Second, RequeueAfter: DrainPollInterval}},
		{name: "timeout comes before the next poll", state: DrainState{Started: now.Add(-timeout + 500*time.Millisecond), ScaledDown: true, PodsRunning: 1},
			want: DrainDecision{Action: DrainWait, Elapsed: timeout - 500*time.Millisecond, RequeueAfter: 500 * time.Millisecond}},
		{name: "every pod told to stop", state: DrainState{Started: now.Add(-10 * time.Second), ScaledDown: true, PodsRunning: 0},
			want: DrainDecision{Action: DrainDone, Elapsed: 10 * time.Second}},
		{name: "pods told to stop just as the timeout passed", state: DrainState{Started: now.Add(-timeout - time.Second), ScaledDown: true, PodsRunning: 0},
			want: DrainDecision{Action: DrainDone, Elapsed: timeout + time.Second}},
		{name: "timed out with pods left", state: DrainState{Started: now.Add(-timeout), ScaledDown: true, PodsRunning: 1},
			want: DrainDecision{Action: DrainTimedOut, Elapsed: timeout}},
		{name: "timed out before the ReplicaSets could be scaled", state: DrainState{Started: now.Add(-timeout - time.Minute), ScaledDown: false, PodsRunning: -1},
			want: DrainDecision{Action: DrainTimedOut, Elapsed: timeout + time.Minute}},
		{name: "start time in the future counts as now", state: DrainState{Started: now.Add(time.Minute), ScaledDown: true, PodsRunning: 1},
			want: DrainDecision{Action: DrainWait, RequeueAfter: DrainPollInterval}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := tt.state
			s.Now, s.Timeout = now, timeout
			if !tt.noReplicaSets {
				s.ReplicaSets = 2
			}
			assert.Equal(t, tt.want, DecideDrain(s))
		})
	}
}

func TestDecideRecord(t *testing.T) {
	record := func(ns, name, uid string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
			Labels: map[string]string{vocab.LabelRecord: "true"},
			Annotations: map[string]string{
				vocab.AnnotationRecordNamespace: ns, vocab.AnnotationRecordOf: name, vocab.AnnotationRecordUID: uid,
			},
		}}
	}
	tests := []struct {
		name        string
		existing    *corev1.ConfigMap
		terminating bool
		want        RecordAction
	}{
		{name: "no record yet", want: RecordCreate},
		{name: "this Deployment's record exists", existing: record("shop", "web", "uid-web"), want: RecordDone},
		{name: "an earlier Deployment's record", existing: record("shop", "web", "uid-older"), want: RecordReplace},
		{name: "a ConfigMap that is not a record has the name", existing: &corev1.ConfigMap{}, want: RecordNameTaken},
		{name: "the record of a Deployment of another namespace", existing: record("blog", "web", "uid-web"), want: RecordOfAnother},
		{name: "the record of another Deployment", existing: record("shop", "api", "uid-api"), want: RecordOfAnother},
		{name: "a record that names no namespace", existing: record("", "web", "uid-web"), want: RecordOfAnother},
		{name: "namespace terminating", terminating: true, want: RecordSkip},
		{name: "namespace terminating, record exists", existing: record("shop", "web", "uid-web"), terminating: true, want: RecordSkip},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, DecideRecord(tt.existing, types.NamespacedName{Namespace: "shop", Name: "web"}, "uid-web", tt.terminating))
		})
	}
}

func TestRecordExpired(t *testing.T) {
	cm := func(labelled bool, expires string) *corev1.ConfigMap {
		c := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{}}}
		if labelled {
			c.Labels = map[string]string{vocab.LabelRecord: "true"}
		}
		if expires != "" {
			c.Annotations[vocab.AnnotationRecordExpires] = expires
		}
		return c
	}
	at := t0.Format(time.RFC3339)
	tests := []struct {
		name string
		cm   *corev1.ConfigMap
		now  time.Time
		want bool
	}{
		{name: "before the expiry", cm: cm(true, at), now: t0.Add(-time.Second), want: false},
		{name: "at the expiry", cm: cm(true, at), now: t0, want: true},
		{name: "after the expiry", cm: cm(true, at), now: t0.Add(time.Hour), want: true},
		{name: "not a record", cm: cm(false, at), now: t0.Add(time.Hour), want: false},
		{name: "no expiry: kept", cm: cm(true, ""), now: t0.Add(time.Hour), want: false},
		{name: "unreadable expiry: kept", cm: cm(true, "next tuesday"), now: t0.Add(time.Hour), want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, RecordExpired(tt.cm, tt.now))
		})
	}
}

func TestRecordName(t *testing.T) {
	assert.Equal(t, "deployguard-record-shop.web", RecordName("shop", "web"))
	assert.NotEqual(t, RecordName("a-b", "c"), RecordName("a", "b-c"), "a namespace has no dot: the first one ends it")

	dns := `^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	longNS := strings.Repeat("n", 63)
	long1 := fmt.Sprintf("%0250d", 1)
	long2 := fmt.Sprintf("%0250d", 2)
	n1, n2 := RecordName(longNS, long1), RecordName(longNS, long2)
	assert.LessOrEqual(t, len(n1), 253)
	assert.Regexp(t, dns, n1)
	assert.NotEqual(t, n1, n2, "names cut to the same prefix still differ")
	assert.NotEqual(t, n1, RecordName("shop", long1), "the namespace is in the hash")
	assert.Equal(t, n1, RecordName(longNS, long1), "stable")
	dotted := RecordName("shop", fmt.Sprintf("%0224d.%025d", 1, 2))
	assert.LessOrEqual(t, len(dotted), 253)
	assert.Regexp(t, dns, dotted)
	assert.NotContains(t, dotted, ".-")

	// An earlier release's name, in the Deployment's namespace, as it wrote it.
	assert.Equal(t, "deployguard-record-web", LegacyRecordName("web"))
	assert.LessOrEqual(t, len(LegacyRecordName(long1)), 253)
	assert.NotEqual(t, LegacyRecordName(long1), LegacyRecordName(long2))
}

func TestRecordRoundTrip(t *testing.T) {
	d := deployment(deleting(vocab.FinalizerRecord), annotate(
		vocab.AnnotationDrainStarted, t0.Format(time.RFC3339),
		vocab.AnnotationDrainReplicas, "3",
		vocab.LegacyAnnotationKnownGoodRevision, "2", // an earlier release's state
		vocab.AnnotationRollbackStatus, "old news",
		vocab.AnnotationProtected, "false",
		vocab.AnnotationQuarantinedTemplates, "abc",
		"kubernetes.io/change-cause", "release 3",
	))
	d.Spec.Replicas = ptr.To[int32](0) // as the drain left it
	d.Labels = map[string]string{"team": "shop"}
	rs1, rs2, rs3 := history(d)

	cm, err := BuildRecord(d, []*appsv1.ReplicaSet{rs1, rs2, rs3}, guardNamespace, t0.Add(time.Hour))
	require.NoError(t, err)
	assert.Equal(t, "deployguard-record-shop.web", cm.Name)
	assert.Equal(t, guardNamespace, cm.Namespace, "in the guard's namespace, where tenants cannot write")
	assert.Equal(t, map[string]string{vocab.LabelRecord: "true", vocab.LabelRecordNamespace: "shop"}, cm.Labels,
		"the namespace in a label too: its records are listed by it, metadata only, for their budget")
	assert.Equal(t, map[string]string{
		vocab.AnnotationRecordNamespace: "shop", vocab.AnnotationRecordOf: "web", vocab.AnnotationRecordUID: "uid-web",
		vocab.AnnotationRecordExpires: t0.Add(time.Hour).Format(time.RFC3339),
		vocab.AnnotationRecordBytes:   strconv.FormatInt(RecordBytes(cm), 10),
	}, cm.Annotations)
	var size int
	for k, v := range cm.Data {
		size += len(k) + len(v)
	}
	assert.EqualValues(t, size, RecordBytes(cm), "the data's keys and values, as the API server counts them")
	of, ok := RecordOf(cm)
	assert.True(t, ok)
	assert.Equal(t, types.NamespacedName{Namespace: "shop", Name: "web"}, of)
	assert.Equal(t, "3", cm.Data[RecordKeyRevision])
	assert.Equal(t, "2", cm.Data[RecordKeyKnownGoodRevision], "the newest known-good revision")
	assert.Empty(t, cm.OwnerReferences, "a record outlives its Deployment")

	got, err := DeploymentFromRecord(cm, of, false)
	require.NoError(t, err)
	assert.Equal(t, "web", got.Name)
	assert.Equal(t, "shop", got.Namespace, "recreated in its own namespace, not the record's")
	assert.Equal(t, d.Labels, got.Labels)
	assert.Equal(t, int32(3), *got.Spec.Replicas, "the replica count from before the drain")
	assert.Equal(t, d.Spec.Template, got.Spec.Template)
	assert.Equal(t, d.Spec.Selector, got.Spec.Selector)
	assert.Equal(t, map[string]string{
		vocab.AnnotationProtected: "false", vocab.AnnotationQuarantinedTemplates: "abc", "kubernetes.io/change-cause": "release 3",
	}, got.Annotations, "the user's choices are kept; the deleted object's state is not")
	assert.Empty(t, got.Finalizers)
	assert.Empty(t, got.UID)
	assert.Empty(t, got.ResourceVersion)

	kg, err := DeploymentFromRecord(cm, of, true)
	require.NoError(t, err)
	assert.Equal(t, *RollbackTemplate(rs2), kg.Spec.Template, "the known-good template, as rollout undo restores it")

	t.Run("no known-good revision", func(t *testing.T) {
		cm, err := BuildRecord(d, []*appsv1.ReplicaSet{replicaSet(d, 3, "web:v3")}, guardNamespace, t0)
		require.NoError(t, err)
		assert.NotContains(t, cm.Data, RecordKeyKnownGoodTemplate)
		_, err = DeploymentFromRecord(cm, of, true)
		assert.ErrorContains(t, err, "no known-good template")
	})
	t.Run("not a record", func(t *testing.T) {
		_, err := DeploymentFromRecord(&corev1.ConfigMap{Data: cm.Data}, of, false)
		assert.ErrorIs(t, err, ErrNotARecord)
		_, ok := RecordOf(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Annotations: cm.Annotations}})
		assert.False(t, ok, "annotations without the label make no record")
	})
	t.Run("a record holding another Deployment", func(t *testing.T) {
		_, err := DeploymentFromRecord(cm, types.NamespacedName{Namespace: "shop", Name: "api"}, false)
		assert.ErrorContains(t, err, `holds Deployment "web", not "api"`)
	})
}

// deleting marks the Deployment as being deleted, with these finalizers.
func deleting(finalizers ...string) func(*appsv1.Deployment) {
	return func(d *appsv1.Deployment) {
		d.DeletionTimestamp = &metav1.Time{Time: t0.Add(20 * time.Minute)}
		d.Finalizers = finalizers
	}
}

// pod returns a pod of the ReplicaSet.
func pod(rs *appsv1.ReplicaSet, name string, phase corev1.PodPhase) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: rs.Namespace, Name: name, Labels: rs.Spec.Template.Labels,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: rs.Name, UID: rs.UID, Controller: ptr.To(true)}},
		},
		Status: corev1.PodStatus{Phase: phase},
	}
}

func (e *env) reconcileResult() ctrl.Result {
	e.t.Helper()
	res, err := e.r.Reconcile(ctrl.LoggerInto(context.Background(), ctrl.Log), ctrl.Request{NamespacedName: client.ObjectKey{Namespace: "shop", Name: "web"}})
	require.NoError(e.t, err)
	return res
}

func (e *env) deletePods(names ...string) {
	e.t.Helper()
	for _, n := range names {
		require.NoError(e.t, e.client.Delete(context.Background(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: n}}))
	}
}

// webKey is the Deployment these tests delete.
var webKey = types.NamespacedName{Namespace: "shop", Name: "web"}

func (e *env) record() *corev1.ConfigMap {
	e.t.Helper()
	cm := &corev1.ConfigMap{}
	require.NoError(e.t, e.client.Get(context.Background(), client.ObjectKey{Namespace: guardNamespace, Name: "deployguard-record-shop.web"}, cm))
	return cm
}

func (e *env) cleanupSteps(step, result string) float64 {
	return counterValue(e.t, e.r.Metrics.cleanupSteps.WithLabelValues(step, result))
}

// finalizerPatches returns the finalizer lists written to the Deployment, in
// order, each checked to carry the resourceVersion read.
func (e *env) finalizerPatches() [][]string {
	e.t.Helper()
	var out [][]string
	for _, p := range e.patches {
		meta, ok := p.body["metadata"].(map[string]any)
		if p.kind != "Deployment" || !ok {
			continue
		}
		fs, ok := meta["finalizers"]
		if !ok {
			continue
		}
		assert.NotEmpty(e.t, meta["resourceVersion"], "a finalizer removal is conditional on the version read")
		var list []string
		if fs != nil {
			for _, f := range fs.([]any) {
				list = append(list, f.(string))
			}
		}
		out = append(out, list)
	}
	return out
}

// The whole cleanup of a guarded Deployment: drain (scale to zero, wait for
// the pods), then record, each finalizer removed when its step is done, in
// list order; another controller's finalizer is left where it is.
func TestCleanupRunsStepsInOrder(t *testing.T) {
	d := deployment(failed, deleting(otherFinalizer, vocab.FinalizerDrain, vocab.FinalizerRecord))
	rs1, rs2, rs3 := history(d)
	rs3.Spec.Replicas = ptr.To[int32](3)
	e := newEnv(t, namespace(nil), d, rs1, rs2, rs3,
		pod(rs3, "web-h3-a", corev1.PodRunning), pod(rs3, "web-h3-b", corev1.PodRunning), pod(rs3, "web-h3-c", corev1.PodRunning),
		pod(rs2, "web-h2-done", corev1.PodSucceeded))

	res := e.reconcileResult()

	got := e.deployment()
	assert.Equal(t, int32(0), *got.Spec.Replicas, "the Deployment is scaled to zero")
	assert.Equal(t, "3", got.Annotations[vocab.AnnotationDrainReplicas])
	assert.Equal(t, e.clock.Now().UTC().Format(time.RFC3339), got.Annotations[vocab.AnnotationDrainStarted])
	assert.Equal(t, int32(0), *e.replicaSet("web-h3").Spec.Replicas, "its ReplicaSets too: the Deployment controller does not scale a Deployment being deleted")
	assert.Equal(t, []string{otherFinalizer, vocab.FinalizerDrain, vocab.FinalizerRecord}, got.Finalizers, "pods left: the drain waits")
	assert.Equal(t, DrainPollInterval, res.RequeueAfter)
	assert.Equal(t, []string{vocab.ReasonDrainStarted}, eventReasons(e.events()))
	assert.Equal(t, "web:v3", got.Spec.Template.Spec.Containers[0].Image, "a Deployment being deleted is never rolled back")

	// Nothing new: no second write.
	writes := len(e.patches)
	e.clock.Step(time.Second)
	e.reconcileResult()
	assert.Len(t, e.patches, writes, "waiting writes nothing")
	assert.Empty(t, e.events())

	// The ReplicaSet controller deletes the pods; the finished one is not
	// waited for (a scale-down leaves it, and nothing of it runs).
	e.deletePods("web-h3-a", "web-h3-b", "web-h3-c")
	e.clock.Step(4 * time.Second)
	res = e.reconcileResult()

	assert.Zero(t, res.RequeueAfter)
	got = e.deployment()
	assert.Equal(t, []string{otherFinalizer}, got.Finalizers, "both steps done, the other controller's finalizer untouched")
	assert.Equal(t, [][]string{{otherFinalizer, vocab.FinalizerRecord}, {otherFinalizer}}, e.finalizerPatches(), "drain removed first, then record")
	assert.Equal(t, []string{vocab.ReasonDrained, vocab.ReasonRecorded}, eventReasons(e.events()))

	rec := e.record()
	restored, err := DeploymentFromRecord(rec, webKey, false)
	require.NoError(t, err)
	assert.Equal(t, int32(3), *restored.Spec.Replicas)
	assert.Equal(t, d.Spec.Template, restored.Spec.Template)
	assert.Equal(t, "2", rec.Data[RecordKeyKnownGoodRevision])
	assert.Equal(t, e.clock.Now().Add(DefaultRecordRetention).UTC().Format(time.RFC3339), rec.Annotations[vocab.AnnotationRecordExpires])

	assert.Equal(t, 1.0, e.cleanupSteps(stepDrain, resultCompleted))
	assert.Equal(t, 1.0, e.cleanupSteps(stepRecord, resultCompleted))

	writes = len(e.patches) + len(e.writes)
	e.reconcileResult()
	assert.Equal(t, writes, len(e.patches)+len(e.writes), "nothing of the guard's left: no write")
}

// A guard restarted in the middle of a step picks it up from the objects and
// does not repeat what was done.
func TestCleanupResumesAfterRestart(t *testing.T) {
	started := t0.Add(20*time.Minute - 30*time.Second)
	inDrain := func(d *appsv1.Deployment) {
		deleting(vocab.FinalizerDrain, vocab.FinalizerRecord)(d)
		d.Spec.Replicas = ptr.To[int32](0)
		d.Annotations[vocab.AnnotationDrainStarted] = started.Format(time.RFC3339)
		d.Annotations[vocab.AnnotationDrainReplicas] = "3"
	}

	t.Run("waiting for pods", func(t *testing.T) {
		d := deployment(inDrain)
		rs1, rs2, rs3 := history(d)
		e := newEnv(t, namespace(nil), d, rs1, rs2, rs3, pod(rs3, "web-h3-a", corev1.PodRunning))

		res := e.reconcileResult()
		assert.Empty(t, e.patches, "the drain was started and the ReplicaSets scaled before the restart")
		assert.Empty(t, e.events())
		assert.Equal(t, DrainPollInterval, res.RequeueAfter)

		e.deletePods("web-h3-a")
		e.reconcileResult()
		assert.Equal(t, []string{vocab.ReasonDrained, vocab.ReasonRecorded}, eventReasons(e.events()), "no second DrainStarted")
		assert.Equal(t, int32(3), *e.must(DeploymentFromRecord(e.record(), webKey, false)).Spec.Replicas)
		count, sum := histogram(t, e.r.Metrics, stepDrain)
		assert.Equal(t, uint64(1), count)
		assert.InDelta(t, 30.3, sum, 0.001, "the drain's duration counts from its start, before the restart")
	})

	t.Run("killed between the Deployment write and the ReplicaSets'", func(t *testing.T) {
		d := deployment(inDrain)
		rs1, rs2, rs3 := history(d)
		rs3.Spec.Replicas = ptr.To[int32](3)
		e := newEnv(t, namespace(nil), d, rs1, rs2, rs3, pod(rs3, "web-h3-a", corev1.PodRunning))

		e.reconcileResult()
		require.Len(t, e.patches, 1, "only the ReplicaSet is written")
		assert.Equal(t, "ReplicaSet", e.patches[0].kind)
		assert.Equal(t, int32(0), *e.replicaSet("web-h3").Spec.Replicas)
		assert.Equal(t, started.Format(time.RFC3339), e.deployment().Annotations[vocab.AnnotationDrainStarted], "the timeout still counts from the first start")
		assert.Empty(t, e.events())
	})

	t.Run("killed after writing the record", func(t *testing.T) {
		d := deployment(deleting(vocab.FinalizerRecord))
		rs1, rs2, rs3 := history(d)
		rec, err := BuildRecord(d, []*appsv1.ReplicaSet{rs1, rs2, rs3}, guardNamespace, t0.Add(48*time.Hour))
		require.NoError(t, err)
		e := newEnv(t, namespace(nil), d, rs1, rs2, rs3, rec)

		e.reconcileResult()
		assert.Empty(t, e.writes, "the record is not written again")
		assert.Equal(t, []string{vocab.ReasonRecorded}, eventReasons(e.events()))
		assert.Equal(t, t0.Add(48*time.Hour).Format(time.RFC3339), e.record().Annotations[vocab.AnnotationRecordExpires])
	})
}

func (e *env) must(d *appsv1.Deployment, err error) *appsv1.Deployment {
	e.t.Helper()
	require.NoError(e.t, err)
	return d
}

// histogram reads the cleanup duration histogram of a step.
func histogram(t *testing.T, m *Metrics, step string) (uint64, float64) {
	t.Helper()
	var dm dto.Metric
	require.NoError(t, m.cleanupDuration.WithLabelValues(step).(prometheus.Metric).Write(&dm))
	return dm.GetHistogram().GetSampleCount(), dm.GetHistogram().GetSampleSum()
}

func TestDrainTimesOut(t *testing.T) {
	d := deployment(func(d *appsv1.Deployment) {
		deleting(vocab.FinalizerDrain, vocab.FinalizerRecord)(d)
		d.Annotations[vocab.AnnotationDrainStarted] = t0.Format(time.RFC3339) // 20 minutes ago
		d.Annotations[vocab.AnnotationDrainReplicas] = "3"
	})
	rs1, rs2, rs3 := history(d)
	e := newEnv(t, namespace(nil), d, rs1, rs2, rs3, pod(rs3, "stuck", corev1.PodRunning))

	e.reconcileResult()

	evs := e.events()
	assert.Equal(t, []string{vocab.ReasonDrainTimedOut, vocab.ReasonRecorded}, eventReasons(evs), "the cleanup goes on")
	assert.Contains(t, evs[0], "Warning")
	assert.Contains(t, evs[0], "1 pods still running")
	assert.Equal(t, 1.0, e.cleanupSteps(stepDrain, resultTimedOut))
	assert.NotEmpty(t, e.record().Data[RecordKeyDeployment])
}

func TestCleanupSkipped(t *testing.T) {
	tests := []struct {
		name    string
		ns      *corev1.Namespace
		d       *appsv1.Deployment
		message string
	}{
		{name: "skip-cleanup annotation", ns: namespace(nil),
			d:       deployment(deleting(vocab.FinalizerDrain, otherFinalizer, vocab.FinalizerRecord), annotate(vocab.AnnotationSkipCleanup, "true")),
			message: vocab.AnnotationSkipCleanup},
		{name: "namespace opted out", ns: namespace(map[string]string{vocab.LabelGuard: vocab.LabelGuardDisabled}),
			d:       deployment(deleting(vocab.FinalizerDrain, otherFinalizer, vocab.FinalizerRecord)),
			message: "opted out"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rs1, rs2, rs3 := history(tt.d)
			e := newEnv(t, tt.ns, tt.d, rs1, rs2, rs3, pod(rs3, "web-h3-a", corev1.PodRunning))

			e.reconcileResult()

			assert.Equal(t, []string{otherFinalizer}, e.deployment().Finalizers)
			assert.Equal(t, [][]string{{otherFinalizer}}, e.finalizerPatches(), "one write")
			assert.Len(t, e.patches, 1, "nothing scaled")
			assert.Empty(t, e.writes, "no record")
			evs := e.events()
			assert.Equal(t, []string{vocab.ReasonCleanupSkipped}, eventReasons(evs))
			assert.Contains(t, evs[0], tt.message)
			assert.Equal(t, 1.0, e.cleanupSteps(stepDrain, resultSkipped))
			assert.Equal(t, 1.0, e.cleanupSteps(stepRecord, resultSkipped))
		})
	}
}

// regardingRecorder remembers what each Event was about.
type regardingRecorder struct {
	*events.FakeRecorder
	regarding []string
}

func (r *regardingRecorder) Eventf(regarding, related runtime.Object, eventtype, reason, action, note string, args ...any) {
	o := regarding.(client.Object)
	r.regarding = append(r.regarding, fmt.Sprintf("%s/%s", o.GetObjectKind().GroupVersionKind().Kind, o.GetName()))
	r.FakeRecorder.Eventf(regarding, related, eventtype, reason, action, note, args...)
}

// A terminating namespace: a Deployment deleted with its namespace is not
// recorded; the namespace controller deletes the pods, so no waiting. The
// Events are told about the Namespace, since the Deployment's namespace
// refuses them.
func TestCleanupInTerminatingNamespace(t *testing.T) {
	ns := namespace(nil)
	ns.UID = "uid-shop"
	ns.DeletionTimestamp = &metav1.Time{Time: t0}
	ns.Finalizers = []string{"test/keep"} // the fake client wants one on an object being deleted
	d := deployment(deleting(vocab.FinalizerDrain, vocab.FinalizerRecord))
	rs1, rs2, rs3 := history(d)
	rs3.Spec.Replicas = ptr.To[int32](3)
	e := newEnv(t, ns, d, rs1, rs2, rs3, pod(rs3, "web-h3-a", corev1.PodRunning))
	rec := &regardingRecorder{FakeRecorder: e.recorder}
	e.r.Recorder = rec

	e.reconcileResult()

	assert.Equal(t, [][]string{{vocab.FinalizerRecord}, nil}, e.finalizerPatches())
	assert.Len(t, e.patches, 2, "nothing scaled")
	assert.Empty(t, e.writes, "no record attempted")
	evs := e.events()
	assert.Equal(t, []string{vocab.ReasonCleanupShortened, vocab.ReasonCleanupShortened}, eventReasons(evs))
	assert.Equal(t, []string{"Namespace/shop", "Namespace/shop"}, rec.regarding)
	assert.Contains(t, evs[0], "Deployment web: namespace shop is terminating: drain skipped")
	assert.Contains(t, evs[1], "no record saved")
	assert.Equal(t, 1.0, e.cleanupSteps(stepDrain, resultSkipped))
	assert.Equal(t, 1.0, e.cleanupSteps(stepRecord, resultSkipped))
}

// The guard's own namespace starts terminating (an uninstall) while the
// record is being written: the create is refused, and the step gives up
// rather than retry for ever. The Deployment's namespace is not terminating:
// the Event is told about the Deployment.
func TestRecordRefusedByTerminatingGuardNamespace(t *testing.T) {
	d := deployment(deleting(vocab.FinalizerRecord))
	e := newEnv(t, namespace(nil), d)
	e.r.Client = &failingCreate{Client: e.r.Client, fail: func(obj client.Object) error {
		err := apierrors.NewForbidden(corev1.Resource("configmaps"), obj.GetName(), fmt.Errorf("unable to create new content in namespace %s because it is being terminated", obj.GetNamespace()))
		err.ErrStatus.Details.Causes = append(err.ErrStatus.Details.Causes, metav1.StatusCause{Type: corev1.NamespaceTerminatingCause})
		return err
	}}

	rec := &regardingRecorder{FakeRecorder: e.recorder}
	e.r.Recorder = rec

	e.reconcileResult()

	evs := e.events()
	assert.Equal(t, []string{vocab.ReasonRecordFailed}, eventReasons(evs))
	assert.Contains(t, evs[0], "the guard's namespace deployguard-system is terminating")
	assert.Equal(t, []string{"/web"}, rec.regarding, "told about the Deployment (typed, so without a kind), not its Namespace: that one is not terminating")
	assert.Equal(t, 1.0, e.cleanupSteps(stepRecord, resultFailed))
	err := e.client.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "web"}, &appsv1.Deployment{})
	assert.True(t, apierrors.IsNotFound(err), "its last finalizer removed, the Deployment is gone")
}

// failingCreate fails every create with fail(obj).
type failingCreate struct {
	client.Client
	fail func(client.Object) error
}

func (c *failingCreate) Create(_ context.Context, obj client.Object, _ ...client.CreateOption) error {
	return c.fail(obj)
}

func TestRecordStep(t *testing.T) {
	t.Run("replaces the record of an earlier Deployment of the same name", func(t *testing.T) {
		older := deployment(func(d *appsv1.Deployment) { d.UID = "uid-older"; d.Spec.Template = podTemplate("web:v1") })
		old, err := BuildRecord(older, nil, guardNamespace, t0)
		require.NoError(t, err)
		d := deployment(deleting(vocab.FinalizerRecord))
		e := newEnv(t, namespace(nil), d, old)

		e.reconcileResult()

		assert.Equal(t, []string{"update ConfigMap deployguard-record-shop.web"}, e.writes)
		rec := e.record()
		assert.Equal(t, "uid-web", rec.Annotations[vocab.AnnotationRecordUID])
		assert.Equal(t, "web:v3", e.must(DeploymentFromRecord(rec, webKey, false)).Spec.Template.Spec.Containers[0].Image)
	})
	t.Run("leaves the record of another Deployment alone", func(t *testing.T) {
		other := deployment(func(d *appsv1.Deployment) { d.Namespace = "blog"; d.UID = "uid-blog-web" })
		theirs, err := BuildRecord(other, nil, guardNamespace, t0)
		require.NoError(t, err)
		theirs.Name = RecordName("shop", "web") // two long names whose hashes meet
		d := deployment(deleting(vocab.FinalizerRecord))
		e := newEnv(t, namespace(nil), d, theirs)

		e.reconcileResult()

		assert.Empty(t, e.writes)
		assert.Equal(t, "blog", e.record().Annotations[vocab.AnnotationRecordNamespace], "not overwritten")
		evs := e.events()
		assert.Equal(t, []string{vocab.ReasonRecordFailed}, eventReasons(evs))
		assert.Contains(t, evs[0], `the record of another Deployment ("blog/web"`)
		assert.Equal(t, 1.0, e.cleanupSteps(stepRecord, resultFailed))
	})
	t.Run("leaves a ConfigMap of the user's alone", func(t *testing.T) {
		theirs := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: guardNamespace, Name: "deployguard-record-shop.web"}, Data: map[string]string{"mine": "yes"}}
		d := deployment(deleting(vocab.FinalizerRecord))
		e := newEnv(t, namespace(nil), d, theirs)

		e.reconcileResult()

		assert.Empty(t, e.writes)
		assert.Equal(t, map[string]string{"mine": "yes"}, e.record().Data)
		evs := e.events()
		assert.Equal(t, []string{vocab.ReasonRecordFailed}, eventReasons(evs))
		assert.Contains(t, evs[0], "not a deployguard record")
		assert.Equal(t, 1.0, e.cleanupSteps(stepRecord, resultFailed))
	})
}

// The record lives in the guard's namespace. A ConfigMap a tenant labelled as
// a record in its own namespace, by the name an earlier release used, is
// neither read nor written: it decides nothing.
func TestRecordIsWrittenInTheGuardsNamespace(t *testing.T) {
	forged := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: LegacyRecordName("web"),
			Labels: map[string]string{vocab.LabelRecord: "true"},
			Annotations: map[string]string{
				vocab.AnnotationRecordNamespace: "shop", vocab.AnnotationRecordOf: "web", vocab.AnnotationRecordUID: "uid-web",
				vocab.AnnotationRecordExpires: t0.Add(time.Hour).Format(time.RFC3339),
			}},
		Data: map[string]string{RecordKeyDeployment: "forged"},
	}
	d := deployment(deleting(vocab.FinalizerRecord))
	e := newEnv(t, namespace(nil), d, forged)

	e.reconcileResult()

	assert.Equal(t, []string{"create ConfigMap deployguard-record-shop.web"}, e.writes, "not taken as done by the tenant's ConfigMap")
	rec := e.record()
	assert.Equal(t, guardNamespace, rec.Namespace)
	assert.Equal(t, "web:v3", e.must(DeploymentFromRecord(rec, webKey, false)).Spec.Template.Spec.Containers[0].Image)
	left := &corev1.ConfigMap{}
	require.NoError(t, e.client.Get(context.Background(), client.ObjectKeyFromObject(forged), left))
	assert.Equal(t, forged.Data, left.Data, "the tenant's ConfigMap is left as it is")
	evs := e.events()
	assert.Equal(t, []string{vocab.ReasonRecorded}, eventReasons(evs))
	assert.Contains(t, evs[0], "ConfigMap deployguard-system/deployguard-record-shop.web")
}

// Someone changes the finalizers between the guard's read and its write: the
// write does not land, their change is kept, and the step is decided again.
func TestFinalizerRemovalConflict(t *testing.T) {
	d := deployment(deleting(vocab.FinalizerRecord))
	e := newEnv(t, namespace(nil), d)
	raced := false
	e.beforePatch = func(ctx context.Context, c client.WithWatch, obj client.Object) {
		if _, ok := obj.(*appsv1.Deployment); !ok || raced {
			return
		}
		raced = true
		other := &appsv1.Deployment{}
		require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(obj), other))
		other.Finalizers = append(other.Finalizers, otherFinalizer)
		require.NoError(t, c.Update(ctx, other))
	}

	res := e.reconcileResult()
	assert.Equal(t, conflictRetry, res.RequeueAfter, "decided again from a fresh read")
	assert.Equal(t, []string{vocab.FinalizerRecord, otherFinalizer}, e.deployment().Finalizers)
	assert.Empty(t, e.events(), "nothing told about a removal that did not happen")

	e.reconcileResult()
	assert.Equal(t, []string{otherFinalizer}, e.deployment().Finalizers)
	assert.Equal(t, []string{"create ConfigMap deployguard-record-shop.web"}, e.writes, "the record written once")
	assert.Equal(t, []string{vocab.ReasonRecorded}, eventReasons(e.events()))
}

func TestUnknownGuardFinalizerIsRemoved(t *testing.T) {
	future := vocab.Domain + "/future-step"
	d := deployment(deleting(future, vocab.FinalizerRecord))
	e := newEnv(t, namespace(nil), d)

	e.reconcileResult()

	assert.Equal(t, [][]string{{vocab.FinalizerRecord}, nil}, e.finalizerPatches())
	assert.Equal(t, []string{vocab.ReasonUnknownFinalizer, vocab.ReasonRecorded}, eventReasons(e.events()))
	assert.Equal(t, 1.0, e.cleanupSteps(stepUnknown, resultSkipped))
}

// A policy that refuses a Deployment at zero replicas must not block the
// deletion: the drain is recorded without the scale, and goes on through the
// ReplicaSets.
func TestDrainWhenScaleIsRefused(t *testing.T) {
	d := deployment(deleting(vocab.FinalizerDrain, vocab.FinalizerRecord))
	rs1, rs2, rs3 := history(d)
	rs3.Spec.Replicas = ptr.To[int32](3)
	e := newEnv(t, namespace(nil), d, rs1, rs2, rs3, pod(rs3, "web-h3-a", corev1.PodRunning))
	refused := false
	e.r.Client = &refuseScale{Client: e.r.Client, refused: &refused}

	e.reconcileResult()

	assert.True(t, refused)
	got := e.deployment()
	assert.Equal(t, int32(3), *got.Spec.Replicas)
	assert.Equal(t, "3", got.Annotations[vocab.AnnotationDrainReplicas])
	assert.NotEmpty(t, got.Annotations[vocab.AnnotationDrainStarted])
	assert.Equal(t, int32(0), *e.replicaSet("web-h3").Spec.Replicas)
	assert.Equal(t, []string{vocab.ReasonScaleRefused, vocab.ReasonDrainStarted}, eventReasons(e.events()))
}

// refuseScale refuses a Deployment patch that sets spec.replicas, as a policy
// would.
type refuseScale struct {
	client.Client
	refused *bool
}

func (c *refuseScale) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	if _, ok := obj.(*appsv1.Deployment); ok {
		data, err := patch.Data(obj)
		if err != nil {
			return err
		}
		if strings.Contains(string(data), `"replicas":0`) {
			*c.refused = true
			return apierrors.NewForbidden(appsv1.Resource("deployments"), obj.GetName(), fmt.Errorf("admission webhook denied the request: run at least 2 replicas"))
		}
	}
	return c.Client.Patch(ctx, obj, patch, opts...)
}

func TestNamespaceChanged(t *testing.T) {
	ns := func(labels map[string]string, deleting bool) *metav1.PartialObjectMetadata {
		o := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: "shop", Labels: labels}}
		if deleting {
			o.DeletionTimestamp = &metav1.Time{Time: t0}
		}
		return o
	}
	disabled := map[string]string{vocab.LabelGuard: vocab.LabelGuardDisabled}
	tests := []struct {
		name     string
		old, new *metav1.PartialObjectMetadata
		want     bool
	}{
		{name: "opted out", old: ns(nil, false), new: ns(disabled, false), want: true},
		{name: "taken back", old: ns(disabled, false), new: ns(nil, false), want: true},
		{name: "starts terminating: drains stop waiting", old: ns(nil, false), new: ns(nil, true), want: true},
		{name: "still terminating", old: ns(nil, true), new: ns(nil, true), want: false},
		{name: "another label", old: ns(nil, false), new: ns(map[string]string{"team": "shop"}, false), want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, namespaceChanged().Update(event.UpdateEvent{ObjectOld: tt.old, ObjectNew: tt.new}))
		})
	}
}

// refuseFinalizerRemoval refuses every Deployment patch that writes
// metadata.finalizers, as a webhook or policy checking the whole object would.
type refuseFinalizerRemoval struct {
	client.Client
}

func (c *refuseFinalizerRemoval) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	if _, ok := obj.(*appsv1.Deployment); ok {
		data, err := patch.Data(obj)
		if err != nil {
			return err
		}
		if strings.Contains(string(data), `"finalizers"`) {
			return apierrors.NewInvalid(appsv1.SchemeGroupVersion.WithKind("Deployment").GroupKind(), obj.GetName(), nil)
		}
	}
	return c.Client.Patch(ctx, obj, patch, opts...)
}

// A refused finalizer removal is retried, and the user is told why the
// deletion waits.
func TestFinalizerRemovalRefused(t *testing.T) {
	d := deployment(deleting(vocab.CanonicalFinalizers()...), annotate(vocab.AnnotationSkipCleanup, "true"))
	e := newEnv(t, namespace(nil), d)
	e.r.Client = &refuseFinalizerRemoval{Client: e.r.Client}

	_, err := e.r.Reconcile(ctrl.LoggerInto(context.Background(), ctrl.Log), ctrl.Request{NamespacedName: client.ObjectKey{Namespace: "shop", Name: "web"}})

	require.Error(t, err, "retried with backoff")
	evs := e.events()
	assert.Equal(t, []string{vocab.ReasonRemovalRefused}, eventReasons(evs))
	assert.Contains(t, evs[0], "break-glass")
	assert.Equal(t, vocab.CanonicalFinalizers(), e.deployment().Finalizers)
	assert.Equal(t, 0.0, e.cleanupSteps(stepDrain, resultSkipped), "nothing counted for a removal that did not happen")
}
