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
			Name:    "deployguard_admission_duration_seconds",
			Help:    "Time to admit a Deployment, from decoded request to response, by webhook and operation.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1},
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
