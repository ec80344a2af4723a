package audit

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/deployguard/deployguard/reconciler/collectors"
)

// Metrics are the audit's Prometheus metrics.
type Metrics struct {
	results         *prometheus.GaugeVec
	duration        *prometheus.HistogramVec
	writes          prometheus.Counter
	reportsDisabled prometheus.Gauge
}

// NewMetrics registers the audit's metrics with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	r := collectors.NewRegistration(reg, "audit metrics")
	m := &Metrics{
		results: r.GaugeVec("deployguard_audit_results",
			"Results of the last audit of every guarded Deployment, by policy and result (pass, fail, warn, error, skip).",
			"policy", "result"),
		duration: r.HistogramVec("deployguard_audit_pass_duration_seconds",
			"Duration of an audit pass, rate limit included; scope is full (every Deployment, every check), policies (the policies a new policy set changed, on every Deployment) or partial (Deployments that changed).",
			prometheus.ExponentialBuckets(0.01, 4, 10), "scope"),
		writes: r.Counter("deployguard_audit_report_writes_total",
			"Report creations, updates and deletions; a report is written only when its content changed."),
		reportsDisabled: r.Gauge("deployguard_audit_reports_disabled",
			"1 when the report CRD is missing and the audit writes no reports."),
	}
	if err := r.Err(); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *Metrics) countWrite() {
	if m != nil {
		m.writes.Inc()
	}
}

// observePass is called by the one audit goroutine only, with every
// Deployment's last results.
func (m *Metrics) observePass(d time.Duration, scope string, known map[string]map[string]entry) {
	m.duration.WithLabelValues(scope).Observe(d.Seconds())
	total := map[[2]string]int{}
	for _, byName := range known {
		for _, e := range byName {
			for _, r := range e.results {
				total[[2]string{r.Policy, r.Result}]++
			}
			for p, n := range e.passes {
				total[[2]string{p, ResultPass}] += n
			}
		}
	}
	m.results.Reset()
	for k, v := range total {
		m.results.WithLabelValues(k[0], k[1]).Set(float64(v))
	}
}
