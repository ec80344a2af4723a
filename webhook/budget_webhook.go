package webhook

import (
	"context"
	"fmt"
	"slices"
	"strings"

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
	h := instrument("disruption-budget", budgetKind, w.handleBudget, m)
	return &admission.Webhook{Handler: admission.HandlerFunc(func(ctx context.Context, req admission.Request) admission.Response {
		resp := h.Handle(ctx, req)
		if resp.Allowed || w.Options.DisruptionBudgets == BudgetsEnforce {
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
	})}
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

// ReviewBudget judges a budget written (old nil on CREATE), on a change of
// its spec: whether it allows no eviction of the pods of the Deployments it
// selects now, and whether another budget selects their pods too (the
// Eviction API refuses a pod under two). What the stored budget did already
// only warns, in every mode: refusing it would block a change that makes
// nothing worse.
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
	mode := o.DisruptionBudgets
	sels, err := w.Budgets.Targets(p.Namespace, b.Selector)
	if err != nil {
		// A warning is not worth refusing for; enforce mode refuses, as the
		// overlap check does, rather than let one through unchecked.
		if mode == BudgetsEnforce {
			return Findings{refuse(field.InternalError(budgetPath(b),
				fmt.Errorf("could not look up the Deployments this budget selects, try again: %w", err)), reasonDisruptionBudget)}
		}
		return nil
	}
	var prev *Budget
	if old != nil {
		if ob, ok := BudgetOf(old); ok && old.Name == p.Name {
			prev = &ob
		}
	}
	var f Findings
	if v, blocked := JudgeBudget(b, targetsOf(sels, "", 0)); blocked {
		m := mode
		if prev != nil {
			if oldSels, err := w.Budgets.Targets(p.Namespace, prev.Selector); err == nil {
				if _, was := JudgeBudget(*prev, targetsOf(oldSels, "", 0)); was {
					m = BudgetsWarn
				}
			}
		}
		f = append(f, budgetFinding(m, budgetPath(b), v.BudgetMessage()))
	}
	if other, deployment := w.sharedPods(p.Namespace, p.Name, sels); other != "" {
		m := mode
		if prev != nil && prev.Selector.String() == b.Selector.String() {
			m = BudgetsWarn
		}
		f = append(f, budgetFinding(m, field.NewPath("spec", "selector"), fmt.Sprintf(
			"this budget selects the pods of Deployment %q, which PodDisruptionBudget %q selects too: the Eviction API refuses to evict a pod under more than one budget, so no node that runs one of them can be drained; keep one budget for these pods",
			deployment, other)))
	}
	return f
}

// sharedPods names another budget of namespace (not name) that selects the
// pods of one of sels, and that Deployment; "" when none does.
func (w *Deployment) sharedPods(namespace, name string, sels []Selection) (other, deployment string) {
	for _, s := range sels {
		if s.Replicas == 0 {
			continue
		}
		budgets, err := w.Budgets.Selecting(namespace, s.TemplateLabels)
		if err != nil {
			return "", ""
		}
		for _, b := range budgets {
			if b.Name != name {
				return b.Name, s.Name
			}
		}
	}
	return "", ""
}

func budgetPath(b Budget) *field.Path {
	if b.MaxUnavailable != nil {
		return field.NewPath("spec", "maxUnavailable")
	}
	return field.NewPath("spec", "minAvailable")
}

// targetsOf are the Deployments of sels as a budget counts them, with
// Deployment name (when set) at replicas rather than as the index knows it.
func targetsOf(sels []Selection, name string, replicas int32) []BudgetTarget {
	targets := make([]BudgetTarget, 0, len(sels)+1)
	for _, s := range sels {
		if s.Name != name {
			targets = append(targets, BudgetTarget{Name: s.Name, Replicas: s.Replicas})
		}
	}
	if name != "" {
		targets = append(targets, BudgetTarget{Name: name, Replicas: replicas})
	}
	return targets
}

// budgetsOver judges, for Deployment d as written, every budget that
// selects its pods: the verdicts of those that allow no eviction, and the
// names of all of them.
func (w *Deployment) budgetsOver(d *appsv1.Deployment) (blocked []BudgetVerdict, names []string, err error) {
	budgets, err := w.Budgets.Selecting(d.Namespace, labels.Set(d.Spec.Template.Labels))
	if err != nil {
		return nil, nil, err
	}
	for _, b := range budgets {
		names = append(names, b.Name)
		sels, err := w.Budgets.Targets(d.Namespace, b.Selector)
		if err != nil {
			return nil, nil, err
		}
		if v, ok := JudgeBudget(b, targetsOf(sels, d.Name, replicasOf(d))); ok {
			blocked = append(blocked, v)
		}
	}
	slices.Sort(names)
	return blocked, names, nil
}

// checkBudgets is the drain check of a Deployment at its replicas (old: as
// stored, nil on CREATE): every budget selecting its pods that then allows
// no eviction, and pods under more than one budget. What already held for
// old only warns, in every mode, as an overlap that predates an update does:
// a scale from 1 to 2 under minAvailable 3 makes nothing worse. strict makes
// a failed lookup a finding (enforce mode, the audit); otherwise a check that
// only warns is skipped.
func (w *Deployment) checkBudgets(d, old *appsv1.Deployment, strict bool) Findings {
	o := w.Options
	if w.Budgets == nil || o.DisruptionBudgets == BudgetsOff || d.DeletionTimestamp != nil || replicasOf(d) == 0 {
		return nil
	}
	path := specPath.Child("replicas")
	blocked, names, err := w.budgetsOver(d)
	if err != nil {
		if !strict && o.DisruptionBudgets != BudgetsEnforce {
			return nil
		}
		return Findings{refuse(field.InternalError(path,
			fmt.Errorf("could not look up the PodDisruptionBudgets that select this Deployment's pods, try again: %w", err)), reasonDisruptionBudget)}
	}
	if len(blocked) == 0 && len(names) < 2 {
		return nil
	}
	var wasBlocked map[string]bool
	wasShared := false
	if old != nil && replicasOf(old) > 0 {
		if ob, oldNames, err := w.budgetsOver(old); err == nil {
			wasBlocked = map[string]bool{}
			for _, v := range ob {
				wasBlocked[v.Budget.Name] = true
			}
			wasShared = len(oldNames) > 1
		}
	}
	var f Findings
	for _, v := range blocked {
		mode := o.DisruptionBudgets
		if wasBlocked[v.Budget.Name] {
			mode = BudgetsWarn
		}
		f = append(f, budgetFinding(mode, path, v.DeploymentMessage()))
	}
	if len(names) > 1 {
		mode := o.DisruptionBudgets
		if wasShared {
			mode = BudgetsWarn
		}
		f = append(f, budgetFinding(mode, specPath.Child("template", "metadata", "labels"), fmt.Sprintf(
			"these pods are selected by %d PodDisruptionBudgets (%s): the Eviction API refuses to evict a pod under more than one budget, so no node that runs one of them can be drained; keep one budget for these pods",
			len(names), strings.Join(names, ", "))))
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
