package webhook

import (
	"context"
	"fmt"

	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	policyv1 "k8s.io/api/policy/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	kjson "sigs.k8s.io/json"
)

// BudgetPath is where the disruption budget webhook is served; config/webhook
// uses the same.
const BudgetPath = "/validate-policy-v1-poddisruptionbudget"

var budgetGK = policyv1.SchemeGroupVersion.WithKind("PodDisruptionBudget").GroupKind()

// BudgetHandler is the validating webhook of PodDisruptionBudgets: it warns
// (refuses, in enforce mode) when a budget allows no eviction of the pods of
// the Deployments it selects at their replicas. Its webhook configuration
// fails open: a guard that is down never blocks a budget.
func (w *Deployment) BudgetHandler(m *Metrics) *admission.Webhook {
	return &admission.Webhook{Handler: instrument("disruption-budget", budgetKind, w.handleBudget, m)}
}

func (w *Deployment) handleBudget(_ context.Context, req admission.Request) (admission.Response, string) {
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
	f := w.ReviewBudget(p, old, req.UserInfo.Username, req.UserInfo.Groups)
	if errs := f.Refusals(); len(errs) > 0 {
		st := apierrors.NewInvalid(budgetGK, p.Name, errs).Status()
		resp := admission.Response{AdmissionResponse: admissionv1.AdmissionResponse{Allowed: false, Result: &st}}
		return resp.WithWarnings(f.Warnings()...), refusalReason(errs)
	}
	return admission.Allowed("").WithWarnings(f.Warnings()...), reasonNone
}

// ReviewBudget judges a budget written (old nil on CREATE): on a change of
// its selector or rule, whether it allows no eviction of the pods of the
// Deployments it selects now.
func (w *Deployment) ReviewBudget(p, old *policyv1.PodDisruptionBudget, username string, groups []string) Findings {
	o := w.Options
	if w.Budgets == nil || o.DisruptionBudgets == BudgetsOff || p.DeletionTimestamp != nil {
		return nil
	}
	if old != nil && apiequality.Semantic.DeepEqual(old.Spec, p.Spec) {
		return nil
	}
	if o.exemptionOf(p.Namespace, username, groups) != "" {
		return nil
	}
	b, ok := BudgetOf(p)
	if !ok {
		return nil
	}
	v, blocked, err := w.judgeBudget(p.Namespace, b, "", 0)
	if err != nil {
		// A warning is not worth refusing for; enforce mode refuses, as the
		// overlap check does, rather than let one through unchecked.
		if o.DisruptionBudgets == BudgetsEnforce {
			return Findings{refuse(field.InternalError(budgetPath(b),
				fmt.Errorf("could not look up the Deployments this budget selects, try again: %w", err)), reasonDisruptionBudget)}
		}
		return nil
	}
	if !blocked {
		return nil
	}
	return Findings{budgetFinding(o.DisruptionBudgets, budgetPath(b), v.BudgetMessage())}
}

func budgetPath(b Budget) *field.Path {
	if b.MaxUnavailable != nil {
		return field.NewPath("spec", "maxUnavailable")
	}
	return field.NewPath("spec", "minAvailable")
}

// judgeBudget judges b over the Deployments it selects, with Deployment
// name (when set) at replicas rather than as the index knows it.
func (w *Deployment) judgeBudget(namespace string, b Budget, name string, replicas int32) (BudgetVerdict, bool, error) {
	sels, err := w.Budgets.Targets(namespace, b.Selector)
	if err != nil {
		return BudgetVerdict{}, false, err
	}
	targets := make([]BudgetTarget, 0, len(sels)+1)
	for _, s := range sels {
		if s.Name != name {
			targets = append(targets, BudgetTarget{Name: s.Name, Replicas: s.Replicas})
		}
	}
	if name != "" {
		targets = append(targets, BudgetTarget{Name: name, Replicas: replicas})
	}
	v, blocked := JudgeBudget(b, targets)
	return v, blocked, nil
}

// checkBudgets is the drain check of a Deployment at its replicas: every
// budget selecting its pods that then allows no eviction. strict makes a
// failed lookup a finding (enforce mode, the audit); otherwise a check that
// only warns is skipped.
func (w *Deployment) checkBudgets(d *appsv1.Deployment, strict bool) Findings {
	o := w.Options
	if w.Budgets == nil || o.DisruptionBudgets == BudgetsOff || d.DeletionTimestamp != nil {
		return nil
	}
	path := specPath.Child("replicas")
	lookupFailed := func(err error) Findings {
		if !strict && o.DisruptionBudgets != BudgetsEnforce {
			return nil
		}
		return Findings{refuse(field.InternalError(path,
			fmt.Errorf("could not look up the PodDisruptionBudgets that select this Deployment's pods, try again: %w", err)), reasonDisruptionBudget)}
	}
	budgets, err := w.Budgets.Selecting(d.Namespace, labels.Set(d.Spec.Template.Labels))
	if err != nil {
		return lookupFailed(err)
	}
	var f Findings
	for _, b := range budgets {
		v, blocked, err := w.judgeBudget(d.Namespace, b, d.Name, replicasOf(d))
		if err != nil {
			return lookupFailed(err)
		}
		if blocked {
			f = append(f, budgetFinding(o.DisruptionBudgets, path, v.DeploymentMessage()))
		}
	}
	return f
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
