package floor

import (
	"context"
	"fmt"
	"slices"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nativeconfig "github.com/deployguard/deployguard/config/native"
	"github.com/deployguard/deployguard/webhook/native"
	"github.com/deployguard/deployguard/webhook/review"
)

// PoliciesEnforced reports whether kube-apiserver enforces the guard's
// refusals policy as this guard would evaluate it: the policy is there with
// the same expressions as the guard's, its binding denies and reads the
// params ConfigMap in namespace (RefusalsBound), and that ConfigMap
// holds what o says (paramsCurrent). When any of it is not so (not
// installed, an older policy left after an upgrade, params of another
// namespace or not written), why says what, and the webhook must evaluate
// the refusals itself, or nothing would.
func PoliciesEnforced(ctx context.Context, c client.Reader, namespace string, o *review.Options) (ok bool, why string, err error) {
	if ok, why, err := RefusalsBound(ctx, c, namespace); !ok || err != nil {
		return ok, why, err
	}
	return paramsCurrent(ctx, c, namespace, o)
}

// RefusalsBound reports whether deployguard-refusals is installed with
// this release's expressions and bound to deny with the params ConfigMap in
// namespace.
func RefusalsBound(ctx context.Context, c client.Reader, namespace string) (ok bool, why string, err error) {
	want, got, why, err := versions(ctx, c, validating, native.Refusals)
	if why != "" || err != nil {
		return false, why, err
	}
	if !sameExpressions(got, want) {
		return false, "ValidatingAdmissionPolicy " + native.Refusals + " is not this version's (install config/native of this release)", nil
	}
	if what := otherScope(got, want); what != "" {
		return false, "ValidatingAdmissionPolicy " + native.Refusals + " is not this version's: its " + what + " differs (install config/native of this release)", nil
	}
	b := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
	if ok, why, err := getInstalled(ctx, c, "ValidatingAdmissionPolicyBinding", native.Refusals, b); !ok {
		return ok, why, err
	}
	switch ref := b.Spec.ParamRef; {
	case !slices.Contains(b.Spec.ValidationActions, admissionregistrationv1.Deny):
		return false, "ValidatingAdmissionPolicyBinding " + native.Refusals + " does not deny", nil
	case ref == nil || ref.Name != nativeconfig.ParamsName || ref.Namespace != namespace:
		return false, fmt.Sprintf("ValidatingAdmissionPolicyBinding %s does not read ConfigMap %s/%s", native.Refusals, namespace, nativeconfig.ParamsName), nil
	case !bindsOperation(b, admissionregistrationv1.Update) || !bindsOperation(b, admissionregistrationv1.Delete):
		return false, "ValidatingAdmissionPolicyBinding " + native.Refusals + " does not bind updates and deletions", nil
	case bindsOperation(b, admissionregistrationv1.Create):
		return true, "", nil
	}
	// The creates have a binding of their own, which selects those
	// deployguard-selector labels: both must be there, and this release's.
	cb := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
	if err := c.Get(ctx, client.ObjectKey{Name: native.RefusalsCreateBinding}, cb); err != nil {
		return notFound(err, "ValidatingAdmissionPolicyBinding "+native.RefusalsCreateBinding+" is not installed: "+native.Refusals+" judges no create")
	}
	switch ref := cb.Spec.ParamRef; {
	case cb.Spec.PolicyName != native.Refusals:
		return false, "ValidatingAdmissionPolicyBinding " + native.RefusalsCreateBinding + " does not bind " + native.Refusals, nil
	case !slices.Contains(cb.Spec.ValidationActions, admissionregistrationv1.Deny):
		return false, "ValidatingAdmissionPolicyBinding " + native.RefusalsCreateBinding + " does not deny", nil
	case ref == nil || ref.Name != nativeconfig.ParamsName || ref.Namespace != namespace:
		return false, fmt.Sprintf("ValidatingAdmissionPolicyBinding %s does not read ConfigMap %s/%s", native.RefusalsCreateBinding, namespace, nativeconfig.ParamsName), nil
	case !bindsOperation(cb, admissionregistrationv1.Create):
		return false, "ValidatingAdmissionPolicyBinding " + native.RefusalsCreateBinding + " does not bind creates", nil
	case !sameNamespaces(cb.Spec.MatchResources, b.Spec.MatchResources):
		return false, "ValidatingAdmissionPolicyBinding " + native.RefusalsCreateBinding + " does not take the namespaces " + native.Refusals + " takes", nil
	}
	labelled, other := createsSelected(cb)
	if other {
		return false, "ValidatingAdmissionPolicyBinding " + native.RefusalsCreateBinding + " selects creates by a label " + native.Selector + " does not set", nil
	}
	if !labelled {
		return true, "", nil
	}
	if ok, why, err := SelectorRepairInstalled(ctx, c, namespace); !ok || err != nil {
		return ok, native.Refusals + " judges only the creates " + native.Selector + " labels, and " + why, err
	}
	mb := &admissionregistrationv1.MutatingAdmissionPolicyBinding{}
	if ok, why, err := getInstalled(ctx, c, "MutatingAdmissionPolicyBinding", native.Selector, mb); !ok {
		return ok, why, err
	}
	if !sameNamespaces(mb.Spec.MatchResources, b.Spec.MatchResources) {
		return false, native.Refusals + " judges only the creates " + native.Selector + " labels, and MutatingAdmissionPolicyBinding " +
			native.Selector + " does not take the namespaces " + native.Refusals + " takes", nil
	}
	return true, "", nil
}

// sameNamespaces reports whether two bindings' match resources take the
// same namespaces, so that one judges where the other labels (an empty
// selector and none are the same). What else narrows a binding is the
// floor probe's to find.
func sameNamespaces(a, b *admissionregistrationv1.MatchResources) bool {
	var x, y admissionregistrationv1.MatchResources
	if a != nil {
		x = *a
	}
	if b != nil {
		y = *b
	}
	empty := func(s *metav1.LabelSelector) *metav1.LabelSelector {
		if s == nil || len(s.MatchLabels) == 0 && len(s.MatchExpressions) == 0 {
			return nil
		}
		return s
	}
	return apiequality.Semantic.DeepEqual(empty(x.NamespaceSelector), empty(y.NamespaceSelector))
}

// bindsOperation reports whether b's own match resources let op through
// (the policy's constraints aside): no resource rules, or one that names
// op.
func bindsOperation(b *admissionregistrationv1.ValidatingAdmissionPolicyBinding, op admissionregistrationv1.OperationType) bool {
	mr := b.Spec.MatchResources
	if mr == nil || len(mr.ResourceRules) == 0 {
		return true
	}
	for _, r := range mr.ResourceRules {
		if slices.Contains(r.Operations, op) || slices.Contains(r.Operations, admissionregistrationv1.OperationAll) {
			return true
		}
	}
	return false
}

// createsSelected says how the binding for creates selects them: by
// deployguard-selector's label (labelled), by any other object selector
// (other), or not at all (neither).
func createsSelected(b *admissionregistrationv1.ValidatingAdmissionPolicyBinding) (labelled, other bool) {
	mr := b.Spec.MatchResources
	if mr == nil || mr.ObjectSelector == nil || len(mr.ObjectSelector.MatchLabels) == 0 && len(mr.ObjectSelector.MatchExpressions) == 0 {
		return false, false
	}
	s := mr.ObjectSelector
	if len(s.MatchLabels) == 0 && len(s.MatchExpressions) == 1 {
		if e := s.MatchExpressions[0]; e.Key == native.LabelRefusals && e.Operator == metav1.LabelSelectorOpExists {
			return true, false
		}
	}
	return false, true
}

// paramsCurrent reports whether the params ConfigMap in namespace
// holds what o says.
func paramsCurrent(ctx context.Context, c client.Reader, namespace string, o *review.Options) (ok bool, why string, err error) {
	cm := &corev1.ConfigMap{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: nativeconfig.ParamsName}, cm); err != nil {
		return notFound(err, "ConfigMap "+namespace+"/"+nativeconfig.ParamsName+" is not there")
	}
	for k, v := range o.NativeSettings().Data() {
		if cm.Data[k] != v {
			return false, fmt.Sprintf("ConfigMap %s/%s says %s=%q, the config file %q", namespace, nativeconfig.ParamsName, k, cm.Data[k], v), nil
		}
	}
	return true, "", nil
}

// SelectorRepairInstalled reports whether kube-apiserver repairs an
// empty selector as this guard would: deployguard-selector is there with
// this release's expressions, and its binding reads the params ConfigMap in
// namespace. When it is not so, why says what: the guard's webhook still
// repairs selectors, but only while it is up.
func SelectorRepairInstalled(ctx context.Context, c client.Reader, namespace string) (ok bool, why string, err error) {
	want, got, why, err := versions(ctx, c, mutating, native.Selector)
	if why != "" || err != nil {
		return false, why, err
	}
	if !slices.Equal(mutationExpressions(got), mutationExpressions(want)) {
		return false, "MutatingAdmissionPolicy " + native.Selector + " is not this version's (install config/native of this release)", nil
	}
	b := &admissionregistrationv1.MutatingAdmissionPolicyBinding{}
	if ok, why, err := getInstalled(ctx, c, "MutatingAdmissionPolicyBinding", native.Selector, b); !ok {
		return ok, why, err
	}
	if ref := b.Spec.ParamRef; ref == nil || ref.Name != nativeconfig.ParamsName || ref.Namespace != namespace {
		return false, fmt.Sprintf("MutatingAdmissionPolicyBinding %s does not read ConfigMap %s/%s", native.Selector, namespace, nativeconfig.ParamsName), nil
	}
	return true, "", nil
}

// versions returns this release's policy named name, of those all picks
// from the file, and the one installed; why says, when it is not installed.
func versions[T any, P interface {
	*T
	client.Object
}](ctx context.Context, c client.Reader, all func(*native.Rules) []P, name string) (want, got P, why string, err error) {
	rules, err := native.Load()
	if err != nil {
		return nil, nil, "", err
	}
	shipped := all(rules)
	want = shipped[slices.IndexFunc(shipped, func(p P) bool { return p.GetName() == name })]
	got = P(new(T))
	if ok, why, err := getInstalled(ctx, c, want.GetObjectKind().GroupVersionKind().Kind, name, got); !ok {
		return nil, nil, why, err
	}
	return want, got, "", nil
}

func validating(r *native.Rules) []*admissionregistrationv1.ValidatingAdmissionPolicy {
	return r.Policies
}

func mutating(r *native.Rules) []*admissionregistrationv1.MutatingAdmissionPolicy {
	return r.Mutations
}

// getInstalled reads the cluster-scoped object of kind named name into obj; why
// says, when it is not installed.
func getInstalled(ctx context.Context, c client.Reader, kind, name string, obj client.Object) (ok bool, why string, err error) {
	if err := c.Get(ctx, client.ObjectKey{Name: name}, obj); err != nil {
		return notFound(err, kind+" "+name+" is not installed")
	}
	return true, "", nil
}

// mutationExpressions are what a MutatingAdmissionPolicy evaluates, white
// space aside, as sameExpressions.
func mutationExpressions(p *admissionregistrationv1.MutatingAdmissionPolicy) []string {
	var out []string
	for _, v := range p.Spec.Variables {
		out = append(out, v.Name, v.Expression)
	}
	for _, c := range p.Spec.MatchConditions {
		out = append(out, c.Name, c.Expression)
	}
	for _, m := range p.Spec.Mutations {
		if m.JSONPatch != nil {
			out = append(out, m.JSONPatch.Expression)
		}
	}
	for i := range out {
		out[i] = strings.Join(strings.Fields(out[i]), " ")
	}
	return out
}

// sameExpressions compares what two policies evaluate, white space aside:
// kustomize rewrites the folded lines of an expression (CEL ignores the
// difference).
func sameExpressions(a, b *admissionregistrationv1.ValidatingAdmissionPolicy) bool {
	flat := func(p *admissionregistrationv1.ValidatingAdmissionPolicy) []string {
		var out []string
		for _, v := range p.Spec.Variables {
			out = append(out, v.Name, v.Expression)
		}
		for _, c := range p.Spec.MatchConditions {
			out = append(out, "matchCondition "+c.Name, c.Expression)
		}
		for _, v := range p.Spec.Validations {
			r := ""
			if v.Reason != nil {
				r = string(*v.Reason)
			}
			out = append(out, v.Expression, v.Message, v.MessageExpression, r)
		}
		for i := range out {
			out[i] = strings.Join(strings.Fields(out[i]), " ")
		}
		return out
	}
	return slices.Equal(flat(a), flat(b))
}

// otherScope names what of a's failure policy, params kind and match
// constraints differs from b's, the API server's defaults applied to both;
// "" when nothing does. A policy that fails open, or matches fewer requests
// (no DELETE, an object selector), refuses less with the same expressions.
func otherScope(a, b *admissionregistrationv1.ValidatingAdmissionPolicy) string {
	failurePolicy := func(p *admissionregistrationv1.ValidatingAdmissionPolicy) admissionregistrationv1.FailurePolicyType {
		if p.Spec.FailurePolicy == nil {
			return admissionregistrationv1.Fail
		}
		return *p.Spec.FailurePolicy
	}
	if failurePolicy(a) != failurePolicy(b) {
		return "failurePolicy"
	}
	if !apiequality.Semantic.DeepEqual(a.Spec.ParamKind, b.Spec.ParamKind) {
		return "paramKind"
	}
	// The match constraints as the API server stores them: scope "*",
	// matchPolicy Equivalent and empty selectors when not set.
	constraints := func(p *admissionregistrationv1.ValidatingAdmissionPolicy) admissionregistrationv1.MatchResources {
		var m admissionregistrationv1.MatchResources
		if p.Spec.MatchConstraints != nil {
			m = *p.Spec.MatchConstraints.DeepCopy()
		}
		// (Semantic.DeepEqual takes nil and empty lists as equal.)
		for _, rules := range [][]admissionregistrationv1.NamedRuleWithOperations{m.ResourceRules, m.ExcludeResourceRules} {
			for i := range rules {
				if rules[i].Scope == nil {
					all := admissionregistrationv1.AllScopes
					rules[i].Scope = &all
				}
			}
		}
		if m.MatchPolicy == nil {
			equivalent := admissionregistrationv1.Equivalent
			m.MatchPolicy = &equivalent
		}
		for _, sel := range []**metav1.LabelSelector{&m.NamespaceSelector, &m.ObjectSelector} {
			if *sel != nil && len((*sel).MatchLabels) == 0 && len((*sel).MatchExpressions) == 0 {
				*sel = nil
			}
		}
		return m
	}
	if !apiequality.Semantic.DeepEqual(constraints(a), constraints(b)) {
		return "matchConstraints"
	}
	return ""
}

func notFound(err error, why string) (bool, string, error) {
	switch {
	case apierrors.IsNotFound(err):
		return false, why, nil
	case meta.IsNoMatchError(err):
		// An API server older than the kind (MutatingAdmissionPolicy is
		// served from Kubernetes 1.36): nothing of it can be installed.
		return false, why + " (the API server does not serve its kind: " + err.Error() + ")", nil
	}
	return false, "", err
}

// ApplyParams writes the policies' params ConfigMap in namespace from
// o, so that the config file stays the one place a platform team sets them.
func ApplyParams(ctx context.Context, c client.Client, namespace string, o *review.Options) error {
	cm := o.NativeSettings().ConfigMap(namespace)
	//nolint:staticcheck // a typed object applied whole; the guard owns every field it sets
	if err := c.Patch(ctx, cm, client.Apply, client.FieldOwner("deployguard"), client.ForceOwnership); err != nil {
		return fmt.Errorf("writing the native policies' params (ConfigMap %s/%s): %w", namespace, cm.Name, err)
	}
	return nil
}
