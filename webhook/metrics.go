package webhook

import (
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Metrics counts and times admissions by webhook, operation, result and
// refusal reason.
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
			Help: "Admission requests for Deployments (webhook mutating, validating; verdict for their status writes) and PodDisruptionBudgets (webhook disruption-budget) by webhook, " +
				"operation, result (allowed, patched, denied, error) " +
				"and reason: none when allowed or patched; otherwise what refused it, one of malformed, selector, overlap, strategy, revision-history, " +
				"progress-deadline, finalizers, quarantine, protected, policy, disruption-budget, internal (denials by policy: deployguard_policy_decisions_total).",
		}, []string{"webhook", "operation", "result", "reason"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "deployguard_admission_duration_seconds",
			Help: "Time to admit a Deployment (or, webhook disruption-budget, a PodDisruptionBudget), from decoded request to response, by webhook and operation.",
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

func (m *Metrics) observe(webhook, operation, result, reason string, d time.Duration) {
	if m == nil {
		return
	}
	m.requests.WithLabelValues(webhook, operation, result, reason).Inc()
	m.latency.WithLabelValues(webhook, operation).Observe(d.Seconds())
}

// Refusal reasons: the reason label of deployguard_admission_requests_total
// and the reason key of the refusal's log line. The set is fixed, so that the
// label's cardinality is; webhook/README.md ("Metrics and logs") lists it too.
const (
	// reasonNone: the request was allowed or patched.
	reasonNone = "none"
	// reasonMalformed: not an admission request for an apps/v1 Deployment the
	// guard can read (no request, another kind, no object or oldObject, an
	// object that does not decode); the result is error.
	reasonMalformed = "malformed"
	// reasonInternal: the guard could not decide, so it refused for its own
	// sake: the Deployments to compare selectors with could not be looked up
	// (an index not yet synced), the policies could not read the request.
	reasonInternal = "internal"

	// The checks, each named by the field it reports on; every field error a
	// check makes carries its name as Origin.
	reasonSelector         = "selector"          // spec.selector: empty, unparsable, not selecting the template, not repairable
	reasonOverlap          = "overlap"           // spec.selector: selects another Deployment's pods, or is selected by its selector
	reasonStrategy         = "strategy"          // spec.strategy: every replica down at once
	reasonRevisionHistory  = "revision-history"  // spec.revisionHistoryLimit outside enforced bounds
	reasonProgressDeadline = "progress-deadline" // spec.progressDeadlineSeconds not above minReadySeconds, or outside enforced bounds
	reasonFinalizers       = "finalizers"        // metadata.finalizers and the cleanup annotation that chooses them
	reasonQuarantine       = "quarantine"        // spec.template: a quarantined pod template brought back
	reasonProtected        = "protected"         // DELETE of a Deployment annotated protected
	reasonPolicy           = "policy"            // an enforced Rego policy; which one is the policy engine's metrics'
	// spec.replicas of a Deployment, or a PodDisruptionBudget's rule: the
	// budget allows no eviction of the pods (enforce mode only refuses).
	reasonDisruptionBudget = "disruption-budget"
)

// checkReasons are the reasons a field error's Origin may name.
var checkReasons = []string{
	reasonSelector, reasonOverlap, reasonStrategy, reasonRevisionHistory, reasonProgressDeadline,
	reasonFinalizers, reasonQuarantine, reasonProtected, reasonPolicy, reasonDisruptionBudget,
}

// refusalReason is the reason label of a decision that made errs: none when
// there are none, otherwise the reason of the first, that is of the first check
// that refused in the order the checks run (a request refused by a Go check
// and a policy counts once, as the Go check). A field error says which check
// made it in its Origin; an internal error is the guard's own failure
// whichever check met it, and an error that names no known check is counted
// as internal rather than given a label outside the fixed set.
func refusalReason(errs field.ErrorList) string {
	if len(errs) == 0 {
		return reasonNone
	}
	e := errs[0]
	if e.Type == field.ErrorTypeInternal || !slices.Contains(checkReasons, e.Origin) {
		return reasonInternal
	}
	return e.Origin
}
