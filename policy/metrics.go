package policy

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Results counted in deployguard_policy_decisions_total, one per policy per
// evaluated request: the strongest thing the policy did to it.
const (
	ResultAllow  = "allow"  // no finding
	ResultDeny   = "deny"   // refused the request
	ResultWarn   = "warn"   // added warnings only
	ResultAudit  = "audit"  // audit-mode findings only
	ResultError  = "error"  // evaluation failed or timed out
	ResultExempt = "exempt" // request exempt; counted once under policy "*"
)

// exemptPolicyLabel is the policy label of exempt requests, which skip every
// policy.
const exemptPolicyLabel = "*"

// metrics are one Engine's collectors; the caller registers them, so tests can
// build many Engines and cmd decides the registry.
type metrics struct {
	decisions  *prometheus.CounterVec
	latency    *prometheus.HistogramVec
	loadErrors *prometheus.CounterVec
	active     prometheus.Gauge
	exempt     prometheus.Counter // decisions{policy="*",result="exempt"}
}

func newMetrics() *metrics {
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "deployguard_policy_decisions_total",
			Help: "Policy evaluations by policy and result (allow, deny, warn, audit, error; exempt requests under policy \"*\").",
		}, []string{"policy", "result"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "deployguard_policy_evaluation_duration_seconds",
			Help: "Time to evaluate one policy on one request.",
			// Evaluation should take well under a millisecond; the top buckets
			// catch rules that approach the time budget.
			Buckets: []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .1, .25, 1},
		}, []string{"policy"}),
		loadErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "deployguard_policy_load_errors_total",
			Help: "Policy set loads refused because of a source, by source (file or configmap/<ns>/<name>/<key>).",
		}, []string{"source"}),
		active: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "deployguard_policy_active",
			Help: "Policies evaluated on every request in the active set.",
		}),
	}
	m.exempt = m.decisions.WithLabelValues(exemptPolicyLabel, ResultExempt)
	return m
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.decisions, m.latency, m.loadErrors, m.active}
}

// policyMeter holds one policy's series, resolved when its set is prepared so
// that evaluation does no label lookups.
type policyMeter struct {
	results map[string]prometheus.Counter
	latency prometheus.Observer
}

func (m *metrics) forPolicy(name string) policyMeter {
	results := map[string]prometheus.Counter{}
	for _, r := range []string{ResultAllow, ResultDeny, ResultWarn, ResultAudit, ResultError} {
		results[r] = m.decisions.WithLabelValues(name, r)
	}
	return policyMeter{results: results, latency: m.latency.WithLabelValues(name)}
}

// countLoadErrors counts one failed load per source with errors, however
// many errors it has.
func (m *metrics) countLoadErrors(errs []SourceError) {
	for _, source := range (&LoadError{Errors: errs}).Sources() {
		m.loadErrors.WithLabelValues(source).Inc()
	}
}
