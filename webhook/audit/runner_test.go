package audit

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/webhook/review"
)

// TestEntryReplace: refreshing some policies of a Deployment's entry keeps
// the others' results and pass counts as they were.
func TestEntryReplace(t *testing.T) {
	e := newEntry([]Result{
		{Policy: PolicySpec, Rule: "strategy", Result: ResultPass},
		{Policy: "deployguard.team", Rule: "deny", Result: ResultFail, Message: "needs a team"},
		{Policy: "deployguard.owner", Rule: "deny", Result: ResultPass},
		{Policy: "deployguard.probes", Rule: "warn", Result: ResultWarn, Message: "no readiness probe"},
	})
	drop := map[string]bool{"deployguard.team": true, "deployguard.owner": true}
	got := e.replace(func(p string) bool { return drop[p] }, []Result{
		{Policy: "deployguard.team", Rule: "deny", Result: ResultPass},
	})
	assert.Equal(t, map[string]int{PolicySpec: 1, "deployguard.team": 1}, got.passes, "the removed policy's pass is gone, the refreshed one counted")
	assert.Equal(t, []Result{{Policy: "deployguard.probes", Rule: "warn", Result: ResultWarn, Message: "no readiness probe"}}, got.results)
	assert.Len(t, e.results, 2, "the old entry is left alone")
}

// TestOverlapping: a change of a Deployment marks for a new audit the
// Deployments it overlaps, and only those: their results name it.
func TestOverlapping(t *testing.T) {
	web := sound()
	canary := selecting("web-canary", &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web", "track": "canary"}},
		map[string]string{"app": "web", "track": "canary"})
	api := selecting("api", &metav1.LabelSelector{MatchLabels: map[string]string{"app": "api"}}, map[string]string{"app": "api"})
	synced := true
	idx := review.NewOverlapIndex(func() bool { return synced })
	for _, d := range []*appsv1.Deployment{web, canary, api} {
		idx.Set(d)
	}
	r := &Runner{Evaluator: &Evaluator{Overlaps: idx}}
	ctx := context.Background()

	assert.Equal(t, []client.ObjectKey{{Namespace: "shop", Name: "web-canary"}}, r.overlapping(ctx, web))
	assert.Equal(t, []client.ObjectKey{{Namespace: "shop", Name: "web"}}, r.overlapping(ctx, canary))
	assert.Empty(t, r.overlapping(ctx, api))
	// Deleted from the index already, as when the index's handler ran first:
	// its own state still finds whom it overlapped.
	idx.Delete("shop", "web-canary")
	assert.Equal(t, []client.ObjectKey{{Namespace: "shop", Name: "web"}}, r.overlapping(ctx, canary))

	for i := range maxOverlapMarks + 10 {
		idx.Set(selecting(fmt.Sprintf("web-%d", i), &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web", "n": strconv.Itoa(i)}},
			map[string]string{"app": "web", "n": strconv.Itoa(i)}))
	}
	assert.Len(t, r.overlapping(ctx, web), maxOverlapMarks, "bounded")

	synced = false
	assert.Empty(t, r.overlapping(ctx, web), "nothing before the index has synced")
	assert.Empty(t, (&Runner{Evaluator: &Evaluator{}}).overlapping(ctx, web), "nothing without an index")
}
