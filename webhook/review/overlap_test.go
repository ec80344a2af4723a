package review_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"runtime/debug"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deployguard/deployguard/webhook/review"
	"github.com/deployguard/deployguard/webhook/review/reviewtest"
)

// selecting is a Deployment with the given selector and pod labels.
func selecting(name string, sel *metav1.LabelSelector, podLabels map[string]string) *appsv1.Deployment {
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shop"},
		Spec:       appsv1.DeploymentSpec{Selector: sel, Template: corev1PodTemplate(podLabels)},
	}
}

func matchLabels(kv ...string) *metav1.LabelSelector {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return &metav1.LabelSelector{MatchLabels: m}
}

func expr(key string, op metav1.LabelSelectorOperator, values ...string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: key, Operator: op, Values: values}}}
}

// everyOther is the brute force the index must agree with: every other
// Deployment of the namespace.
func everyOther(ds []*appsv1.Deployment) []review.Selection {
	var out []review.Selection
	for _, d := range ds {
		if s, ok := review.SelectionOf(d); ok {
			out = append(out, s)
		}
	}
	return out
}

func TestOverlapThroughTheIndex(t *testing.T) {
	web := selecting("web", matchLabels("app", "web"), map[string]string{"app": "web", "track": "stable"})
	tests := []struct {
		name    string
		d       *appsv1.Deployment
		want    string // in the error, or "" for no overlap
		warning bool
	}{
		{name: "my selector selects their pods", d: selecting("all", matchLabels("app", "web"), map[string]string{"app": "web"}), want: `also selects the pods of Deployment "web"`},
		{name: "their selector selects my pods", d: selecting("canary", matchLabels("app", "web", "track", "canary"), map[string]string{"app": "web", "track": "canary"}), want: `would be selected by Deployment "web"`},
		{name: "distinct", d: selecting("api", matchLabels("app", "api"), map[string]string{"app": "api"})},
		{name: "set selector", d: selecting("any", expr("app", metav1.LabelSelectorOpIn, "api", "web"), map[string]string{"app": "api"}), want: `also selects the pods of Deployment "web"`},
		{name: "selector of expressions the index cannot enumerate", d: selecting("notin", expr("app", metav1.LabelSelectorOpNotIn, "api"), map[string]string{"tier": "x"}), want: `also selects the pods of Deployment "web"`},
		{name: "exists", d: selecting("exists", expr("track", metav1.LabelSelectorOpExists), map[string]string{"track": "x"}), want: `also selects the pods of Deployment "web"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := review.NewOverlapIndex(nil)
			x.Set(web)
			got, err := x.OverlapCandidates(context.Background(), tt.d)
			require.NoError(t, err)
			f := review.CheckOverlap(tt.d, got)
			if tt.want == "" {
				assert.Empty(t, f.Refusals())
				return
			}
			require.Len(t, f.Refusals(), 1)
			assert.Contains(t, f.Refusals()[0].Error(), tt.want)
			assert.Equal(t, review.CheckOverlap(tt.d, everyOther([]*appsv1.Deployment{web})), f, "the same as comparing with every Deployment")
		})
	}

	t.Run("a Deployment being deleted overlaps nothing", func(t *testing.T) {
		x := review.NewOverlapIndex(nil)
		gone := web.DeepCopy()
		gone.DeletionTimestamp = &metav1.Time{}
		x.Set(gone)
		d := selecting("all", matchLabels("app", "web"), map[string]string{"app": "web"})
		got, err := x.OverlapCandidates(context.Background(), d)
		require.NoError(t, err)
		assert.Empty(t, review.CheckOverlap(d, got).Refusals())
	})
	t.Run("refiled when its pod labels change, forgotten when deleted", func(t *testing.T) {
		x := review.NewOverlapIndex(nil)
		x.Set(web)
		d := selecting("all", matchLabels("app", "web"), map[string]string{"app": "web"})
		moved := web.DeepCopy()
		moved.Spec.Template.Labels = map[string]string{"app": "web-v2"}
		moved.Spec.Selector = matchLabels("app", "web-v2")
		x.Set(moved)
		got, _ := x.OverlapCandidates(context.Background(), d)
		assert.Empty(t, review.CheckOverlap(d, got).Refusals())
		x.Set(web)
		got, _ = x.OverlapCandidates(context.Background(), d)
		assert.NotEmpty(t, review.CheckOverlap(d, got).Refusals())
		x.Delete("shop", "web")
		got, _ = x.OverlapCandidates(context.Background(), d)
		assert.Empty(t, got)
		assert.Zero(t, x.Len())
	})
	t.Run("not synced: no answer rather than a wrong one", func(t *testing.T) {
		x := review.NewOverlapIndex(func() bool { return false })
		_, err := x.OverlapCandidates(context.Background(), web)
		assert.ErrorIs(t, err, review.ErrIndexNotSynced)
	})
}

// The index finds every overlap that comparing with every Deployment of the
// namespace finds, on random selectors and labels (equality, set and
// existence requirements over a small alphabet, so that overlaps are common).
func TestOverlapIndexAgreesWithBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	keys, values := []string{"app", "tier", "track", "team"}, []string{"a", "b", "c"}
	podLabels := func() map[string]string {
		m := map[string]string{}
		for _, k := range keys {
			if rng.IntN(2) == 0 {
				m[k] = values[rng.IntN(len(values))]
			}
		}
		return m
	}
	selector := func(pods map[string]string) *metav1.LabelSelector {
		s := &metav1.LabelSelector{}
		for k, v := range pods {
			switch rng.IntN(5) {
			case 0, 1:
				if s.MatchLabels == nil {
					s.MatchLabels = map[string]string{}
				}
				s.MatchLabels[k] = v
			case 2:
				s.MatchExpressions = append(s.MatchExpressions, metav1.LabelSelectorRequirement{Key: k, Operator: metav1.LabelSelectorOpIn, Values: []string{v, values[rng.IntN(len(values))]}})
			case 3:
				s.MatchExpressions = append(s.MatchExpressions, metav1.LabelSelectorRequirement{Key: k, Operator: metav1.LabelSelectorOpExists})
			}
		}
		if rng.IntN(4) == 0 {
			s.MatchExpressions = append(s.MatchExpressions, metav1.LabelSelectorRequirement{Key: "zone", Operator: metav1.LabelSelectorOpDoesNotExist})
		}
		return s
	}
	var all []*appsv1.Deployment
	x := review.NewOverlapIndex(nil)
	for i := range 300 {
		pods := podLabels()
		d := selecting(fmt.Sprintf("d%03d", i), selector(pods), pods)
		all = append(all, d)
		x.Set(d)
	}
	overlaps := 0
	for _, d := range all {
		others := slices.DeleteFunc(slices.Clone(all), func(o *appsv1.Deployment) bool { return o == d })
		want := review.CheckOverlap(d, everyOther(others))
		got, err := x.OverlapCandidates(context.Background(), d)
		require.NoError(t, err)
		require.Equal(t, want, review.CheckOverlap(d, got), "Deployment %s selector %v labels %v", d.Name, d.Spec.Selector, d.Spec.Template.Labels)
		overlaps += len(want.Refusals())
	}
	assert.Greater(t, overlaps, 100, "the random corpus exercises overlaps")
}

// One admission does not copy, nor even look at, the other Deployments of the
// namespace: the allocations of the validating path are the same with 10 or
// with 10,000 Deployments in the namespace.
func TestOverlapCostIsFlatInTheNamespace(t *testing.T) {
	allocs := func(n int) float64 {
		x := review.NewOverlapIndex(nil)
		for i := range n {
			name := fmt.Sprintf("app-%05d", i)
			// The common label sorts first in every selector: it must not
			// make every Deployment a candidate.
			x.Set(selecting(name, matchLabels("app.kubernetes.io/component", "web", "app.kubernetes.io/name", name),
				map[string]string{"app.kubernetes.io/component": "web", "app.kubernetes.io/name": name, "team": "checkout"}))
		}
		d := reviewtest.Guarded()
		d.Spec.Template.Labels["app.kubernetes.io/component"] = "web"
		d.Spec.Template.Labels["team"] = "checkout"
		o := reviewtest.Options()
		// A collection empties the CEL evaluator's pools, whose refills
		// would be counted at the collector's pace, not the index's: off
		// while counting.
		runtime.GC()
		defer debug.SetGCPercent(debug.SetGCPercent(-1))
		return testing.AllocsPerRun(50, func() {
			f := checkRequest(context.Background(), d, nil, alice, o, x)
			if len(f.Refusals()) > 0 { // not require.Empty: its reflection would count
				require.FailNow(t, "refused", "%v", f.Refusals())
			}
		})
	}
	small, large := allocs(10), allocs(10_000)
	t.Logf("allocations per validation: %.0f with 10 Deployments in the namespace, %.0f with 10,000", small, large)
	assert.Equal(t, small, large)
}

func corev1PodTemplate(podLabels map[string]string) corev1.PodTemplateSpec {
	return corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: podLabels}}
}

// TestOverlapMayChange: only a new Deployment, new pod labels or a deletion
// can turn an overlap (the selector is immutable).
func TestOverlapMayChange(t *testing.T) {
	tests := []struct {
		name string
		mut  func(*appsv1.Deployment)
		want bool
	}{
		{"new image", func(d *appsv1.Deployment) {
			d.Spec.Template.Spec.Containers = []corev1.Container{{Name: "web", Image: "web:2.0"}}
		}, false},
		{"new replicas", func(d *appsv1.Deployment) { d.Spec.Replicas = nil }, false},
		{"new pod label", func(d *appsv1.Deployment) { d.Spec.Template.Labels["track"] = "stable" }, true},
		{"a pod label swapped for an empty one", func(d *appsv1.Deployment) {
			delete(d.Spec.Template.Labels, "tier")
			d.Spec.Template.Labels["track"] = ""
		}, true},
		{"being deleted", func(d *appsv1.Deployment) { d.DeletionTimestamp = &metav1.Time{} }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			old := reviewtest.DeploymentIn("shop", "web", 2, map[string]string{"app": "web", "tier": "front"})
			d := old.DeepCopy()
			tt.mut(d)
			assert.Equal(t, tt.want, review.OverlapMayChange(old, d))
		})
	}
	assert.True(t, review.OverlapMayChange(nil, reviewtest.DeploymentIn("shop", "web", 2, map[string]string{"app": "web"})), "a new Deployment")
}
