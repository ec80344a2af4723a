package webhook

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deployguard/deployguard/policy"
	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/webhook/exception"
	"github.com/deployguard/deployguard/webhook/review"
	"github.com/deployguard/deployguard/webhook/review/reviewtest"
)

// enginePolicies loads sources into a policy engine the way serve does.
func enginePolicies(t *testing.T, sources ...policy.Source) review.Policies {
	t.Helper()
	eng, err := policy.New(policy.Options{})
	require.NoError(t, err)
	require.NoError(t, eng.Load(context.Background(), append(policy.Builtins(), sources...)))
	return review.RegoPolicies{Engine: eng}
}

// TestPoliciesJudgeDeletes: the validating webhook evaluates the Rego
// policies on a DELETE, with the Deployment being deleted as
// input.oldObject: an enforced policy refuses it with a message naming the
// policy, a warn-mode one warns, and a DELETE nothing objects to passes.
// The deletion protection is judged as before, beside the policies.
func TestPoliciesJudgeDeletes(t *testing.T) {
	critical := func(d *appsv1.Deployment) { d.Labels = map[string]string{"tier": "critical"} }
	protected := func(d *appsv1.Deployment) { d.Annotations[vocab.AnnotationProtected] = "true" }
	const refusal = `Deployment.apps "web" is invalid: metadata: Forbidden: [policy critical] a tier: critical Deployment may not be deleted: remove the label first if it is no longer critical`
	const warning = "[policy critical] a tier: critical Deployment may not be deleted: remove the label first if it is no longer critical"
	tests := []struct {
		name     string
		policies []policy.Source
		old      *appsv1.Deployment
		user     string
		mut      func(*review.Reviewer)
		allowed  bool
		messages []string // in the refusal, each
		warnings []string // exactly
	}{
		{name: "an enforced policy refuses the deletion", policies: []policy.Source{reviewtest.CriticalPolicy("critical", "enforce")},
			old: reviewtest.Guarded(critical), messages: []string{refusal}},
		{name: "a warn-mode policy warns", policies: []policy.Source{reviewtest.CriticalPolicy("critical", "warn")},
			old: reviewtest.Guarded(critical), allowed: true, warnings: []string{warning}},
		{name: "an audit-mode policy is only recorded", policies: []policy.Source{reviewtest.CriticalPolicy("critical", "audit")},
			old: reviewtest.Guarded(critical), allowed: true},
		{name: "nothing objects: the deletion passes", policies: []policy.Source{reviewtest.CriticalPolicy("critical", "enforce")},
			old: reviewtest.Guarded(), allowed: true},
		{name: "no policy but the built-ins, all of whose rules the Deployment breaks",
			old: reviewtest.Guarded(func(d *appsv1.Deployment) {
				c := &d.Spec.Template.Spec.Containers[0]
				c.Image, c.ReadinessProbe = "nginx", nil
				d.Spec.Template.Spec.HostNetwork = true
			}), allowed: true},
		{name: "a policy about the object alone does not refuse every deletion", policies: []policy.Source{reviewtest.OwnerPolicy},
			old: reviewtest.Guarded(), allowed: true},
		{name: "the deletion protection and the policy, each refusing", policies: []policy.Source{reviewtest.CriticalPolicy("critical", "enforce")},
			old:      reviewtest.Guarded(critical, protected),
			messages: []string{"is protected from deletion", "metadata: Forbidden: [policy critical] a tier: critical Deployment may not be deleted"}},
		{name: "the deletion protection alone", policies: []policy.Source{reviewtest.CriticalPolicy("critical", "enforce")},
			old: reviewtest.Guarded(protected), messages: []string{"is protected from deletion"}},
		{name: "an exempt user", policies: []policy.Source{reviewtest.CriticalPolicy("critical", "enforce")},
			old: reviewtest.Guarded(critical), user: "ops-bot", mut: func(w *review.Reviewer) { w.Options.ExemptUsernames = []string{"ops-bot"} }, allowed: true},
		{name: "an exempt namespace", policies: []policy.Source{reviewtest.CriticalPolicy("critical", "enforce")},
			old: reviewtest.Guarded(critical), mut: func(w *review.Reviewer) { w.Options.ExemptNamespaces = []string{"shop"} }, allowed: true},
		{name: "the guard itself", policies: []policy.Source{reviewtest.CriticalPolicy("critical", "enforce")},
			old: reviewtest.Guarded(critical), user: reviewtest.Options().GuardUsername, allowed: true},
		{name: "a PolicyException of the policy turns the refusal into a warning", policies: []policy.Source{reviewtest.CriticalPolicy("critical", "enforce")},
			old: reviewtest.Guarded(critical), mut: func(w *review.Reviewer) {
				x := exception.NewIndex("deployguard-system")
				x.Set(&exception.PolicyException{
					ObjectMeta: metav1.ObjectMeta{Namespace: "deployguard-system", Name: "decommission-web"},
					Spec: exception.Spec{Match: exception.Match{Namespace: "shop", Names: []string{"web"}}, Policies: []string{"critical"},
						ExpiresAt: metav1.NewTime(time.Now().Add(time.Hour)), Owner: "platform", Reason: "decommissioned"},
				})
				w.Exceptions = x
			}, allowed: true, warnings: []string{warning + " [excepted by PolicyException deployguard-system/decommission-web until "}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := &review.Reviewer{Options: reviewtest.Options(), Overlaps: reviewtest.Index(), Policies: enginePolicies(t, tt.policies...)}
			if tt.mut != nil {
				tt.mut(w)
			}
			_, validating := (&Hooks{Reviewer: w}).Handlers(nil)
			no := false
			validating.RecoverPanic = &no
			body := reviewBody(t, admissionv1.Delete, nil, tt.old)
			if tt.user != "" {
				body = bytes.Replace(body, []byte(`"userInfo":{"username":"alice"}`), []byte(`"userInfo":{"username":"`+tt.user+`"}`), 1)
			}
			resp := decodeResponse(t, post(validating, body))
			assert.Equal(t, tt.allowed, resp.Allowed, "%+v", resp.Result)
			if !tt.allowed {
				require.NotNil(t, resp.Result)
				for _, m := range tt.messages {
					assert.Contains(t, resp.Result.Message, m)
				}
			}
			require.Len(t, resp.Warnings, len(tt.warnings), "%q", resp.Warnings)
			for i, want := range tt.warnings {
				assert.Contains(t, resp.Warnings[i], want)
			}
		})
	}
}
