package native

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/authentication/user"
)

func selectorless(labels, annotations map[string]string) *appsv1.Deployment {
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web", Annotations: annotations},
		Spec: appsv1.DeploymentSpec{Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: labels},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "shop/web:1"}}},
		}},
	}
}

// deployguard-selector, evaluated as the API server would: an empty selector
// is set from the stable labels the template has, and marked; one with
// nothing stable selects the refusal marker, on the template too; anything
// else is left alone.
func TestSelectorRepair(t *testing.T) {
	rules, err := Load()
	require.NoError(t, err)
	params := Settings{StableLabelKeys: []string{"app.kubernetes.io/name", "app.kubernetes.io/instance", "app"}}.Params()
	refused := map[string]string{LabelEmptySelector: EmptySelectorRefused}
	for _, tc := range []struct {
		name            string
		in              *appsv1.Deployment
		params          *Params
		wantSelector    map[string]string
		wantLabels      map[string]string
		wantAnnotations map[string]string
	}{
		{name: "stable labels, version left out",
			in:              selectorless(map[string]string{"app": "web", "app.kubernetes.io/instance": "web-1", "version": "v1"}, nil),
			wantSelector:    map[string]string{"app": "web", "app.kubernetes.io/instance": "web-1"},
			wantLabels:      map[string]string{"app": "web", "app.kubernetes.io/instance": "web-1", "version": "v1"},
			wantAnnotations: map[string]string{AnnotationSelectorRepaired: "true"}},
		{name: "annotations kept",
			in:              selectorless(map[string]string{"app": "web"}, map[string]string{"team": "shop"}),
			wantSelector:    map[string]string{"app": "web"},
			wantLabels:      map[string]string{"app": "web"},
			wantAnnotations: map[string]string{"team": "shop", AnnotationSelectorRepaired: "true"}},
		{name: "an empty stable label is not used",
			in:           selectorless(map[string]string{"app": "", "tier": "front"}, nil),
			wantSelector: refused, wantLabels: map[string]string{"app": "", "tier": "front", LabelEmptySelector: EmptySelectorRefused}},
		{name: "no labels at all",
			in:           selectorless(nil, nil),
			wantSelector: refused, wantLabels: refused},
		{name: "params without keys leave it to the API server",
			in:     selectorless(map[string]string{"app": "web"}, nil),
			params: Settings{}.Params()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := params
			if tc.params != nil {
				p = tc.params
			}
			before := tc.in.DeepCopy()
			got, err := rules.Mutate(context.Background(), Request{Operation: admission.Create, Object: tc.in, Namespace: "shop", Name: "web",
				User: &user.DefaultInfo{Name: "someone"}}, p, Selector)
			require.NoError(t, err)
			assert.Equal(t, before, tc.in, "the request's object is not modified")
			if tc.wantSelector == nil {
				assert.Same(t, tc.in, got)
				return
			}
			require.NotNil(t, got.Spec.Selector)
			assert.Equal(t, tc.wantSelector, got.Spec.Selector.MatchLabels)
			assert.Equal(t, tc.wantLabels, got.Spec.Template.Labels)
			assert.Equal(t, tc.wantAnnotations, got.Annotations)
			assert.Equal(t, map[string]string{LabelDefaulting: DefaultingPending, LabelRefusals: DefaultingPending}, got.Labels,
				"labelled for the webhook's entry and the refusals' binding for creates")
			assert.Equal(t, before.Spec.Template.Spec, got.Spec.Template.Spec)
		})
	}
	// The creates the guard's mutating webhook has something to do for are
	// labelled for its entry for creates, their selector left alone; the
	// others are left as they are, unlabelled.
	t.Run("the webhook's creates are labelled", func(t *testing.T) {
		selected := func(mut func(d *appsv1.Deployment)) *appsv1.Deployment {
			d := selectorless(map[string]string{"app": "web"}, nil)
			d.Labels = map[string]string{"team": "shop"}
			d.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}
			mut(d)
			return d
		}
		for _, tc := range []struct {
			name     string
			in       *appsv1.Deployment
			labelled bool
		}{
			{"an ordinary create", selected(func(*appsv1.Deployment) {}), false},
			{"a cleanup step asked for", selected(func(d *appsv1.Deployment) { d.Annotations = map[string]string{"deployguard.io/cleanup": "record"} }), true},
			{"a guard finalizer", selected(func(d *appsv1.Deployment) { d.Finalizers = []string{"example.com/keep", "deployguard.io/record"} }), true},
			{"another finalizer", selected(func(d *appsv1.Deployment) { d.Finalizers = []string{"example.com/keep"} }), false},
			{"every replica down at once", selected(unavailable(3, intstr.FromString("100%"))), true},
			{"as many unavailable as replicas", selected(unavailable(2, intstr.FromInt32(2))), true},
			{"a quarter unavailable", selected(unavailable(4, intstr.FromString("25%"))), false},
			{"the refusal marker written by hand", selected(func(d *appsv1.Deployment) {
				d.Spec.Selector.MatchLabels[LabelEmptySelector] = EmptySelectorRefused
				d.Spec.Template.Labels[LabelEmptySelector] = EmptySelectorRefused
			}), true},
			{"no labels of its own", selected(func(d *appsv1.Deployment) {
				d.Labels = nil
				d.Annotations = map[string]string{"deployguard.io/cleanup": "drain"}
			}), true},
		} {
			t.Run(tc.name, func(t *testing.T) {
				before := tc.in.DeepCopy()
				got, err := rules.Mutate(context.Background(), Request{Operation: admission.Create, Object: tc.in, Namespace: "shop", Name: "web",
					User: &user.DefaultInfo{Name: "someone"}}, params, Selector)
				require.NoError(t, err)
				assert.Equal(t, before, tc.in, "the request's object is not modified")
				if !tc.labelled {
					assert.Same(t, tc.in, got)
					return
				}
				want := before.DeepCopy()
				if want.Labels == nil {
					want.Labels = map[string]string{}
				}
				want.Labels[LabelDefaulting] = DefaultingPending
				want.Labels[LabelRefusals] = DefaultingPending
				want.APIVersion, want.Kind = got.APIVersion, got.Kind
				assert.Equal(t, want, got, "the label added, nothing else changed")
			})
		}
	})
	t.Run("a selector is never changed", func(t *testing.T) {
		d := selectorless(map[string]string{"app": "web"}, nil)
		d.Spec.Selector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpExists}}}
		got, err := rules.Mutate(context.Background(), Request{Operation: admission.Create, Object: d, User: &user.DefaultInfo{}}, params, Selector)
		require.NoError(t, err)
		assert.Same(t, d, got)
	})
}

// An empty selector that cannot be repaired is refused by
// deployguard-refusals, after deployguard-selector marked it, with what to
// add; an update of a Deployment that already had the marker is not.
func TestUnrepairableSelectorRefused(t *testing.T) {
	rules, err := Load()
	require.NoError(t, err)
	params := Settings{StableLabelKeys: []string{"app.kubernetes.io/name", "app"}}.Params()
	someone := &user.DefaultInfo{Name: "someone"}
	marked, err := rules.Mutate(context.Background(), Request{Operation: admission.Create, Object: selectorless(map[string]string{"tier": "front"}, nil), User: someone}, params, Selector)
	require.NoError(t, err)
	fs := rules.Evaluate(context.Background(), Request{Operation: admission.Create, Object: marked, Namespace: "shop", Name: "web", User: someone}, params, Refusals)
	require.Len(t, fs, 1)
	assert.Equal(t, Finding{Policy: Refusals, Field: "spec.selector", Reason: metav1.StatusReasonInvalid,
		Message: "the selector is empty and cannot be repaired: the pod template has none of the stable labels app.kubernetes.io/name, app. " +
			"Add one to spec.template.metadata.labels (for example app.kubernetes.io/name: web), or set spec.selector.matchLabels to labels the template carries"}, fs[0])

	fs = rules.Evaluate(context.Background(), Request{Operation: admission.Update, Object: marked, OldObject: marked, Namespace: "shop", Name: "web", User: someone}, params, Refusals)
	assert.Empty(t, fs)

	// A generated name is not the user's to write into a label.
	generated := marked.DeepCopy()
	generated.GenerateName, generated.Name = "web-", "web-x7k2p"
	fs = rules.Evaluate(context.Background(), Request{Operation: admission.Create, Object: generated, Namespace: "shop", Name: generated.Name, User: someone}, params, Refusals)
	require.Len(t, fs, 1)
	assert.Contains(t, fs[0].Message, "(for example app.kubernetes.io/name: <name>)")
}

func replicasOf(n int32) *int32 { return &n }

// unavailable sets replicas and a rolling update's maxUnavailable.
func unavailable(replicas int32, maxUnavailable intstr.IntOrString) func(*appsv1.Deployment) {
	return func(d *appsv1.Deployment) {
		d.Spec.Replicas = replicasOf(replicas)
		d.Spec.Strategy.RollingUpdate = &appsv1.RollingUpdateDeployment{MaxUnavailable: &maxUnavailable}
	}
}
