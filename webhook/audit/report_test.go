package audit

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"
)

// TestReportSizeBound: a namespace of 5,000 Deployments, each failing every
// policy with the longest names and messages the guard lets through, still
// gives a report far under the API server's 1.5 MiB object limit, and its
// summary still counts every result.
func TestReportSizeBound(t *testing.T) {
	long := func(c byte, n int) string { return strings.Repeat(string(c), n) }
	var results []Result
	for i := range 5000 {
		res := Resource{Namespace: long('n', 63), Name: fmt.Sprintf("%s-%05d", long('d', 247), i), UID: types.UID(long('u', 36))}
		for p := range 4 {
			results = append(results,
				Result{Policy: fmt.Sprintf("deployguard.%s%d", long('p', 300), p), Rule: long('r', 300), Result: ResultFail,
					Message: long('m', 10_000), Field: long('f', 1000), Severity: "critical", Category: long('c', 300), Resource: res},
				Result{Policy: "deployguard.ok", Rule: "deny", Result: ResultPass, Resource: res})
		}
	}
	c := Summarize(results)
	assert.Equal(t, Summary{Pass: 20_000, Fail: 20_000}, c.Summary)
	assert.Len(t, c.Results, MaxResults)
	assert.Equal(t, 20_000-MaxResults, c.Omitted)
	for _, format := range []string{FormatPolicyReport, FormatOpenReports} {
		u, err := Build(format, long('n', 63), c, nil, time.Unix(1_700_000_000, 0))
		require.NoError(t, err)
		b, err := json.Marshal(u.Object)
		require.NoError(t, err)
		t.Logf("%s: %d bytes for %d listed results", format, len(b), len(c.Results))
		assert.Less(t, len(b), 1<<20, "a report must stay under 1 MiB")
	}
}

func TestSummarizeListsNonPassInOrder(t *testing.T) {
	res := func(n string) Resource { return Resource{Namespace: "ns", Name: n, UID: types.UID("uid-" + n)} }
	c := Summarize([]Result{
		{Policy: "b", Rule: "deny", Result: ResultWarn, Resource: res("x")},
		{Policy: "a", Rule: "deny", Result: ResultPass, Resource: res("x")},
		{Policy: "b", Rule: "deny", Result: ResultFail, Resource: res("y")},
		{Policy: "a", Rule: "deny", Result: ResultFail, Resource: res("z")},
		{Policy: "a", Rule: "evaluation", Result: ResultError, Resource: res("w")},
		{Policy: "a", Rule: "exempt", Result: ResultSkip, Resource: res("v")},
	})
	assert.Equal(t, Summary{Pass: 1, Fail: 2, Warn: 1, Error: 1, Skip: 1}, c.Summary)
	var got []string
	for _, r := range c.Results {
		got = append(got, r.Result+" "+r.Policy+" "+r.Resource.Name)
	}
	assert.Equal(t, []string{"fail a z", "fail b y", "error a w", "warn b x", "skip a v"}, got)
}

// TestSameContent: a report is written again only when what it says changes,
// not when only its timestamps would.
func TestSameContent(t *testing.T) {
	r := Result{Policy: "deployguard.images", Rule: "deny", Result: ResultFail, Message: "m", Field: "spec.x", Severity: "medium",
		Resource: Resource{Namespace: "ns", Name: "web", UID: "u1"}}
	c := Summarize([]Result{r, {Policy: "p", Result: ResultPass}})
	stored, err := Build(FormatPolicyReport, "ns", c, nil, time.Unix(100, 0))
	require.NoError(t, err)

	tests := []struct {
		name   string
		change func(Result) []Result
		same   bool
	}{
		{"unchanged", func(r Result) []Result { return []Result{r, {Policy: "p", Result: ResultPass}} }, true},
		{"fixed", func(r Result) []Result { r.Result = ResultPass; return []Result{r, {Policy: "p", Result: ResultPass}} }, false},
		{"other message", func(r Result) []Result { r.Message = "n"; return []Result{r, {Policy: "p", Result: ResultPass}} }, false},
		{"deleted", func(Result) []Result { return []Result{{Policy: "p", Result: ResultPass}} }, false},
		{"one more pass", func(r Result) []Result {
			return []Result{r, {Policy: "p", Result: ResultPass}, {Policy: "q", Result: ResultPass}}
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.same, SameContent(stored, Summarize(tt.change(r))))
		})
	}

	// A result that stays keeps the time it was first seen.
	again, err := Build(FormatPolicyReport, "ns", c, Timestamps(stored), time.Unix(999, 0))
	require.NoError(t, err)
	assert.Equal(t, time.Unix(100, 0), Parse(again).Results[0].Since)
	assert.Equal(t, r, Parse(again).Results[0].Result)
}

func TestTruncateKeepsUTF8(t *testing.T) {
	s := truncate(strings.Repeat("é", 400), 101)
	assert.LessOrEqual(t, len(s), 101)
	assert.True(t, strings.HasSuffix(s, "…"))
	assert.Equal(t, "short", truncate("short", 10))
}
