package webhook

import (
	"fmt"
	"slices"
	"strings"

	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation/field"
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

// BudgetOf summarises a PodDisruptionBudget; ok is false when it selects no
// pods: policy/v1 reads a null selector as none and an empty one as every
// pod of the namespace.
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
		return refuse(field.Forbidden(path, message), reasonDisruptionBudget)
	}
	return warn(reasonDisruptionBudget, path, message)
}
