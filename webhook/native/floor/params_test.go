package floor

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/yaml"

	"github.com/deployguard/deployguard/webhook/native"
	"github.com/deployguard/deployguard/webhook/review"
	"github.com/deployguard/deployguard/webhook/review/reviewtest"
)

// installed are config/native's refusals policy (its folded lines rewritten,
// as kustomize does), binding and params for o.
func installed(t *testing.T, o *review.Options) (*admissionregistrationv1.ValidatingAdmissionPolicy, *admissionregistrationv1.ValidatingAdmissionPolicyBinding, *corev1.ConfigMap) {
	t.Helper()
	rules, err := native.Load()
	require.NoError(t, err)
	var p *admissionregistrationv1.ValidatingAdmissionPolicy
	for _, x := range rules.Policies {
		if x.Name == native.Refusals {
			p = x.DeepCopy()
		}
	}
	for i := range p.Spec.Variables {
		p.Spec.Variables[i].Expression = strings.ReplaceAll(p.Spec.Variables[i].Expression, "\n", "\n\n")
	}
	for i := range p.Spec.MatchConditions {
		p.Spec.MatchConditions[i].Expression = strings.ReplaceAll(p.Spec.MatchConditions[i].Expression, "\n", "\n\n")
	}
	b, err := os.ReadFile(filepath.Join("..", "..", "..", "config", "native", "bindings.yaml"))
	require.NoError(t, err)
	vb := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
	for _, doc := range strings.Split(string(b), "\n---\n") {
		if strings.Contains(doc, "\n  name: "+native.Refusals+"\n") {
			require.NoError(t, yaml.UnmarshalStrict([]byte(doc), vb))
		}
	}
	require.Equal(t, native.Refusals, vb.Name)
	return p, vb, o.NativeSettings().ConfigMap("deployguard-system")
}

// installedForCreates are config/native's binding of the refusals for the
// creates, and the selector policy that labels them, with its binding.
func installedForCreates(t *testing.T) (*admissionregistrationv1.ValidatingAdmissionPolicyBinding, *admissionregistrationv1.MutatingAdmissionPolicy, *admissionregistrationv1.MutatingAdmissionPolicyBinding) {
	t.Helper()
	rules, err := native.Load()
	require.NoError(t, err)
	b, err := os.ReadFile(filepath.Join("..", "..", "..", "config", "native", "bindings.yaml"))
	require.NoError(t, err)
	var cb *admissionregistrationv1.ValidatingAdmissionPolicyBinding
	var mb *admissionregistrationv1.MutatingAdmissionPolicyBinding
	for _, doc := range strings.Split(string(b), "\n---\n") {
		switch {
		case strings.Contains(doc, "\nkind: MutatingAdmissionPolicyBinding\n"):
			mb = &admissionregistrationv1.MutatingAdmissionPolicyBinding{}
			require.NoError(t, yaml.UnmarshalStrict([]byte(doc), mb))
		case strings.Contains(doc, "name: "+native.RefusalsCreateBinding+"\n"):
			cb = &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
			require.NoError(t, yaml.UnmarshalStrict([]byte(doc), cb))
		}
	}
	require.NotNil(t, cb)
	require.NotNil(t, mb)
	return cb, rules.Mutations[0].DeepCopy(), mb
}

// The guard trusts the API server with the refusals only when it enforces
// them as the guard would.
func TestNativePoliciesEnforced(t *testing.T) {
	scheme := runtime.NewScheme()
	require.NoError(t, clientgoscheme.AddToScheme(scheme))
	o := reviewtest.Options()
	for _, tc := range []struct {
		name string
		mut  func(*admissionregistrationv1.ValidatingAdmissionPolicy, *admissionregistrationv1.ValidatingAdmissionPolicyBinding, *corev1.ConfigMap) []client.Object
		why  string
	}{
		{"as installed", nil, ""},
		{"no binding", func(p *admissionregistrationv1.ValidatingAdmissionPolicy, _ *admissionregistrationv1.ValidatingAdmissionPolicyBinding, cm *corev1.ConfigMap) []client.Object {
			return []client.Object{p, cm}
		}, "ValidatingAdmissionPolicyBinding deployguard-refusals is not installed"},
		{"an older policy", func(p *admissionregistrationv1.ValidatingAdmissionPolicy, b *admissionregistrationv1.ValidatingAdmissionPolicyBinding, cm *corev1.ConfigMap) []client.Object {
			p.Spec.Validations = p.Spec.Validations[1:]
			return []client.Object{p, b, cm}
		}, "is not this version's"},
		// A match condition that leaves out what a validation refuses
		// (here: everything) disables the refusals as surely.
		{"a narrowed match condition", func(p *admissionregistrationv1.ValidatingAdmissionPolicy, b *admissionregistrationv1.ValidatingAdmissionPolicyBinding, cm *corev1.ConfigMap) []client.Object {
			p.Spec.MatchConditions[0].Expression = "false"
			return []client.Object{p, b, cm}
		}, "is not this version's"},
		// Stored as the API server defaults it: the same policy.
		{"as the API server stores it", func(p *admissionregistrationv1.ValidatingAdmissionPolicy, b *admissionregistrationv1.ValidatingAdmissionPolicyBinding, cm *corev1.ConfigMap) []client.Object {
			all, equivalent := admissionregistrationv1.AllScopes, admissionregistrationv1.Equivalent
			for i := range p.Spec.MatchConstraints.ResourceRules {
				p.Spec.MatchConstraints.ResourceRules[i].Scope = &all
				p.Spec.MatchConstraints.ResourceRules[i].ResourceNames = []string{}
			}
			p.Spec.MatchConstraints.ExcludeResourceRules = []admissionregistrationv1.NamedRuleWithOperations{}
			p.Spec.MatchConstraints.MatchPolicy = &equivalent
			p.Spec.MatchConstraints.NamespaceSelector = &metav1.LabelSelector{}
			p.Spec.MatchConstraints.ObjectSelector = &metav1.LabelSelector{}
			return []client.Object{p, b, cm}
		}, ""},
		// The same expressions, refusing less.
		{"a policy that fails open", func(p *admissionregistrationv1.ValidatingAdmissionPolicy, b *admissionregistrationv1.ValidatingAdmissionPolicyBinding, cm *corev1.ConfigMap) []client.Object {
			ignore := admissionregistrationv1.Ignore
			p.Spec.FailurePolicy = &ignore
			return []client.Object{p, b, cm}
		}, "its failurePolicy differs"},
		{"a policy that no longer matches deletions", func(p *admissionregistrationv1.ValidatingAdmissionPolicy, b *admissionregistrationv1.ValidatingAdmissionPolicyBinding, cm *corev1.ConfigMap) []client.Object {
			p.Spec.MatchConstraints.ResourceRules[0].Operations = []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update}
			return []client.Object{p, b, cm}
		}, "its matchConstraints differs"},
		{"a policy narrowed by an object selector", func(p *admissionregistrationv1.ValidatingAdmissionPolicy, b *admissionregistrationv1.ValidatingAdmissionPolicyBinding, cm *corev1.ConfigMap) []client.Object {
			p.Spec.MatchConstraints.ObjectSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"guarded": "true"}}
			return []client.Object{p, b, cm}
		}, "its matchConstraints differs"},
		{"params of another namespace", func(p *admissionregistrationv1.ValidatingAdmissionPolicy, b *admissionregistrationv1.ValidatingAdmissionPolicyBinding, cm *corev1.ConfigMap) []client.Object {
			b.Spec.ParamRef.Namespace = "elsewhere"
			return []client.Object{p, b, cm}
		}, "does not read ConfigMap deployguard-system/deployguard-admission-params"},
		{"a binding that only warns", func(p *admissionregistrationv1.ValidatingAdmissionPolicy, b *admissionregistrationv1.ValidatingAdmissionPolicyBinding, cm *corev1.ConfigMap) []client.Object {
			b.Spec.ValidationActions = []admissionregistrationv1.ValidationAction{admissionregistrationv1.Warn}
			return []client.Object{p, b, cm}
		}, "does not deny"},
		{"stale params", func(p *admissionregistrationv1.ValidatingAdmissionPolicy, b *admissionregistrationv1.ValidatingAdmissionPolicyBinding, cm *corev1.ConfigMap) []client.Object {
			cm.Data["guardUsername"] = "system:serviceaccount:old:deployguard"
			return []client.Object{p, b, cm}
		}, "guardUsername"},
		{"a binding that no longer takes deletions", func(p *admissionregistrationv1.ValidatingAdmissionPolicy, b *admissionregistrationv1.ValidatingAdmissionPolicyBinding, cm *corev1.ConfigMap) []client.Object {
			b.Spec.MatchResources.ResourceRules[0].Operations = []admissionregistrationv1.OperationType{admissionregistrationv1.Update}
			return []client.Object{p, b, cm}
		}, "does not bind updates and deletions"},
		// The layout before the binding for creates: one binding for
		// every operation, which needs no label.
		{"one binding for every operation", func(p *admissionregistrationv1.ValidatingAdmissionPolicy, b *admissionregistrationv1.ValidatingAdmissionPolicyBinding, cm *corev1.ConfigMap) []client.Object {
			b.Spec.MatchResources.ResourceRules = nil
			return []client.Object{p, b, cm}
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, b, cm := installed(t, o)
			objs := []client.Object{p, b, cm}
			if tc.mut != nil {
				objs = tc.mut(p, b, cm)
			}
			cb, mp, mb := installedForCreates(t)
			objs = append(objs, cb, mp, mb)
			c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).Build()
			ok, why, err := PoliciesEnforced(context.Background(), c, "deployguard-system", o)
			require.NoError(t, err)
			assert.Equal(t, tc.why == "", ok, why)
			assert.Contains(t, why, tc.why)
		})
	}
}

// The creates reach the refusals by deployguard-selector's label: without
// the binding for creates, or without the policy that labels them, the API
// server judges none.
func TestNativeRefusalsJudgeTheCreates(t *testing.T) {
	scheme := runtime.NewScheme()
	require.NoError(t, clientgoscheme.AddToScheme(scheme))
	o := reviewtest.Options()
	type objs struct {
		cb *admissionregistrationv1.ValidatingAdmissionPolicyBinding
		mp *admissionregistrationv1.MutatingAdmissionPolicy
		mb *admissionregistrationv1.MutatingAdmissionPolicyBinding
	}
	for _, tc := range []struct {
		name string
		mut  func(*objs)
		why  string
	}{
		{"as installed", func(*objs) {}, ""},
		{"no binding for creates", func(x *objs) { x.cb = nil }, "ValidatingAdmissionPolicyBinding deployguard-refusals-create is not installed"},
		{"a binding for creates that only warns", func(x *objs) {
			x.cb.Spec.ValidationActions = []admissionregistrationv1.ValidationAction{admissionregistrationv1.Warn}
		}, "deployguard-refusals-create does not deny"},
		{"a binding for creates of another policy", func(x *objs) { x.cb.Spec.PolicyName = "deployguard-warnings" }, "does not bind deployguard-refusals"},
		{"a binding for creates that takes updates", func(x *objs) {
			x.cb.Spec.MatchResources.ResourceRules[0].Operations = []admissionregistrationv1.OperationType{admissionregistrationv1.Update}
		}, "does not bind creates"},
		{"a binding for creates by another label", func(x *objs) {
			x.cb.Spec.MatchResources.ObjectSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"guarded": "true"}}
		}, "selects creates by a label deployguard-selector does not set"},
		{"a binding for every create needs no label", func(x *objs) {
			x.cb.Spec.MatchResources.ObjectSelector = nil
			x.mp, x.mb = nil, nil
		}, ""},
		{"no selector policy to label them", func(x *objs) { x.mp, x.mb = nil, nil }, "judges only the creates deployguard-selector labels, and MutatingAdmissionPolicy deployguard-selector is not installed"},
		{"a binding for creates in fewer namespaces", func(x *objs) {
			x.cb.Spec.MatchResources.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"team": "shop"}}
		}, "deployguard-refusals-create does not take the namespaces deployguard-refusals takes"},
		{"a selector policy bound in fewer namespaces", func(x *objs) {
			x.mb.Spec.MatchResources.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"team": "shop"}}
		}, "MutatingAdmissionPolicyBinding deployguard-selector does not take the namespaces"},
		{"an older selector policy", func(x *objs) {
			// One that does not label what the refusals refuse.
			x.mp.Spec.MatchConditions[0].Expression = "'deployguard.io/cleanup' in object.metadata.?annotations.orValue({})"
		}, "is not this version's"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, b, cm := installed(t, o)
			var x objs
			x.cb, x.mp, x.mb = installedForCreates(t)
			tc.mut(&x)
			all := []client.Object{p, b, cm}
			for _, obj := range []client.Object{x.cb, x.mp, x.mb} {
				if !reflect.ValueOf(obj).IsNil() {
					all = append(all, obj)
				}
			}
			c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(all...).Build()
			ok, why, err := PoliciesEnforced(context.Background(), c, "deployguard-system", o)
			require.NoError(t, err)
			assert.Equal(t, tc.why == "", ok, why)
			assert.Contains(t, why, tc.why)
		})
	}
}

// The guard says when the API server does not repair selectors as it would.
func TestNativeSelectorRepairInstalled(t *testing.T) {
	scheme := runtime.NewScheme()
	require.NoError(t, clientgoscheme.AddToScheme(scheme))
	rules, err := native.Load()
	require.NoError(t, err)
	b, err := os.ReadFile(filepath.Join("..", "..", "..", "config", "native", "bindings.yaml"))
	require.NoError(t, err)
	docs := strings.Split(string(b), "\n---\n")
	installed := func() (*admissionregistrationv1.MutatingAdmissionPolicy, *admissionregistrationv1.MutatingAdmissionPolicyBinding) {
		p := rules.Mutations[0].DeepCopy()
		p.Spec.Mutations[0].JSONPatch.Expression = strings.ReplaceAll(p.Spec.Mutations[0].JSONPatch.Expression, "\n", "\n\n")
		mb := &admissionregistrationv1.MutatingAdmissionPolicyBinding{}
		require.NoError(t, yaml.UnmarshalStrict([]byte(docs[len(docs)-1]), mb))
		return p, mb
	}
	for _, tc := range []struct {
		name string
		objs func(*admissionregistrationv1.MutatingAdmissionPolicy, *admissionregistrationv1.MutatingAdmissionPolicyBinding) []client.Object
		why  string
	}{
		{"as installed", func(p *admissionregistrationv1.MutatingAdmissionPolicy, b *admissionregistrationv1.MutatingAdmissionPolicyBinding) []client.Object {
			return []client.Object{p, b}
		}, ""},
		{"not installed", func(*admissionregistrationv1.MutatingAdmissionPolicy, *admissionregistrationv1.MutatingAdmissionPolicyBinding) []client.Object {
			return nil
		}, "MutatingAdmissionPolicy deployguard-selector is not installed"},
		{"no binding", func(p *admissionregistrationv1.MutatingAdmissionPolicy, _ *admissionregistrationv1.MutatingAdmissionPolicyBinding) []client.Object {
			return []client.Object{p}
		}, "MutatingAdmissionPolicyBinding deployguard-selector is not installed"},
		{"an older policy", func(p *admissionregistrationv1.MutatingAdmissionPolicy, b *admissionregistrationv1.MutatingAdmissionPolicyBinding) []client.Object {
			// The previous release's: no label for the webhook's entry for creates.
			p.Spec.Mutations = p.Spec.Mutations[:1]
			return []client.Object{p, b}
		}, "is not this version's"},
		{"params of another namespace", func(p *admissionregistrationv1.MutatingAdmissionPolicy, b *admissionregistrationv1.MutatingAdmissionPolicyBinding) []client.Object {
			b.Spec.ParamRef.Namespace = "elsewhere"
			return []client.Object{p, b}
		}, "does not read ConfigMap deployguard-system/deployguard-admission-params"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(tc.objs(installed())...).Build()
			ok, why, err := SelectorRepairInstalled(context.Background(), c, "deployguard-system")
			require.NoError(t, err)
			assert.Equal(t, tc.why == "", ok, why)
			assert.Contains(t, why, tc.why)
		})
	}
	t.Run("an API server older than the kind", func(t *testing.T) {
		c := fake.NewClientBuilder().WithScheme(scheme).WithInterceptorFuncs(interceptor.Funcs{
			Get: func(context.Context, client.WithWatch, client.ObjectKey, client.Object, ...client.GetOption) error {
				return &meta.NoKindMatchError{GroupKind: schema.GroupKind{Group: "admissionregistration.k8s.io", Kind: "MutatingAdmissionPolicy"}, SearchedVersions: []string{"v1"}}
			},
		}).Build()
		ok, why, err := SelectorRepairInstalled(context.Background(), c, "deployguard-system")
		require.NoError(t, err, "not installed, not an error: the mutating webhook then takes the creates")
		assert.False(t, ok)
		assert.Contains(t, why, "the API server does not serve its kind")
	})
}
