package webhook

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
)

// The probe is refused by the refusals for every user but the control
// plane, with or without params that exempt or privilege them, and only
// for its finalizer.
func TestFloorProbeRefusal(t *testing.T) {
	ctx := context.Background()
	d := FloorProbe("shop")
	for _, o := range []*Options{
		{GuardUsername: "system:serviceaccount:deployguard-system:deployguard"},
		{GuardUsername: "system:serviceaccount:deployguard-system:deployguard", ExemptNamespaces: []string{"shop"}, BreakGlassGroups: []string{"system:serviceaccounts"}},
		{},
	} {
		got := o.FloorProbeRefusal(ctx, d)
		assert.Equal(t, `metadata.finalizers: "`+FloorProbeFinalizer+`" is not one of deployguard's finalizers: supported values: "deployguard.io/record", "deployguard.io/drain"`, got)
	}
	without := d.DeepCopy()
	without.Finalizers = nil
	assert.Empty(t, (&Options{}).FloorProbeRefusal(ctx, without), "nothing else about the probe is refused")
}

func TestJudgeFloorProbe(t *testing.T) {
	const want = `metadata.finalizers: "deployguard.io/floor-probe" is not one of deployguard's finalizers`
	gr := schema.GroupResource{Group: "apps", Resource: "deployments"}
	policyDenial := func(msg string) error {
		line := "ValidatingAdmissionPolicy '" + native.Refusals + "' with binding '" + native.Refusals + "' denied request: " + msg
		err := apierrors.NewForbidden(gr, "", errors.New(line))
		err.ErrStatus.Reason = metav1.StatusReasonInvalid
		err.ErrStatus.Details.Causes = append(err.ErrStatus.Details.Causes, metav1.StatusCause{Message: line})
		return err
	}
	webhookDenial := func(name string) error {
		return &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: 422, Reason: metav1.StatusReasonInvalid,
			Message: `admission webhook "` + name + `" denied the request: Deployment.apps "x" is invalid: metadata.finalizers: nope`}}
	}
	for _, tc := range []struct {
		name    string
		err     error
		verdict ProbeVerdict
		why     string
	}{
		{"refused by the policy as the guard would", policyDenial(want), ProbeEnforced, ""},
		{"admitted", nil, ProbeNotEnforced, "admitted a dry-run create"},
		{"refused by the policy otherwise", policyDenial("spec.selector: something else"), ProbeNotEnforced, "other params"},
		{"refused by the guard's enforcing webhook", webhookDenial(EnforceWebhook), ProbeNotEnforced, "let through to this guard's webhook"},
		{"refused by the guard's advising webhook", webhookDenial(ValidateWebhook), ProbeNotEnforced, "let through"},
		{"refused by a mutating webhook, before the policy", webhookDenial("default.deployments.deployguard.io"), ProbeUnknown, "before"},
		{"refused by another webhook", webhookDenial("validate.kyverno.svc"), ProbeUnknown, "before"},
		{"refused by another policy", apierrors.NewForbidden(gr, "", errors.New("ValidatingAdmissionPolicy 'team' with binding 'team' denied request: no")), ProbeUnknown, "before"},
		{"forbidden by RBAC", apierrors.NewForbidden(gr, "", errors.New(`User "x" cannot create resource "deployments"`)), ProbeUnknown, "cannot create"},
		{"invalid for the API server", apierrors.NewInvalid(schema.GroupKind{Group: "apps", Kind: "Deployment"}, "x",
			field.ErrorList{field.Required(field.NewPath("spec", "selector"), "")}), ProbeUnknown, "before"},
		{"a timeout", apierrors.NewTimeoutError("the webhook did not answer", 1), ProbeUnknown, "before"},
		{"no answer", context.DeadlineExceeded, ProbeUnknown, "failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, why := JudgeFloorProbe(tc.err, want)
			assert.Equal(t, tc.verdict, v, why)
			assert.Contains(t, why, tc.why)
		})
	}
}

func TestProbeNamespace(t *testing.T) {
	ns := func(name string, l map[string]string, deleting bool) metav1.PartialObjectMetadata {
		m := metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l}}
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
	all := []metav1.PartialObjectMetadata{ns("kube-system", nil, false), ns("deployguard-system", nil, false), ns("shop", nil, false), ns("default", nil, false), ns("billing", nil, false)}
	for _, tc := range []struct {
		name string
		sel  *metav1.LabelSelector
		nss  []metav1.PartialObjectMetadata
		want string
	}{
		{"default first", shipped, all, "default"},
		{"else the first by name", shipped, all[:3:3], "shop"},
		{"not one the binding skips", shipped, append(all[:2:2], ns("billing", map[string]string{"deployguard.io/guard": "disabled"}, false)), ""},
		{"not one being deleted", shipped, append(all[:2:2], ns("default", nil, true), ns("shop", nil, false)), "shop"},
		{"every namespace without a selector", nil, all[:1], "kube-system"},
		{"the name label, even where the cache lacks it", &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: "shop"}},
			[]metav1.PartialObjectMetadata{ns("shop", map[string]string{}, false)}, "shop"},
		{"none", shipped, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ProbeNamespace(tc.sel, tc.nss)
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
	_, err := ProbeNamespace(&metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: "Sideways"}}}, all)
	assert.Error(t, err)
}
