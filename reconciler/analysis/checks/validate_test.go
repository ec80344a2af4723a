package checks

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/deployguard/deployguard/reconciler/analysis"
)

// TestCompileLimits: a check past the size limits is refused (by the
// webhook) and reported invalid (by the reconciler, for one stored before
// the limits), naming the field and the limit and never quoting the value.
func TestCompileLimits(t *testing.T) {
	// padded is a query of exactly n characters that parses.
	padded := func(n int) string {
		q := `sum(up{job="`
		return q + strings.Repeat("x", n-len(q)-len(`"})`)) + `"})`
	}
	cond := func(n int) string { return "result[0] < 0.05" + strings.Repeat(" ", n-len("result[0] < 0.05")) }
	many := func(n int) []analysis.Metric {
		out := make([]analysis.Metric, n)
		for i := range out {
			out[i] = metric(fmt.Sprintf("m%d", i), "up")
		}
		return out
	}
	tests := []struct {
		name    string
		metrics []analysis.Metric
		// want is each error as kubectl prints it (""): none.
		want []string
	}{
		{name: "a query of 8192 characters is measured", metrics: []analysis.Metric{metric("rate", padded(MaxQueryLength))}},
		{name: "a query of 8193 characters is refused", metrics: []analysis.Metric{metric("rate", padded(MaxQueryLength+1))},
			want: []string{"spec.metrics[0].query: Too long: may not be more than 8192 characters"}},
		{name: "multi-byte characters count once, as the schema counts them",
			metrics: []analysis.Metric{metric("rate", `sum(up{job="`+strings.Repeat("é", MaxQueryLength-len(`sum(up{job=""})`))+`"})`)}},
		{name: "conditions of 1024 characters are measured",
			metrics: []analysis.Metric{{Name: "rate", Query: "up", SuccessCondition: cond(MaxConditionLength), FailureCondition: cond(MaxConditionLength)}}},
		{name: "conditions of 1025 characters are refused, each at its path",
			metrics: []analysis.Metric{metric("ok", "up"), {Name: "rate", Query: "up", SuccessCondition: cond(MaxConditionLength + 1), FailureCondition: cond(MaxConditionLength + 1)}},
			want: []string{
				"spec.metrics[1].successCondition: Too long: may not be more than 1024 characters",
				"spec.metrics[1].failureCondition: Too long: may not be more than 1024 characters",
			}},
		{name: "a name longer than a DNS label is refused once, without its value",
			metrics: []analysis.Metric{metric(strings.Repeat("a", 64), "up")},
			want:    []string{"spec.metrics[0].name: Too long: may not be more than 63 characters"}},
		{name: "10 metrics are measured", metrics: many(MaxMetrics)},
		{name: "11 metrics are refused", metrics: many(MaxMetrics + 1),
			want: []string{"spec.metrics: Too many: 11: must have at most 10 items"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, compile := range []func() ([]Metric, field.ErrorList){
				func() ([]Metric, field.ErrorList) {
					return CompileCluster(&ClusterDeploymentCheck{ObjectMeta: metav1.ObjectMeta{Name: "platform"}, Spec: ClusterSpec{Spec: Spec{Metrics: tc.metrics}}})
				},
				func() ([]Metric, field.ErrorList) {
					return CompileNamespaced(&DeploymentCheck{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "team"}, Spec: Spec{Metrics: tc.metrics}})
				},
			} {
				ms, errs := compile()
				if len(tc.want) == 0 {
					require.Empty(t, errs)
					assert.Len(t, ms, len(tc.metrics))
					continue
				}
				assert.Empty(t, ms, "an invalid check measures nothing")
				got := make([]string, len(errs))
				for i, e := range errs {
					got[i] = e.Error()
				}
				assert.Equal(t, tc.want, got)
			}
		})
	}
}
