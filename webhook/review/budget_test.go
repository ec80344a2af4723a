package review_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
			assert.Equal(t, tc.want, review.AllowsNoDisruption(tc.b, tc.expected), "AllowsNoDisruption(%s, %d)", tc.b.Rule(), tc.expected)
			assert.Equal(t, tc.toDrain, review.ReplicasToDrain(tc.b, tc.expected), "ReplicasToDrain(%s, %d)", tc.b.Rule(), tc.expected)
		})
	}
}

// A budget over two Deployments counts the pods of both, as the disruption
// controller does.
func TestJudgeBudgetCountsEveryDeploymentItSelects(t *testing.T) {
	b := minAvail(intstr.FromInt32(1))
	_, blocked := review.JudgeBudget(b, []review.BudgetTarget{{"a", 1}, {"b", 1}})
	assert.False(t, blocked, "minAvailable 1 over two pods allows one eviction")
	v, blocked := review.JudgeBudget(b, []review.BudgetTarget{{"web", 1}})
	require.True(t, blocked, "minAvailable 1 over one pod allows none")
	for _, want := range []string{`PodDisruptionBudget "b" (minAvailable: 1)`, `Deployment "web" (1 replica)`, "maxUnavailable: 1", "raise replicas to 2 or more"} {
		assert.Contains(t, v.DeploymentMessage(), want)
	}
	v, _ = review.JudgeBudget(maxUnavail(intstr.FromInt32(0)), []review.BudgetTarget{{"b", 2}, {"a", 3}})
	msg := v.BudgetMessage()
	assert.Contains(t, msg, `Deployments "a" (3), "b" (2)`, "both Deployments, in order")
	assert.NotContains(t, msg, "raise", "no replica advice: no count helps maxUnavailable: 0")
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
	assert.Equal(t, "all,web", names(got), "budgets selecting app=web (an empty selector selects every pod, a null one none)")
	got, _ = x.Selecting("ns", labels.Set{"app": "api", "tier": "back"})
	assert.Equal(t, "all,tier", names(got), "budgets selecting api")
	got, _ = x.Selecting("other", labels.Set{"app": "web"})
	assert.Empty(t, got, "another namespace's budgets")
	all, _ := review.BudgetOf(pdb("all", &metav1.LabelSelector{}, &one))
	sels, _ := x.Targets("ns", all.Selector)
	assert.Len(t, sels, 2, "an empty selector's Deployments")
	x.Delete("ns", "web")
	got, _ = x.Selecting("ns", labels.Set{"app": "web"})
	assert.Equal(t, "all", names(got), "after deleting web")
	assert.Equal(t, 2, x.Len(), "the null selector is not filed")
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
			assert.Empty(t, f, "off")
			continue
		case review.BudgetsEnforce:
			assert.Len(t, f.Refusals(), 1, "enforce: a refusal, got %v", f)
		default:
			if assert.Len(t, f.Warnings(), 1, "%q: one warning, got %v", mode, f) && assert.Empty(t, f.Refusals(), "%q: no refusal", mode) {
				assert.True(t, strings.HasPrefix(f.Warnings()[0], "spec.replicas: PodDisruptionBudget \"web\" (minAvailable: 1)"), "warning: %s", f.Warnings()[0])
			}
		}
		f = review.CheckBudgets(w.Options, w.Budgets, deploymentWith("web", 2, map[string]string{"app": "web"}), nil, false)
		assert.Empty(t, f, "%q: two replicas under minAvailable 1 allow a drain", mode)
		// The budget's own webhook, with web stored at 1 replica.
		deps.Set(deploymentWith("web", 1, map[string]string{"app": "web"}))
		f = w.ReviewBudget(budget, nil, "someone", nil)
		if assert.Len(t, f, 1, "%q: the budget's review: %v", mode, f) {
			assert.Equal(t, "spec.minAvailable", f[0].Field, "%q: the budget's review", mode)
		}
		assert.Empty(t, w.ReviewBudget(budget, budget, "someone", nil), "%q: an update that leaves the spec alone", mode)
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
	f := review.CheckBudgets(w.Options, w.Budgets, web(1), nil, false)
	assert.Len(t, f.Refusals(), 1, "a new Deployment under minAvailable 3: %v", f)
	f = review.CheckBudgets(w.Options, w.Budgets, web(2), web(1), false)
	assert.Empty(t, f.Refusals(), "scaling 1 to 2 under minAvailable 3 makes nothing worse: %v", f)
	assert.Len(t, f.Warnings(), 1, "scaling 1 to 2 under minAvailable 3: one warning, got %v", f)
	assert.Empty(t, review.CheckBudgets(w.Options, w.Budgets, web(0), web(1), false), "no pods, nothing to evict")
	one := intstr.FromInt32(1)
	x.Set(pdb("web", &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}, &one))
	f = review.CheckBudgets(w.Options, w.Budgets, web(1), web(2), false)
	assert.Len(t, f.Refusals(), 1, "scaling 2 to 1 under minAvailable 1 blocks every drain: %v", f)
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
	if assert.Len(t, f, 1, "the second budget's review: %v", f) {
		assert.Equal(t, "spec.selector", f[0].Field)
		assert.Contains(t, f[0].Message, `PodDisruptionBudget "web" selects too`)
	}
	x.Set(second)
	f = review.CheckBudgets(w.Options, w.Budgets, web, nil, false)
	if assert.Len(t, f, 1, "the Deployment's check: %v", f) {
		assert.Contains(t, f[0].Message, "selected by 2 PodDisruptionBudgets (front, web)")
	}
}

// The cache keeps of a PodDisruptionBudget what the budget index reads: a
// tenant's labels, annotations, owners and finalizers, and the disruption
// controller's status, are not held; the budget it files is the same.
func TestStripBudgetForCacheKeepsWhatTheIndexReads(t *testing.T) {
	one := intstr.FromInt32(1)
	p := reviewtest.BudgetIn("shop", "web", &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}, &one)
	p.UID, p.ResourceVersion, p.Generation = "uid-web", "42", 3
	deleted := metav1.Now()
	p.DeletionTimestamp = &deleted
	p.Labels, p.Annotations = map[string]string{}, map[string]string{"notes": strings.Repeat("x", 200_000)}
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "o", UID: "o"}}
	p.Finalizers = []string{"team.example.com/keep"}
	p.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}
	p.Status = policyv1.PodDisruptionBudgetStatus{DisruptedPods: map[string]metav1.Time{"web-1": deleted}, CurrentHealthy: 2, ObservedGeneration: 3}
	for i := range 1000 {
		p.Labels[fmt.Sprintf("team.example.com/l-%d", i)] = "v"
	}
	want, ok := review.BudgetOf(p)
	require.True(t, ok)
	spec := *p.Spec.DeepCopy()

	got, err := review.StripBudgetForCache(p)
	require.NoError(t, err)
	kept := got.(*policyv1.PodDisruptionBudget)
	assert.Equal(t, metav1.ObjectMeta{Namespace: "shop", Name: "web", UID: "uid-web", ResourceVersion: "42", Generation: 3, DeletionTimestamp: &deleted},
		kept.ObjectMeta)
	assert.Equal(t, spec, kept.Spec)
	assert.Zero(t, kept.Status)
	b, ok := review.BudgetOf(kept)
	require.True(t, ok)
	assert.Equal(t, want.Name, b.Name)
	assert.Equal(t, want.Selector.String(), b.Selector.String())
	assert.Equal(t, want.MinAvailable, b.MinAvailable)
}

// sizedSelector has n terms: match labels, and an expression with values.
func sizedSelector(labels, values int) *metav1.LabelSelector {
	sel := &metav1.LabelSelector{MatchLabels: map[string]string{}}
	for i := range labels {
		sel.MatchLabels[fmt.Sprintf("team.example.com/l-%d", i)] = "v"
	}
	if values > 0 {
		e := metav1.LabelSelectorRequirement{Key: "tier", Operator: metav1.LabelSelectorOpIn}
		for i := range values {
			e.Values = append(e.Values, fmt.Sprintf("t-%d", i))
		}
		sel.MatchExpressions = append(sel.MatchExpressions, e)
	}
	return sel
}

// A tenant may write a budget's selector as large as the API server takes
// (a value's length is bounded, not how many): the guard keeps and judges at
// most MaxBudgetSelectorTerms of one, the cache drops a larger one, and the
// budget's webhook says so (refuses it in enforce mode; a budget over the
// bound already may be changed, not grown).
func TestABudgetsSelectorIsBounded(t *testing.T) {
	one := intstr.FromInt32(1)
	for _, tc := range []struct {
		name           string
		labels, values int
		want           int
	}{
		{"64 match labels", 64, 0, 64},
		{"65 match labels", 65, 0, 65},
		{"an expression of 63 values", 0, 63, 64},
		{"an expression of 64 values", 0, 64, 65},
		{"20,000 terms", 10_000, 9_999, 20_000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sel := sizedSelector(tc.labels, tc.values)
			require.Equal(t, tc.want, review.SelectorTerms(sel))
			over := tc.want > review.MaxBudgetSelectorTerms

			kept, err := review.StripBudgetForCache(pdb("web", sel.DeepCopy(), &one))
			require.NoError(t, err)
			x := review.NewBudgetIndex(review.NewOverlapIndex(nil))
			x.Set(kept.(*policyv1.PodDisruptionBudget))
			if over {
				assert.Nil(t, kept.(*policyv1.PodDisruptionBudget).Spec.Selector, "the cache keeps no selector over the bound")
				assert.Zero(t, x.Len(), "nor does the index file its budget")
				assert.Equal(t, 1, x.Unjudged(), "it counts it")
			} else {
				assert.Equal(t, sel, kept.(*policyv1.PodDisruptionBudget).Spec.Selector, "the cache keeps a selector within the bound whole")
				assert.Equal(t, 1, x.Len())
				assert.Zero(t, x.Unjudged())
			}
			x.Set(pdb("web", sel, &one))
			assert.Equal(t, !over, x.Len() == 1, "the index files a budget within the bound only, however it is given")
			b, ok := review.BudgetOf(pdb("web", sel, &one))
			pod := labels.Set{"tier": "t-0"}
			for k, v := range sel.MatchLabels {
				pod[k] = v
			}
			assert.True(t, ok && b.Selector.Matches(pod),
				"BudgetOf summarises any selector (deployguard status reads budgets from the API server)")

			for _, mode := range []string{review.BudgetsWarn, review.BudgetsEnforce} {
				w := &review.Reviewer{Options: &review.Options{DisruptionBudgets: mode}, Budgets: x}
				f := w.ReviewBudget(pdb("web", sel, &one), nil, "someone", nil)
				if !over {
					assert.Empty(t, f, "%s: a budget within the bound selecting nothing", mode)
					continue
				}
				require.Len(t, f, 1, "%s: %v", mode, f)
				assert.Equal(t, "spec.selector", f[0].Field)
				assert.Equal(t, "size", f[0].Origin)
				assert.Contains(t, f[0].Message, fmt.Sprintf("%d terms (match labels, expressions and their values), more than the 64 deployguard keeps", tc.want))
				assert.Contains(t, f[0].Message, "select the pods with 64 terms or fewer")
				if mode == review.BudgetsEnforce {
					require.Len(t, f.Refusals(), 1, "enforce refuses a create over the bound")
					assert.Equal(t, "size", review.RefusedBy(f.Refusals()))
				} else {
					assert.Empty(t, f.Refusals(), "warn only warns")
				}
				// Ratcheted: a budget over the bound already may be changed
				// (here its rule) without a refusal, not grown.
				before := pdb("web", sel, &one)
				two := intstr.FromInt32(2)
				f = w.ReviewBudget(pdb("web", sel, &two), before, "someone", nil)
				assert.Empty(t, f.Refusals(), "%s: a budget over the bound already, its rule changed", mode)
				assert.Len(t, f.Warnings(), 1, "%s: but warned", mode)
				grown := sizedSelector(tc.labels+1, tc.values)
				f = w.ReviewBudget(pdb("web", grown, &one), before, "someone", nil)
				assert.Equal(t, mode == review.BudgetsEnforce, len(f.Refusals()) == 1, "%s: grown: %v", mode, f)
			}
		})
	}
}

// The size bound refuses (in enforce mode) what makes a budget's selector
// larger than the bound, never what makes it smaller: a budget over the bound
// shrunk to a few terms is judged as the drain check ratchets, against what
// the old selector blocked already.
func TestABudgetsSelectorShrinksWithoutARefusal(t *testing.T) {
	deps := review.NewOverlapIndex(nil)
	deps.Set(deploymentWith("web", 1, map[string]string{"app": "web", "tier": "t-0"}))
	x := review.NewBudgetIndex(deps)
	one := intstr.FromInt32(1)
	w := &review.Reviewer{Options: &review.Options{DisruptionBudgets: review.BudgetsEnforce}, Overlaps: deps, Budgets: x}
	large := sizedSelector(0, 65)
	large.MatchLabels["app"] = "web" // 67 terms, selecting web's one pod
	small := &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}

	f := w.ReviewBudget(pdb("web", small, &one), pdb("web", large, &one), "someone", nil)
	assert.Empty(t, f.Refusals(), "shrunk within the bound, blocking what it blocked: %v", f)
	if assert.Len(t, f.Warnings(), 1, "but the drain check warns") {
		assert.Contains(t, f.Warnings()[0], "spec.minAvailable: this budget (minAvailable: 1) allows no eviction")
	}
	f = w.ReviewBudget(pdb("web", large, &one), pdb("web", small, &one), "someone", nil)
	assert.Equal(t, "size", review.RefusedBy(f.Refusals()), "grown over the bound from within it: %v", f)
	f = w.ReviewBudget(pdb("web", large, &one), pdb("web", &metav1.LabelSelector{}, &one), "someone", nil)
	assert.Equal(t, "size", review.RefusedBy(f.Refusals()), "grown from an empty selector: %v", f)
	f = w.ReviewBudget(pdb("web", sizedSelector(0, 64), &one), pdb("web", large, &one), "someone", nil)
	assert.Empty(t, f.Refusals(), "shrunk, still over the bound: %v", f)
	assert.Len(t, f.Warnings(), 1, "shrunk, still over the bound, warned")

	w.Options.ExemptUsernames = []string{"platform-bot"}
	assert.Empty(t, w.ReviewBudget(pdb("web", large, &one), nil, "platform-bot", nil), "an exempt identity")
	w.Options.DisruptionBudgets = review.BudgetsOff
	assert.Empty(t, w.ReviewBudget(pdb("web", large, &one), nil, "someone", nil), "the drain check off")
}

// The index counts the budgets it does not judge for their selector's size,
// as the cache hands them over, and forgets one shrunk or deleted. A
// tenant's annotation of the cache's marker counts for nothing: the cache
// keeps no annotation of a budget's own.
func TestTheBudgetsNotJudgedAreCounted(t *testing.T) {
	one := intstr.FromInt32(1)
	cached := func(name string, sel *metav1.LabelSelector, annotations map[string]string) *policyv1.PodDisruptionBudget {
		p := pdb(name, sel, &one)
		p.Annotations = annotations
		kept, err := review.StripBudgetForCache(p)
		require.NoError(t, err)
		return kept.(*policyv1.PodDisruptionBudget)
	}
	x := review.NewBudgetIndex(review.NewOverlapIndex(nil))
	small := &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}
	x.Set(cached("forged", small, map[string]string{"deployguard.io/selector-not-kept": "100"}))
	assert.Equal(t, 0, x.Unjudged(), "a tenant's annotation")
	assert.Equal(t, 1, x.Len())
	// deployguard check files manifests as written.
	forged := pdb("forged-manifest", small, &one)
	forged.Annotations = map[string]string{"deployguard.io/selector-not-kept": "100"}
	x.Set(forged)
	assert.Equal(t, 0, x.Unjudged(), "a manifest's annotation beside its selector")
	assert.Equal(t, 2, x.Len(), "the manifest's budget is filed and judged")
	x.Delete("ns", "forged-manifest")
	x.Set(cached("wide", sizedSelector(65, 0), nil))
	x.Set(cached("wider", sizedSelector(0, 100), nil))
	assert.Equal(t, 2, x.Unjudged())
	x.Set(cached("wide", sizedSelector(65, 0), nil))
	assert.Equal(t, 2, x.Unjudged(), "an update of one counted already")
	x.Set(cached("wide", small, nil))
	assert.Equal(t, 1, x.Unjudged(), "shrunk within the bound")
	assert.Equal(t, 2, x.Len(), "and filed")
	x.Delete("ns", "wider")
	assert.Equal(t, 0, x.Unjudged(), "deleted")
}
