package policy

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/event"
)

const (
	guardNamespace  = "deployguard-system"
	testLabel       = "deployguard.io/policy"
	errorAnnotation = "deployguard.io/policy-error"
)

func policyConfigMap(name string, data map[string]string) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: guardNamespace, Name: name, Labels: map[string]string{testLabel: "true"}},
		Data:       data,
	}
}

const replicasPolicy = `package deployguard.replicas

deny contains {"msg": "run at least 2 replicas", "field": "spec.replicas"} if input.object.spec.replicas < 2
`

const ownersPolicy = `package deployguard.owners

warn contains "add an owner label" if not input.object.metadata.labels.owner
`

// recordedEvent is an Event as the test recorder saw it.
type recordedEvent struct {
	object, eventType, reason, note string
}

type testRecorder struct {
	mu     sync.Mutex
	events []recordedEvent
}

func (r *testRecorder) Eventf(regarding, _ runtime.Object, eventType, reason, _, note string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	name := ""
	if o, ok := regarding.(client.Object); ok {
		name = o.GetName()
	}
	r.events = append(r.events, recordedEvent{object: name, eventType: eventType, reason: reason, note: fmt.Sprintf(note, args...)})
}

// take returns and forgets the events recorded so far.
func (r *testRecorder) take() []recordedEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	ev := r.events
	r.events = nil
	return ev
}

func newTestSource(t *testing.T, base []Source, objs ...client.Object) (*ConfigMapSource, client.Client, *testRecorder) {
	t.Helper()
	e, err := New(Options{})
	require.NoError(t, err)
	c := fake.NewClientBuilder().WithObjects(objs...).Build()
	rec := &testRecorder{}
	return &ConfigMapSource{
		Engine: e, Base: base, Namespace: guardNamespace, LabelKey: testLabel, ErrorAnnotation: errorAnnotation,
		Client: c, Recorder: rec,
	}, c, rec
}

func reconcileOnce(t *testing.T, s *ConfigMapSource) {
	t.Helper()
	_, err := s.Reconcile(context.Background(), s.setRequest())
	require.NoError(t, err)
}

func policyNames(e *Engine) []string {
	var names []string
	for _, p := range e.Policies() {
		names = append(names, p.Name)
	}
	return names
}

func annotationOf(t *testing.T, c client.Client, name string) (string, bool) {
	t.Helper()
	var cm corev1.ConfigMap
	require.NoError(t, c.Get(context.Background(), client.ObjectKey{Namespace: guardNamespace, Name: name}, &cm))
	v, ok := cm.Annotations[errorAnnotation]
	return v, ok
}

// TestConfigMapSourceLifecycle walks one policy ConfigMap set through the
// changes a platform team makes: add, break, fix, delete.
func TestConfigMapSourceLifecycle(t *testing.T) {
	ctx := context.Background()
	good := policyConfigMap("team-a", map[string]string{"replicas.rego": replicasPolicy, "README.md": "not a module"})
	broken := policyConfigMap("team-b", map[string]string{"owners.rego": "package deployguard.owners\n\nwarn contains msg if {\n\tmsg :=\n}\n"})
	unlabelled := policyConfigMap("not-policy", map[string]string{"x.rego": "package deployguard.x\n\ndeny contains \"x\" if true\n"})
	unlabelled.Labels = nil
	elsewhere := policyConfigMap("elsewhere", map[string]string{"y.rego": "package deployguard.y\n\ndeny contains \"y\" if true\n"})
	elsewhere.Namespace = "team-a"
	s, c, rec := newTestSource(t, Builtins(), good, broken, unlabelled, elsewhere)

	require.Error(t, s.Ready(nil), "not ready before the first load")

	// 1. The good ConfigMap is in force; the broken one is reported on itself.
	reconcileOnce(t, s)
	assert.NoError(t, s.Ready(nil))
	assert.Equal(t, []string{"hostnamespaces", "images", "probes", "replicas", "resources"}, policyNames(s.Engine))
	_, has := annotationOf(t, c, "team-a")
	assert.False(t, has, "a good ConfigMap is not annotated")
	msg, has := annotationOf(t, c, "team-b")
	require.True(t, has)
	assert.Contains(t, msg, "configmap/deployguard-system/team-b/owners.rego:5: rego_parse_error")
	assert.Contains(t, msg, "not in force")
	events := rec.take()
	require.Len(t, events, 1)
	assert.Equal(t, recordedEvent{object: "team-b", eventType: corev1.EventTypeWarning, reason: ReasonPolicyRejected, note: msg}, events[0])

	d := deployment(goodContainer("web"))
	d.Spec.Replicas = ptr.To[int32](1)
	assert.Equal(t, []string{"replicas"}, policiesOf(s.Engine.Evaluate(ctx, createInput(t, d)).Denied))

	// 2. Reloading with nothing changed repeats no Event.
	reconcileOnce(t, s)
	assert.Empty(t, rec.take())

	// 3. Fixing the ConfigMap loads it and clears the annotation.
	broken.Data = map[string]string{"owners.rego": ownersPolicy}
	require.NoError(t, c.Update(ctx, withData(t, c, broken)))
	reconcileOnce(t, s)
	assert.Contains(t, policyNames(s.Engine), "owners")
	_, has = annotationOf(t, c, "team-b")
	assert.False(t, has, "annotation cleared once the ConfigMap loads")
	events = rec.take()
	require.Len(t, events, 1)
	assert.Equal(t, "team-b", events[0].object)
	assert.Equal(t, ReasonPolicyLoaded, events[0].reason)

	// 4. Deleting a ConfigMap lifts its rules.
	require.NoError(t, c.Delete(ctx, good))
	reconcileOnce(t, s)
	assert.NotContains(t, policyNames(s.Engine), "replicas")
	assert.Empty(t, s.Engine.Evaluate(ctx, createInput(t, d)).Denied)
}

// withData re-reads a ConfigMap, so that an update carries its current
// resourceVersion and annotations, and sets the wanted data.
func withData(t *testing.T, c client.Client, want *corev1.ConfigMap) *corev1.ConfigMap {
	t.Helper()
	var cm corev1.ConfigMap
	require.NoError(t, c.Get(context.Background(), client.ObjectKeyFromObject(want), &cm))
	cm.Data = want.Data
	return &cm
}

// TestConfigMapSourceConflicts: a ConfigMap that clashes with the built-ins
// or with another ConfigMap is the one rejected; the earlier one stays.
func TestConfigMapSourceConflicts(t *testing.T) {
	clash := policyConfigMap("a-clash", map[string]string{"images.rego": "package deployguard.images\n\ndeny contains \"mine\" if true\n"})
	first := policyConfigMap("b-first", map[string]string{"replicas.rego": replicasPolicy})
	second := policyConfigMap("c-second", map[string]string{
		"replicas.rego": replicasPolicy,
		"owners.rego":   ownersPolicy, // fine on its own, but goes with its ConfigMap
	})
	s, c, _ := newTestSource(t, Builtins(), clash, first, second)
	reconcileOnce(t, s)

	assert.Equal(t, []string{"hostnamespaces", "images", "probes", "replicas", "resources"}, policyNames(s.Engine))
	for _, p := range s.Engine.Policies() {
		if p.Name == "images" {
			assert.Equal(t, "builtin/images.rego", p.Source)
		}
	}
	msg, has := annotationOf(t, c, "a-clash")
	require.True(t, has)
	assert.Contains(t, msg, `configmap/deployguard-system/a-clash/images.rego:1: policy "images" is defined twice: in builtin/images.rego`)
	msg, has = annotationOf(t, c, "c-second")
	require.True(t, has)
	assert.Contains(t, msg, `policy "replicas" is defined twice: in configmap/deployguard-system/b-first/replicas.rego`)
	_, has = annotationOf(t, c, "b-first")
	assert.False(t, has)
}

// TestConfigMapSourceBrokenBase: if Base itself fails, nothing changes: the
// last good set stays, and the replica does not turn ready on a set without
// the ConfigMaps.
func TestConfigMapSourceBrokenBase(t *testing.T) {
	base := []Source{regoSource("/policies/bad.rego", "package deployguard.bad\n\ndeny contains")}
	s, _, _ := newTestSource(t, base, policyConfigMap("team-a", map[string]string{"replicas.rego": replicasPolicy}))
	require.NoError(t, s.Engine.Load(context.Background(), Builtins()))

	_, err := s.Reconcile(context.Background(), s.setRequest())
	assert.NoError(t, err, "retrying cannot fix the base sources")
	assert.Equal(t, []string{"hostnamespaces", "images", "probes", "resources"}, policyNames(s.Engine))
	assert.Error(t, s.Ready(nil))
}

func TestPolicyChangePredicate(t *testing.T) {
	s := &ConfigMapSource{Namespace: guardNamespace, LabelKey: testLabel}
	p := s.policyChange()
	labelled := policyConfigMap("team-a", map[string]string{"a.rego": replicasPolicy})
	otherNS := labelled.DeepCopy()
	otherNS.Namespace = "team-a"
	unlabelled := labelled.DeepCopy()
	unlabelled.Labels = nil
	annotated := labelled.DeepCopy()
	annotated.Annotations = map[string]string{errorAnnotation: "x"}
	edited := labelled.DeepCopy()
	edited.Data["a.rego"] = ownersPolicy

	tests := []struct {
		name string
		got  bool
		want bool
	}{
		{name: "create labelled", got: p.Create(event.CreateEvent{Object: labelled}), want: true},
		{name: "create in another namespace", got: p.Create(event.CreateEvent{Object: otherNS}), want: false},
		{name: "create unlabelled", got: p.Create(event.CreateEvent{Object: unlabelled}), want: false},
		{name: "delete labelled", got: p.Delete(event.DeleteEvent{Object: labelled}), want: true},
		{name: "data edited", got: p.Update(event.UpdateEvent{ObjectOld: labelled, ObjectNew: edited}), want: true},
		{name: "only our annotation", got: p.Update(event.UpdateEvent{ObjectOld: labelled, ObjectNew: annotated}), want: false},
		{name: "label removed", got: p.Update(event.UpdateEvent{ObjectOld: labelled, ObjectNew: unlabelled}), want: true},
		{name: "label added", got: p.Update(event.UpdateEvent{ObjectOld: unlabelled, ObjectNew: labelled}), want: true},
		{name: "unlabelled edited", got: p.Update(event.UpdateEvent{ObjectOld: unlabelled, ObjectNew: unlabelled}), want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, tt.got)
		})
	}
}

func TestAnnotationChange(t *testing.T) {
	tests := []struct {
		name        string
		annotations map[string]string
		want        string
		change      *string
	}{
		{name: "good and clean", annotations: nil, want: "", change: nil},
		{name: "newly broken", annotations: nil, want: "err", change: ptrTo("err")},
		{name: "still broken the same way", annotations: map[string]string{errorAnnotation: "err"}, want: "err", change: nil},
		{name: "broken differently", annotations: map[string]string{errorAnnotation: "old"}, want: "err", change: ptrTo("err")},
		{name: "fixed", annotations: map[string]string{errorAnnotation: "old"}, want: "", change: ptrTo("")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.change, annotationChange(tt.annotations, errorAnnotation, tt.want))
		})
	}
}

func ptrTo(s string) *string { return &s }
