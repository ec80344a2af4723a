package webhook

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics counts and times admissions by webhook, operation and result.
type Metrics struct {
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
}

// NewMetrics creates the admission metrics and registers them on reg (nil: not
// registered, for tests and `deployguard check`).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "deployguard_admission_requests_total",
			Help: "Admission requests for Deployments by webhook (mutating, validating), operation and result (allowed, patched, denied, error).",
		}, []string{"webhook", "operation", "result"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "deployguard_admission_duration_seconds",
			Help: "Time to admit a Deployment, from decoded request to response, by webhook and operation.",
			// Fine below 5 ms, where admissions are, so that a p99 can be read
			// from the buckets; up to the webhooks' 3 s timeout.
			Buckets: []float64{.00005, .0001, .00025, .0005, .00075, .001, .0015, .002, .003, .005, .0075, .01, .025, .05, .1, .25, .5, 1, 3},
		}, []string{"webhook", "operation"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.requests, m.latency} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

func (m *Metrics) observe(webhook, operation, result string, d time.Duration) {
	if m == nil {
		return
	}
	m.requests.WithLabelValues(webhook, operation, result).Inc()
	m.latency.WithLabelValues(webhook, operation).Observe(d.Seconds())
}
