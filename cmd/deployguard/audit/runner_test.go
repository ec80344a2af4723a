package audit

import (
	"testing"

	"github.com/stretchr/testify/assert"
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
