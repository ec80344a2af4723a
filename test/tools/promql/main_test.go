package main

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func write(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
	return p
}

const rule = `apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata: {name: r}
spec:
  groups:
    - name: g
      rules:
        - alert: A
          expr: %s
          annotations:
            summary: %s
`

// The checks refuse what Prometheus or Grafana would refuse, and report the
// metrics and matched labels of what they accept.
func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name      string
		rule      string
		dashboard string
		wantErr   string
		want      []Selector
	}{
		{name: "a valid rule", rule: `'sum by (webhook) (rate(a_total{result="error"}[5m])) > 0'`,
			want: []Selector{{Metric: "a_total", Labels: []string{"result"}}}},
		{name: "an expression that does not parse", rule: `'sum by (webhook (rate(a_total[5m]))'`, wantErr: "could not parse expression"},
		{name: "an annotation template that does not parse", rule: `'a_total > 0'`, wantErr: "template",
			dashboard: ""},
		{name: "a dashboard query with Grafana's interval", dashboard: `{"panels": [{"title": "p", "targets": [{"expr": "rate(b_total{job=\"x\"}[$__rate_interval])"}]}]}`,
			want: []Selector{{Metric: "b_total", Labels: []string{"job"}}}},
		{name: "a collapsed row's panels", dashboard: `{"panels": [{"type": "row", "panels": [{"title": "p", "targets": [{"expr": "c"}]}]}]}`,
			want: []Selector{{Metric: "c"}}},
		{name: "a dashboard variable it cannot know", dashboard: `{"panels": [{"title": "p", "targets": [{"expr": "rate(b_total{job=\"$job\"}[5m])"}]}]}`, wantErr: "unknown variable $job"},
		{name: "a dashboard query that does not parse", dashboard: `{"panels": [{"title": "p", "targets": [{"expr": "rate(b_total[5m]"}]}]}`, wantErr: "panel \"p\""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var rules, dashboards []string
			if tc.rule != "" {
				summary := "'{{ $labels.webhook }} fails'"
				if tc.name == "an annotation template that does not parse" {
					summary = "'{{ $labels.webhook '"
				}
				rules = append(rules, write(t, "rule.yaml", fmt.Sprintf(rule, tc.rule, summary)))
			}
			if tc.dashboard != "" {
				dashboards = append(dashboards, write(t, "dashboard.json", tc.dashboard))
			}
			qs, err := check(rules, dashboards)
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.Len(t, qs, 1)
			assert.Equal(t, tc.want, qs[0].Selectors)
		})
	}
}
