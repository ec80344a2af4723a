package review_test

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/deployguard/deployguard/webhook/review"
	"github.com/deployguard/deployguard/webhook/review/reviewtest"
)

func minAvail(v intstr.IntOrString) review.Budget {
	return review.Budget{Name: "b", Selector: labels.Everything(), MinAvailable: &v}
}

func maxUnavail(v intstr.IntOrString) review.Budget {
	return review.Budget{Name: "b", Selector: labels.Everything(), MaxUnavailable: &v}
}

// The rounding is the disruption controller's (getExpectedPodCount): both
// percentages round up, an integer minAvailable is taken as it is.
func TestAllowsNoDisruption(t *testing.T) {
	for _, tc := range []struct {
		name     string
		b        review.Budget
		expected int32
		want     bool
		toDrain  int32
	}{
		{"minAvailable 1 at 1", minAvail(intstr.FromInt32(1)), 1, true, 2},
		{"minAvailable 1 at 2", minAvail(intstr.FromInt32(1)), 2, false, 3},
		{"minAvailable 3 at 2", minAvail(intstr.FromInt32(3)), 2, true, 4},
		{"minAvailable 0 at 1", minAvail(intstr.FromInt32(0)), 1, false, 2},
		{"minAvailable 100% at 5", minAvail(intstr.FromString("100%")), 5, true, 0},
		{"minAvailable 90% at 5 rounds up to 5", minAvail(intstr.FromString("90%")), 5, true, 10},
		{"minAvailable 80% at 5", minAvail(intstr.FromString("80%")), 5, false, 6},
		{"minAvailable 50% at 1 rounds up to 1", minAvail(intstr.FromString("50%")), 1, true, 2},
		{"maxUnavailable 0 at 3", maxUnavail(intstr.FromInt32(0)), 3, true, 0},
		{"maxUnavailable 0% at 3", maxUnavail(intstr.FromString("0%")), 3, true, 0},
		{"maxUnavailable 1 at 1", maxUnavail(intstr.FromInt32(1)), 1, false, 2},
		{"maxUnavailable 10% at 1 rounds up to 1", maxUnavail(intstr.FromString("10%")), 1, false, 2},
		{"no pods, nothing to evict", minAvail(intstr.FromInt32(1)), 0, false, 2},
		{"neither rule keeps nothing", review.Budget{Name: "b", Selector: labels.Everything()}, 1, false, 2},
		{"a malformed percentage decides nothing", minAvail(intstr.FromString("lots")), 1, false, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := review.AllowsNoDisruption(tc.b, tc.expected); got != tc.want {
				t.Errorf("AllowsNoDisruption(%s, %d) = %v, want %v", tc.b.Rule(), tc.expected, got, tc.want)
			}
			if got := review.ReplicasToDrain(tc.b, tc.expected); got != tc.toDrain {
				t.Errorf("ReplicasToDrain(%s, %d) = %d, want %d", tc.b.Rule(), tc.expected, got, tc.toDrain)
			}
		})
	}
}

// A budget over two Deployments counts the pods of both, as the disruption
// controller does.
func TestJudgeBudgetCountsEveryDeploymentItSelects(t *testing.T) {
	b := minAvail(intstr.FromInt32(1))
	if _, blocked := review.JudgeBudget(b, []review.BudgetTarget{{"a", 1}, {"b", 1}}); blocked {
		t.Error("minAvailable 1 over two pods allows one eviction")
	}
	v, blocked := review.JudgeBudget(b, []review.BudgetTarget{{"web", 1}})
	if !blocked {
		t.Fatal("minAvailable 1 over one pod allows none")
	}
	for _, want := range []string{`PodDisruptionBudget "b" (minAvailable: 1)`, `Deployment "web" (1 replica)`, "maxUnavailable: 1", "raise replicas to 2 or more"} {
		if msg := v.DeploymentMessage(); !strings.Contains(msg, want) {
			t.Errorf("message %q lacks %q", msg, want)
		}
	}
	v, _ = review.JudgeBudget(maxUnavail(intstr.FromInt32(0)), []review.BudgetTarget{{"b", 2}, {"a", 3}})
	msg := v.BudgetMessage()
	if !strings.Contains(msg, `Deployments "a" (3), "b" (2)`) || strings.Contains(msg, "raise") {
		t.Errorf("budget message %q: want both Deployments in order and no replica advice (no count helps maxUnavailable: 0)", msg)
	}
}

func pdb(name string, sel *metav1.LabelSelector, minAvailable *intstr.IntOrString) *policyv1.PodDisruptionBudget {
	return reviewtest.BudgetIn("ns", name, sel, minAvailable)
}

func deploymentWith(name string, replicas int32, podLabels map[string]string) *appsv1.Deployment {
	return reviewtest.DeploymentIn("ns", name, replicas, podLabels)
}

func TestBudgetIndexFindsBudgetsAndTheirDeployments(t *testing.T) {
	deps := review.NewOverlapIndex(nil)
	x := review.NewBudgetIndex(deps)
	one := intstr.FromInt32(1)
	x.Set(pdb("web", &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}, &one))
	x.Set(pdb("all", &metav1.LabelSelector{}, &one))
	x.Set(pdb("none", nil, &one))
	x.Set(pdb("tier", &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "tier", Operator: metav1.LabelSelectorOpExists}}}, &one))
	deps.Set(deploymentWith("web", 1, map[string]string{"app": "web"}))
	deps.Set(deploymentWith("api", 2, map[string]string{"app": "api", "tier": "back"}))

	names := func(bs []review.Budget) string {
		var out []string
		for _, b := range bs {
			out = append(out, b.Name)
		}
		slices.Sort(out)
		return strings.Join(out, ",")
	}
	got, _ := x.Selecting("ns", labels.Set{"app": "web"})
	if names(got) != "all,web" {
		t.Errorf("budgets selecting app=web: %s, want all,web (an empty selector selects every pod, a null one none)", names(got))
	}
	got, _ = x.Selecting("ns", labels.Set{"app": "api", "tier": "back"})
	if names(got) != "all,tier" {
		t.Errorf("budgets selecting api: %s, want all,tier", names(got))
	}
	if got, _ := x.Selecting("other", labels.Set{"app": "web"}); len(got) != 0 {
		t.Errorf("another namespace's budgets: %v", got)
	}
	all, _ := review.BudgetOf(pdb("all", &metav1.LabelSelector{}, &one))
	sels, _ := x.Targets("ns", all.Selector)
	if len(sels) != 2 {
		t.Errorf("an empty selector's Deployments: %d, want 2", len(sels))
	}
	x.Delete("ns", "web")
	if got, _ := x.Selecting("ns", labels.Set{"app": "web"}); names(got) != "all" {
		t.Errorf("after deleting web: %s", names(got))
	}
	if x.Len() != 2 {
		t.Errorf("Len = %d, want 2 (the null selector is not filed)", x.Len())
	}
}

func TestDrainCheckOnDeploymentsAndBudgets(t *testing.T) {
	deps := review.NewOverlapIndex(nil)
	x := review.NewBudgetIndex(deps)
	one := intstr.FromInt32(1)
	budget := pdb("web", &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}, &one)
	x.Set(budget)
	for _, mode := range []string{"", review.BudgetsWarn, review.BudgetsEnforce, review.BudgetsOff} {
		w := &review.Reviewer{Options: &review.Options{DisruptionBudgets: mode}, Overlaps: deps, Budgets: x}
		f := review.CheckBudgets(w.Options, w.Budgets, deploymentWith("web", 1, map[string]string{"app": "web"}), nil, false)
		switch mode {
		case review.BudgetsOff:
			if len(f) != 0 {
				t.Errorf("off: %v", f)
			}
			continue
		case review.BudgetsEnforce:
			if len(f.Refusals()) != 1 {
				t.Errorf("enforce: want a refusal, got %v", f)
			}
		default:
			if len(f.Warnings()) != 1 || len(f.Refusals()) != 0 {
				t.Errorf("%q: want one warning, got %v", mode, f)
			} else if !strings.HasPrefix(f.Warnings()[0], "spec.replicas: PodDisruptionBudget \"web\" (minAvailable: 1)") {
				t.Errorf("warning: %s", f.Warnings()[0])
			}
		}
		if f := review.CheckBudgets(w.Options, w.Budgets, deploymentWith("web", 2, map[string]string{"app": "web"}), nil, false); len(f) != 0 {
			t.Errorf("%q: two replicas under minAvailable 1 allow a drain: %v", mode, f)
		}
		// The budget's own webhook, with web stored at 1 replica.
		deps.Set(deploymentWith("web", 1, map[string]string{"app": "web"}))
		f = w.ReviewBudget(budget, nil, "someone", nil)
		if len(f) != 1 || f[0].Field != "spec.minAvailable" {
			t.Errorf("%q: the budget's review: %v", mode, f)
		}
		if f := w.ReviewBudget(budget, budget, "someone", nil); len(f) != 0 {
			t.Errorf("%q: an update that leaves the spec alone: %v", mode, f)
		}
		deps.Delete("ns", "web")
	}
}

// Enforce mode refuses only what a write makes worse: a scale that leaves a
// budget blocking it already blocked warns, as an overlap that predates an
// update does; a Deployment at 0 replicas has no pods to evict.
func TestDrainCheckRefusesOnlyWhatAWriteMakesWorse(t *testing.T) {
	deps := review.NewOverlapIndex(nil)
	x := review.NewBudgetIndex(deps)
	three := intstr.FromInt32(3)
	x.Set(pdb("web", &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}, &three))
	w := &review.Reviewer{Options: &review.Options{DisruptionBudgets: review.BudgetsEnforce}, Budgets: x}
	web := func(n int32) *appsv1.Deployment { return deploymentWith("web", n, map[string]string{"app": "web"}) }
	if f := review.CheckBudgets(w.Options, w.Budgets, web(1), nil, false); len(f.Refusals()) != 1 {
		t.Errorf("a new Deployment under minAvailable 3: %v", f)
	}
	if f := review.CheckBudgets(w.Options, w.Budgets, web(2), web(1), false); len(f.Refusals()) != 0 || len(f.Warnings()) != 1 {
		t.Errorf("scaling 1 to 2 under minAvailable 3 makes nothing worse: want one warning, got %v", f)
	}
	if f := review.CheckBudgets(w.Options, w.Budgets, web(0), web(1), false); len(f) != 0 {
		t.Errorf("no pods, nothing to evict: %v", f)
	}
	one := intstr.FromInt32(1)
	x.Set(pdb("web", &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}, &one))
	if f := review.CheckBudgets(w.Options, w.Budgets, web(1), web(2), false); len(f.Refusals()) != 1 {
		t.Errorf("scaling 2 to 1 under minAvailable 1 blocks every drain: %v", f)
	}
}

// A pod under two budgets cannot be evicted at all (the Eviction API answers
// 500): said on the Deployment, and on the second budget.
func TestDrainCheckReportsPodsUnderTwoBudgets(t *testing.T) {
	deps := review.NewOverlapIndex(nil)
	x := review.NewBudgetIndex(deps)
	one := intstr.FromInt32(1)
	x.Set(pdb("web", &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}, &one))
	w := &review.Reviewer{Options: &review.Options{}, Overlaps: deps, Budgets: x}
	web := deploymentWith("web", 3, map[string]string{"app": "web", "tier": "front"})
	deps.Set(web)
	second := pdb("front", &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "front"}}, &one)
	f := w.ReviewBudget(second, nil, "someone", nil)
	if len(f) != 1 || f[0].Field != "spec.selector" || !strings.Contains(f[0].Message, `PodDisruptionBudget "web" selects too`) {
		t.Errorf("the second budget's review: %v", f)
	}
	x.Set(second)
	f = review.CheckBudgets(w.Options, w.Budgets, web, nil, false)
	if len(f) != 1 || !strings.Contains(f[0].Message, "selected by 2 PodDisruptionBudgets (front, web)") {
		t.Errorf("the Deployment's check: %v", f)
	}
}
