package webhook

import (
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/deployguard/deployguard/reconciler/collectors"
	"github.com/deployguard/deployguard/webhook/origin"
	"github.com/deployguard/deployguard/webhook/review"
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
	r := collectors.NewRegistration(reg, "admission metrics")
	m := &Metrics{
		requests: r.CounterVec("deployguard_admission_requests_total",
			"Admission requests for Deployments (webhook mutating, validating; verdict for their status writes) and PodDisruptionBudgets (webhook disruption-budget) by webhook, "+
				"operation (CREATE, UPDATE, DELETE, CONNECT; unknown for any other), result (allowed, patched, denied, error) "+
				"and reason: none when allowed or patched; otherwise what refused it, one of malformed, selector, overlap, strategy, revision-history, "+
				"progress-deadline, finalizers, size, quarantine, protected, policy, disruption-budget, internal (denials by policy: deployguard_policy_decisions_total).",
			"webhook", "operation", "result", "reason"),
		// Fine below 5 ms, where admissions are, so that a p99 can be read
		// from the buckets; up to the webhooks' 3 s timeout.
		latency: r.HistogramVec("deployguard_admission_duration_seconds",
			"Time to admit a Deployment (or, webhook disruption-budget, a PodDisruptionBudget), from decoded request to response, by webhook and operation (as deployguard_admission_requests_total's).",
			[]float64{.00005, .0001, .00025, .0005, .00075, .001, .0015, .002, .003, .005, .0075, .01, .025, .05, .1, .25, .5, 1, 3},
			"webhook", "operation"),
	}
	if err := r.Err(); err != nil {
		return nil, err
	}
	return m, nil
}

// observe counts and times one admission. Every label value is one of a
// fixed set, whatever the request held: each distinct value is a series
// kept until the process ends, and whoever reaches the port chooses the
// request's strings.
func (m *Metrics) observe(webhook string, operation admissionv1.Operation, result, reason string, d time.Duration) {
	if m == nil {
		return
	}
	op := operationLabel(operation)
	m.requests.WithLabelValues(webhook, op, result, reasonLabel(reason)).Inc()
	m.latency.WithLabelValues(webhook, op).Observe(d.Seconds())
}

// operationUnknown is the operation label of a request whose operation is
// none the API server sends.
const operationUnknown = "unknown"

// operationLabel is op when the API server may send it, and otherwise
// operationUnknown.
func operationLabel(op admissionv1.Operation) string {
	switch op {
	case admissionv1.Create, admissionv1.Update, admissionv1.Delete, admissionv1.Connect:
		return string(op)
	}
	return operationUnknown
}

// reasonLabel is r when it is one of the reasons (reasonNone,
// reasonMalformed, a check's name), and otherwise origin.Internal: a reason
// outside the set would be the guard's own mistake.
func reasonLabel(r string) string {
	if r == reasonNone || r == reasonMalformed || slices.Contains(origin.Checks(), r) {
		return r
	}
	return origin.Internal
}

// The reason label of deployguard_admission_requests_total and the reason
// key of a refusal's log line: one of these, or the name of the check that
// refused (review.RefusedBy). The set is fixed, so that the label's
// cardinality is; webhook/README.md ("Metrics and logs") lists it too.
const (
	// reasonNone: the request was allowed or patched.
	reasonNone = "none"
	// reasonMalformed: not an admission request for an apps/v1 Deployment the
	// guard can read (no request, another kind, no object or oldObject, an
	// object that does not decode); the result is error.
	reasonMalformed = "malformed"
)

// refusalReason is the reason label of a decision that made errs: none when
// there are none, otherwise the check that refused first (RefusedBy).
func refusalReason(errs field.ErrorList) string {
	if len(errs) == 0 {
		return reasonNone
	}
	return review.RefusedBy(errs)
}

// RegisterUnjudgedBudgets registers deployguard_disruption_budgets_unjudged,
// read from budgets at each scrape: a budget whose selector the guard does
// not keep (review.MaxBudgetSelectorTerms) is judged by no check, and this
// is where an operator sees how many there are, whenever they were written.
func RegisterUnjudgedBudgets(reg prometheus.Registerer, budgets *review.BudgetIndex) error {
	unjudgedFrom.Store(budgets)
	r := collectors.NewRegistration(reg, "disruption budget metrics")
	collectors.Add(r, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "deployguard_disruption_budgets_unjudged",
		Help: fmt.Sprintf("PodDisruptionBudgets whose selector has more than %d terms (match labels, expressions and their values): "+
			"the guard keeps no such selector in memory, and the drain check judges none of them. Every replica counts the whole cluster: read max(), not sum().", review.MaxBudgetSelectorTerms),
	}, func() float64 {
		if x := unjudgedFrom.Load(); x != nil {
			return float64(x.Unjudged())
		}
		return 0
	}))
	return r.Err()
}

// unjudgedFrom is the index the gauge reads: the one registered last, as a
// guard restarted in one process (a test) counts into the series it found.
var unjudgedFrom atomic.Pointer[review.BudgetIndex]
