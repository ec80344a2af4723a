package webhook

import (
	"context"
	"fmt"

	admissionv1 "k8s.io/api/admission/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	kjson "sigs.k8s.io/json"

	"github.com/deployguard/deployguard/webhook/review"
)

// BudgetPath is where the disruption budget webhook is served; config/webhook
// uses the same.
const BudgetPath = "/validate-policy-v1-poddisruptionbudget"

var budgetGK = policyv1.SchemeGroupVersion.WithKind("PodDisruptionBudget").GroupKind()

// BudgetHandler is the validating webhook of PodDisruptionBudgets: it warns
// (refuses, in enforce mode) when a budget allows no eviction of the pods of
// the Deployments it selects at their replicas. Its webhook configuration
// fails open: a guard that is down never blocks a budget.
func (h *Hooks) BudgetHandler(m *Metrics) *admission.Webhook {
	handler := instrument("disruption-budget", budgetKind, h.handleBudget, m)
	return newWebhook(admission.HandlerFunc(func(ctx context.Context, req admission.Request) admission.Response {
		resp := handler.Handle(ctx, req)
		if resp.Allowed || h.Reviewer.Options.DisruptionBudgets == review.BudgetsEnforce {
			return resp
		}
		// failurePolicy Ignore covers a guard that does not answer, not one
		// that answers no: a check that only warns never stands in a
		// budget's way, not even for a request it cannot read.
		msg := "an unreadable request"
		if resp.Result != nil {
			msg = resp.Result.Message
		}
		return admission.Allowed("").WithWarnings("deployguard could not judge this PodDisruptionBudget: " + msg)
	}))
}

func (h *Hooks) handleBudget(_ context.Context, req admission.Request) (admission.Response, string) {
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return admission.Allowed(""), reasonNone
	}
	p, err := decodeBudget(req.Object)
	if err != nil {
		return malformed(fmt.Errorf("cannot decode the object as a policy/v1 PodDisruptionBudget: %w", err))
	}
	var old *policyv1.PodDisruptionBudget
	if req.Operation == admissionv1.Update {
		if old, err = decodeBudget(req.OldObject); err != nil {
			return malformed(fmt.Errorf("cannot decode oldObject as a policy/v1 PodDisruptionBudget: %w", err))
		}
	}
	f := h.Reviewer.ReviewBudget(p, old, req.UserInfo.Username, req.UserInfo.Groups)
	if errs := f.Refusals(); len(errs) > 0 {
		st := apierrors.NewInvalid(budgetGK, p.Name, errs).Status()
		resp := admission.Response{AdmissionResponse: admissionv1.AdmissionResponse{Allowed: false, Result: &st}}
		return resp.WithWarnings(f.Warnings()...), refusalReason(errs)
	}
	return admission.Allowed("").WithWarnings(f.Warnings()...), reasonNone
}

// decodeBudget decodes a PodDisruptionBudget as the API server sent it.
func decodeBudget(raw runtime.RawExtension) (*policyv1.PodDisruptionBudget, error) {
	if len(raw.Raw) == 0 {
		return nil, fmt.Errorf("no object")
	}
	p := &policyv1.PodDisruptionBudget{}
	if err := kjson.UnmarshalCaseSensitivePreserveInts(raw.Raw, p); err != nil {
		return nil, err
	}
	return p, nil
}
