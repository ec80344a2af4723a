package webhook

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/deployguard/deployguard/webhook/review"
)

// The budget webhook's failurePolicy Ignore covers a guard that does not
// answer; one that answers must not refuse either, outside enforce mode,
// even a request it cannot read.
func TestBudgetWebhookNeverRefusesOutsideEnforce(t *testing.T) {
	req := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: "u", Operation: admissionv1.Create, Kind: budgetKind.gvk, Namespace: "ns", Name: "b",
		Object: runtime.RawExtension{Raw: []byte(`{"spec": {"minAvailable": [1]}}`)},
	}}
	for mode, allowed := range map[string]bool{review.BudgetsWarn: true, "": true, review.BudgetsEnforce: false} {
		w := &review.Reviewer{Options: &review.Options{DisruptionBudgets: mode}, Budgets: review.NewBudgetIndex(review.NewOverlapIndex(nil))}
		resp := (&Hooks{Reviewer: w}).BudgetHandler(nil).Handle(context.Background(), req)
		assert.Equal(t, allowed, resp.Allowed, "mode %q (%v)", mode, resp.Result)
		if allowed && assert.Len(t, resp.Warnings, 1, "mode %q", mode) {
			assert.Contains(t, resp.Warnings[0], "could not judge this PodDisruptionBudget", "mode %q", mode)
		}
	}
}
