package floor

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/deployguard/deployguard/webhook/native"
	"github.com/deployguard/deployguard/webhook/review"
	"github.com/deployguard/deployguard/webhook/routing"
)

// The probe is refused by the refusals for every user but the control
// plane, with or without params that exempt or privilege them, and only
// for its finalizer.
func TestFloorProbeRefusal(t *testing.T) {
	ctx := context.Background()
	d := ProbeDeployment("shop")
	for _, o := range []*review.Options{
		{GuardUsername: "system:serviceaccount:deployguard-system:deployguard"},
		{GuardUsername: "system:serviceaccount:deployguard-system:deployguard", ExemptNamespaces: []string{"shop"}, BreakGlassGroups: []string{"system:serviceaccounts"}},
		{},
	} {
		got := o.FloorProbeRefusal(ctx, d)
		// In process the params have no resourceVersion.
		assert.Equal(t, `metadata.finalizers: "`+ProbeFinalizer+`" is reserved for deployguard's probe of this policy (params )`, got)
	}
	without := d.DeepCopy()
	without.Finalizers = nil
	assert.Empty(t, (&review.Options{}).FloorProbeRefusal(ctx, without), "nothing else about the probe is refused")
	other := d.DeepCopy()
	other.Finalizers = append(other.Finalizers, "deployguard.io/nope")
	assert.Equal(t, `metadata.finalizers: "`+ProbeFinalizer+`", "deployguard.io/nope" are not deployguard's finalizers: supported values: "deployguard.io/record", "deployguard.io/drain"`,
		(&review.Options{}).FloorProbeRefusal(ctx, other), "with another finalizer, the usual words")
}

func TestJudgeFloorProbe(t *testing.T) {
	const words = `metadata.finalizers: "deployguard.io/floor-probe" is reserved for deployguard's probe of this policy`
	const want = words + " (params )"
	gr := schema.GroupResource{Group: "apps", Resource: "deployments"}
	policyDenial := func(policy, binding, msg string) error {
		line := "ValidatingAdmissionPolicy '" + policy + "' with binding '" + binding + "' denied request: " + msg
		err := apierrors.NewForbidden(gr, "", errors.New(line))
		err.ErrStatus.Reason = metav1.StatusReasonInvalid
		err.ErrStatus.Details.Causes = append(err.ErrStatus.Details.Causes, metav1.StatusCause{Message: line})
		return err
	}
	webhookDenial := func(name string) error {
		return &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: 422, Reason: metav1.StatusReasonInvalid,
			Message: `admission webhook "` + name + `" denied the request: Deployment.apps "x" is invalid: metadata.finalizers: nope`}}
	}
	failedCall := func(name string) error {
		return apierrors.NewInternalError(errors.New(`failed calling webhook "` + name + `": failed to call webhook: Post "https://deployguard-webhook.deployguard-system.svc:443/validate-apps-v1-deployment?timeout=3s": context deadline exceeded`))
	}
	validating := func(name string) bool {
		return name == routing.EnforceWebhook || name == routing.CreateWebhook || name == routing.ValidateWebhook || name == "validate.kyverno.svc"
	}
	for _, tc := range []struct {
		name    string
		err     error
		verdict ProbeVerdict
		why     string
	}{
		{"refused by the policy as the guard would", policyDenial(native.Refusals, native.RefusalsCreateBinding, words+" (params 42)"), ProbeEnforced, ""},
		{"refused by the policy's binding for every operation (earlier layout)", policyDenial(native.Refusals, native.Refusals, words+" (params 42)"), ProbeEnforced, ""},
		{"refused through the binding for creates with older params", policyDenial(native.Refusals, native.RefusalsCreateBinding, words+" (params 17)"), ProbeNotEnforced, `resourceVersion "17"`},
		// kubernetes/kubernetes#130887: the params it read last.
		{"refused by the policy with older params", policyDenial(native.Refusals, native.Refusals, words+" (params 17)"), ProbeNotEnforced, `resourceVersion "17"`},
		// Its finalizer rule reads no params, and without params the
		// policy does not run: a fallback message or another rule failing
		// first still says it is enforced.
		{"refused by the policy in other words", policyDenial(native.Refusals, native.Refusals, "metadata.finalizers: a finalizer in deployguard.io/ is not one of deployguard's finalizers"), ProbeEnforced, "other words"},
		{"admitted", nil, ProbeNotEnforced, "admitted a dry-run create"},
		{"refused by the guard's enforcing webhook", webhookDenial(routing.EnforceWebhook), ProbeNotEnforced, "validating webhook " + routing.EnforceWebhook + " refused"},
		{"refused by the guard's advising webhook", webhookDenial(routing.CreateWebhook), ProbeNotEnforced, "after the policy"},
		{"refused by the guard's advising webhook (previous layout)", webhookDenial(routing.ValidateWebhook), ProbeNotEnforced, "after the policy"},
		{"the guard's enforcing webhook could not be called", failedCall(routing.EnforceWebhook), ProbeNotEnforced, "was called for"},
		{"refused by another validating webhook", webhookDenial("validate.kyverno.svc"), ProbeNotEnforced, "validate.kyverno.svc"},
		{"refused by a quota", apierrors.NewForbidden(gr, "x", errors.New("exceeded quota: q, requested: count/deployments.apps=1, used: count/deployments.apps=5, limited: count/deployments.apps=5")),
			ProbeNotEnforced, "ResourceQuota"},
		{"refused by a mutating webhook, before the policy", webhookDenial("default.deployments.deployguard.io"), ProbeUnknown, "before"},
		{"a mutating webhook could not be called", failedCall("mutate.kyverno.svc"), ProbeUnknown, "before"},
		{"refused by another policy", policyDenial("team", "team", "no"), ProbeUnknown, "before"},
		{"refused by another binding of the policy", policyDenial(native.Refusals, "copy", words+" (params 42)"), ProbeUnknown, "before"},
		{"forbidden by RBAC", apierrors.NewForbidden(gr, "", errors.New(`User "x" cannot create resource "deployments"`)), ProbeUnknown, "cannot create"},
		{"invalid for the API server", apierrors.NewInvalid(schema.GroupKind{Group: "apps", Kind: "Deployment"}, "x",
			field.ErrorList{field.Required(field.NewPath("spec", "selector"), "")}), ProbeUnknown, "before"},
		{"a timeout", apierrors.NewTimeoutError("the request did not complete", 1), ProbeUnknown, "before"},
		{"no answer", context.DeadlineExceeded, ProbeUnknown, "failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, why := JudgeProbe(tc.err, want, "42", "42", validating)
			assert.Equal(t, tc.verdict, v, why)
			assert.Contains(t, why, tc.why)
		})
	}
}

// Without the ConfigMap's resourceVersion (it could not be read), the
// params the policy read are not compared.
func TestJudgeFloorProbeWithoutParamsVersion(t *testing.T) {
	line := "ValidatingAdmissionPolicy '" + native.Refusals + "' with binding '" + native.Refusals + "' denied request: " +
		`metadata.finalizers: "deployguard.io/floor-probe" is reserved for deployguard's probe of this policy (params 17)`
	err := apierrors.NewForbidden(schema.GroupResource{Group: "apps", Resource: "deployments"}, "", errors.New(line))
	want := `metadata.finalizers: "deployguard.io/floor-probe" is reserved for deployguard's probe of this policy (params )`
	v, why := JudgeProbe(err, want, "", "", nil)
	assert.Equal(t, ProbeEnforced, v, why)
	assert.Empty(t, why)
	// Written during the probe: it tells nothing.
	v, why = JudgeProbe(err, want, "17", "18", nil)
	assert.Equal(t, ProbeUnknown, v, why)
	// The ConfigMap the policy read is the one after the probe.
	v, why = JudgeProbe(err, want, "16", "17", nil)
	assert.Equal(t, ProbeEnforced, v, why)
}

// A probe that cannot tell keeps the last conclusive verdict: neither a
// blip nor the guard's own webhook being away hands the refusals back.
func TestFloorEnforced(t *testing.T) {
	for _, tc := range []struct {
		v, last        ProbeVerdict
		enforced       bool
		lastConclusive ProbeVerdict
	}{
		{ProbeEnforced, ProbeUnknown, true, ProbeEnforced},
		{ProbeNotEnforced, ProbeUnknown, false, ProbeNotEnforced},
		{ProbeUnknown, ProbeUnknown, true, ProbeUnknown}, // the objects' finding stands
		{ProbeUnknown, ProbeNotEnforced, false, ProbeNotEnforced},
		{ProbeUnknown, ProbeEnforced, true, ProbeEnforced},
		{ProbeEnforced, ProbeNotEnforced, true, ProbeEnforced},
		{ProbeNotEnforced, ProbeEnforced, false, ProbeNotEnforced},
	} {
		enforced, last := Enforced(tc.v, tc.last)
		assert.Equal(t, tc.enforced, enforced, "%v after %v", tc.v, tc.last)
		assert.Equal(t, tc.lastConclusive, last, "%v after %v", tc.v, tc.last)
	}
}

func TestBindingApplies(t *testing.T) {
	ns := func(name string, l map[string]string, deleting bool) *metav1.PartialObjectMetadata {
		m := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l}}
		if l == nil {
			m.Labels = map[string]string{corev1.LabelMetadataName: name}
		}
		if deleting {
			now := metav1.NewTime(time.Now())
			m.DeletionTimestamp = &now
		}
		return m
	}
	shipped := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
		{Key: corev1.LabelMetadataName, Operator: metav1.LabelSelectorOpNotIn, Values: []string{"kube-system", "deployguard-system"}},
		{Key: "deployguard.io/guard", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"disabled"}},
	}}
	for _, tc := range []struct {
		name string
		sel  *metav1.LabelSelector
		ns   *metav1.PartialObjectMetadata
		want bool
	}{
		{"a guarded namespace", shipped, ns("default", nil, false), true},
		{"a system namespace", shipped, ns("kube-system", nil, false), false},
		{"the guard's own", shipped, ns("deployguard-system", nil, false), false},
		{"one labelled disabled", shipped, ns("shop", map[string]string{"deployguard.io/guard": "disabled"}, false), false},
		{"one being deleted", shipped, ns("shop", nil, true), false},
		{"every namespace without a selector", nil, ns("kube-system", nil, false), true},
		{"the name label, even where the object lacks it", &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: "shop"}},
			ns("shop", map[string]string{}, false), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := BindingApplies(tc.sel, tc.ns)
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
	_, err := BindingApplies(&metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: "Sideways"}}}, ns("shop", nil, false))
	assert.Error(t, err)
}
