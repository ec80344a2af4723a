package review

import (
	"context"
	"fmt"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	policyv1 "k8s.io/api/policy/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/webhook/origin"
)

// Disruption budget modes: what admission does when a PodDisruptionBudget
// allows no eviction of a Deployment's pods (config disruptionBudgets.mode).
const (
	BudgetsEnforce = "enforce"
	BudgetsWarn    = "warn"
	BudgetsOff     = "off"
)

// Budget is what the drain check knows of a PodDisruptionBudget.
type Budget struct {
	Name     string
	Selector labels.Selector
	// MinAvailable and MaxUnavailable as in its spec; at most one is set.
	MinAvailable, MaxUnavailable *intstr.IntOrString
}

// MaxBudgetSelectorTerms is how many terms of a PodDisruptionBudget's
// selector the guard keeps and judges. A tenant writes budgets as large as
// the API server takes (it bounds a value's length, not how many), and the
// budget index holds every selector of the cluster: a larger one is not kept
// (StripBudgetForCache) nor filed, and its budget not judged against the
// Deployments it selects. 64, as deployguard-refusals
// bounds a Deployment's selector: about 24 KB at most.
const MaxBudgetSelectorTerms = 64

// SelectorTerms counts a selector's terms as the size bounds do: its match
// labels, its expressions and their values.
func SelectorTerms(sel *metav1.LabelSelector) int {
	if sel == nil {
		return 0
	}
	n := len(sel.MatchLabels) + len(sel.MatchExpressions)
	for _, e := range sel.MatchExpressions {
		n += len(e.Values)
	}
	return n
}

// BudgetOf summarises a PodDisruptionBudget; ok is false when it selects no
// pods: policy/v1 reads a null selector as none and an empty one as every
// pod of the namespace. It judges a selector of any size (the budget index
// files none over MaxBudgetSelectorTerms).
func BudgetOf(p *policyv1.PodDisruptionBudget) (Budget, bool) {
	if p.Spec.Selector == nil {
		return Budget{}, false
	}
	sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector)
	if err != nil {
		return Budget{}, false
	}
	return Budget{Name: p.Name, Selector: sel, MinAvailable: p.Spec.MinAvailable, MaxUnavailable: p.Spec.MaxUnavailable}, true
}

// Rule renders the budget's rule as written: "minAvailable: 1".
func (b Budget) Rule() string {
	switch {
	case b.MaxUnavailable != nil:
		return "maxUnavailable: " + b.MaxUnavailable.String()
	case b.MinAvailable != nil:
		return "minAvailable: " + b.MinAvailable.String()
	}
	return "no minAvailable or maxUnavailable"
}

// DesiredHealthy is how many of expected pods the budget keeps, as the
// disruption controller of kube-controller-manager computes it
// (getExpectedPodCount): maxUnavailable and a percentage of minAvailable
// scale with the pods expected, rounding up; an integer minAvailable is
// taken as it is. A budget with neither keeps none.
func DesiredHealthy(b Budget, expected int32) (int32, error) {
	switch {
	case b.MaxUnavailable != nil:
		u, err := intstr.GetScaledValueFromIntOrPercent(b.MaxUnavailable, int(expected), true)
		if err != nil {
			return 0, err
		}
		return max(expected-int32(u), 0), nil
	case b.MinAvailable != nil && b.MinAvailable.Type == intstr.Int:
		return b.MinAvailable.IntVal, nil
	case b.MinAvailable != nil:
		m, err := intstr.GetScaledValueFromIntOrPercent(b.MinAvailable, int(expected), true)
		if err != nil {
			return 0, err
		}
		return int32(m), nil
	}
	return 0, nil
}

// AllowsNoDisruption reports whether the budget refuses every eviction even
// when all expected pods are healthy: the disruption controller then sets
// disruptionsAllowed to 0 and the Eviction API answers 429, so a drain of any
// node that runs one of the pods never completes. No pods, nothing to evict.
func AllowsNoDisruption(b Budget, expected int32) bool {
	if expected <= 0 {
		return false
	}
	desired, err := DesiredHealthy(b, expected)
	return err == nil && desired >= expected
}

// ReplicasToDrain is the smallest pod count above expected at which the
// budget allows one eviction; 0 when no count does (maxUnavailable: 0, a
// minAvailable of 100%).
func ReplicasToDrain(b Budget, expected int32) int32 {
	if b.MinAvailable != nil && b.MinAvailable.Type == intstr.Int {
		return max(b.MinAvailable.IntVal+1, expected+1)
	}
	// Percentages: the rounding decides; a budget that needs more than
	// a thousand more pods is one to change, not to feed.
	for n := max(expected+1, 1); n <= expected+1000; n++ {
		if !AllowsNoDisruption(b, n) {
			return n
		}
	}
	return 0
}

// BudgetTarget is one Deployment a budget selects, at the replicas it asks for.
type BudgetTarget struct {
	Name     string
	Replicas int32
}

// BudgetVerdict is the drain check's finding on one budget: it allows no
// eviction of the pods of Targets.
type BudgetVerdict struct {
	Budget  Budget
	Targets []BudgetTarget
	// Expected is the pods the budget counts (the targets' replicas).
	Expected int32
}

// JudgeBudget decides whether b blocks every eviction of the pods of the
// Deployments it selects (targets, with their replicas). The disruption
// controller counts every pod the budget selects; the guard knows only the
// Deployments' (pods of other controllers would only make it allow more).
func JudgeBudget(b Budget, targets []BudgetTarget) (BudgetVerdict, bool) {
	var expected int32
	for _, t := range targets {
		expected += t.Replicas
	}
	if !AllowsNoDisruption(b, expected) {
		return BudgetVerdict{}, false
	}
	sorted := slices.Clone(targets)
	slices.SortFunc(sorted, func(x, y BudgetTarget) int { return strings.Compare(x.Name, y.Name) })
	return BudgetVerdict{Budget: b, Targets: sorted, Expected: expected}, true
}

func pods(n int32) string {
	if n == 1 {
		return "1 pod"
	}
	return fmt.Sprintf("%d pods", n)
}

// fix says what would let a drain through: more replicas where that helps,
// otherwise a budget that allows one eviction.
func (v BudgetVerdict) fix(onDeployment bool) string {
	budgetFix := fmt.Sprintf("change PodDisruptionBudget %q to maxUnavailable: 1", v.Budget.Name)
	if !onDeployment {
		budgetFix = "set maxUnavailable: 1 instead"
	}
	n := ReplicasToDrain(v.Budget, v.Expected)
	if n == 0 {
		return budgetFix
	}
	if len(v.Targets) == 1 {
		return fmt.Sprintf("%s, or raise replicas to %d or more", budgetFix, n)
	}
	return fmt.Sprintf("%s, or raise the Deployments' replicas to %s or more in all", budgetFix, pods(n))
}

// targetsPhrase names the Deployments and their pods: `Deployment "web" (1
// replica)`, `Deployments "a" (1), "b" (1)`.
func (v BudgetVerdict) targetsPhrase() string {
	if len(v.Targets) == 1 {
		t := v.Targets[0]
		r := "replicas"
		if t.Replicas == 1 {
			r = "replica"
		}
		return fmt.Sprintf("Deployment %q (%d %s)", t.Name, t.Replicas, r)
	}
	parts := make([]string, len(v.Targets))
	for i, t := range v.Targets {
		parts[i] = fmt.Sprintf("%q (%d)", t.Name, t.Replicas)
	}
	return "Deployments " + strings.Join(parts, ", ")
}

// DeploymentMessage is the finding on a Deployment the budget selects.
func (v BudgetVerdict) DeploymentMessage() string {
	return fmt.Sprintf("PodDisruptionBudget %q (%s) allows no eviction of %s of %s: no node that runs one of them can be drained, so node upgrades stall; %s",
		v.Budget.Name, v.Budget.Rule(), pods(v.Expected), v.targetsPhrase(), v.fix(true))
}

// BudgetMessage is the finding on the budget itself.
func (v BudgetVerdict) BudgetMessage() string {
	return fmt.Sprintf("this budget (%s) allows no eviction of the %s of %s: no node that runs one of them can be drained, so node upgrades stall; %s",
		v.Budget.Rule(), pods(v.Expected), v.targetsPhrase(), v.fix(false))
}

// budgetFinding is a verdict as a finding at path, refusing in enforce mode.
func budgetFinding(mode string, path *field.Path, message string) Finding {
	if mode == BudgetsEnforce {
		return refuse(field.Forbidden(path, message), origin.DisruptionBudget)
	}
	return warn(origin.DisruptionBudget, path, message)
}

// BlocksNodeDrains: the write brings the Deployment's pods under a
// PodDisruptionBudget that then allows no eviction of them, or under a
// second budget, so that no node that runs one of them can be drained.
// Only a new Deployment, new replicas or new template labels can.
func BlocksNodeDrains(_ context.Context, in Input) Findings {
	d, old := in.Request.Object, in.Request.OldObject
	if !drainMayChange(d, old) {
		return nil
	}
	return checkBudgets(in.Options, in.Budgets, d, old, false)
}

// KeepsNodesUndrainable: the pods of a stored Deployment are under a budget
// that allows no eviction of them, or under two.
func KeepsNodesUndrainable(_ context.Context, in Input) Findings {
	return checkBudgets(in.Options, in.Budgets, in.Request.Object, nil, true)
}

// drainMayChange: a new Deployment, new replicas or new template labels may
// bring it under a budget that allows no eviction.
func drainMayChange(d, old *appsv1.Deployment) bool {
	return old == nil || rollout.Replicas(d) != rollout.Replicas(old) || OverlapMayChange(old, d)
}

// ReviewBudget judges a budget written (old nil on CREATE), on a change of
// its spec: whether it allows no eviction of the pods of the Deployments it
// selects now, and whether another budget selects their pods too (the
// Eviction API refuses a pod under two). What the stored budget did already
// only warns, in every mode: refusing it would block a change that makes
// nothing worse.
func (w *Reviewer) ReviewBudget(p, old *policyv1.PodDisruptionBudget, username string, groups []string) Findings {
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
	mode := o.DisruptionBudgets
	if n := SelectorTerms(p.Spec.Selector); n > MaxBudgetSelectorTerms {
		m := mode
		if old != nil && SelectorTerms(old.Spec.Selector) >= n {
			m = BudgetsWarn // over the bound already, and not grown
		}
		return Findings{oversizedBudget(m, n)}
	}
	b, ok := BudgetOf(p)
	if !ok {
		return nil
	}
	sels, err := w.Budgets.Targets(p.Namespace, b.Selector)
	if err != nil {
		// A warning is not worth refusing for; enforce mode refuses, as the
		// overlap check does, rather than let one through unchecked.
		if mode == BudgetsEnforce {
			return Findings{refuse(field.InternalError(budgetPath(b),
				fmt.Errorf("could not look up the Deployments this budget selects, try again: %w", err)), origin.DisruptionBudget)}
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
	if other, deployment := sharedPods(w.Budgets, p.Namespace, p.Name, sels); other != "" {
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

// oversizedBudget is the finding on a budget whose selector has n terms, more
// than the guard keeps.
func oversizedBudget(mode string, n int) Finding {
	path := field.NewPath("spec", "selector")
	msg := fmt.Sprintf(
		"%d terms (match labels, expressions and their values), more than the %d deployguard keeps of a PodDisruptionBudget's selector: "+
			"it does not keep this one in memory, so it cannot tell whose node drains this budget blocks; "+
			"select the pods with %d terms or fewer, such as the labels of their Deployment's selector",
		n, MaxBudgetSelectorTerms, MaxBudgetSelectorTerms)
	if mode == BudgetsEnforce {
		return refuse(field.Forbidden(path, msg), origin.Size)
	}
	return warn(origin.Size, path, msg)
}

// sharedPods names another budget of namespace (not name) that selects the
// pods of one of sels, and that Deployment; "" when none does.
func sharedPods(budgets BudgetSource, namespace, name string, sels []Selection) (other, deployment string) {
	for _, s := range sels {
		if s.Replicas == 0 {
			continue
		}
		selecting, err := budgets.Selecting(namespace, s.TemplateLabels)
		if err != nil {
			return "", ""
		}
		for _, b := range selecting {
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
func budgetsOver(budgets BudgetSource, d *appsv1.Deployment) (blocked []BudgetVerdict, names []string, err error) {
	selecting, err := budgets.Selecting(d.Namespace, labels.Set(d.Spec.Template.Labels))
	if err != nil {
		return nil, nil, err
	}
	for _, b := range selecting {
		names = append(names, b.Name)
		sels, err := budgets.Targets(d.Namespace, b.Selector)
		if err != nil {
			return nil, nil, err
		}
		if v, ok := JudgeBudget(b, targetsOf(sels, d.Name, rollout.Replicas(d))); ok {
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
func checkBudgets(o *Options, budgets BudgetSource, d, old *appsv1.Deployment, strict bool) Findings {
	if budgets == nil || o.DisruptionBudgets == BudgetsOff || d.DeletionTimestamp != nil || rollout.Replicas(d) == 0 {
		return nil
	}
	path := specPath.Child("replicas")
	blocked, names, err := budgetsOver(budgets, d)
	if err != nil {
		if !strict && o.DisruptionBudgets != BudgetsEnforce {
			return nil
		}
		return Findings{refuse(field.InternalError(path,
			fmt.Errorf("could not look up the PodDisruptionBudgets that select this Deployment's pods, try again: %w", err)), origin.DisruptionBudget)}
	}
	if len(blocked) == 0 && len(names) < 2 {
		return nil
	}
	var wasBlocked map[string]bool
	wasShared := false
	if old != nil && rollout.Replicas(old) > 0 {
		if ob, oldNames, err := budgetsOver(budgets, old); err == nil {
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
