// Package analysis holds the vocabulary of a metric check and its pure
// evaluation, with the semantics of Argo Rollouts' AnalysisTemplate metrics,
// so that a metric copied from an AnalysisTemplate means the same thing here.
//
// It is not wired into the reconciler yet (issue 55): nothing here queries
// Prometheus, keeps time or writes to the API server. A Metric is validated
// and compiled once (Compile), each query result is judged by
// (*Check).Evaluate, and the phases judged so far are turned into the
// metric's verdict by Tally.
package analysis

import (
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// DefaultConsecutiveErrorLimit is Argo Rollouts' default for
// consecutiveErrorLimit (defaults.DefaultConsecutiveErrorLimit = 4): the fifth
// error in a row ends the metric in Error.
const DefaultConsecutiveErrorLimit int32 = 4

// Metric is one check: a Prometheus query and the conditions its result is
// judged by. The field names and JSON keys are those of Argo Rollouts'
// v1alpha1.Metric, so that a metric can be copied from an AnalysisTemplate.
type Metric struct {
	// Name identifies the metric in events, status and logs.
	Name string `json:"name"`
	// Query is the PromQL query, a text/template over the Deployment's
	// namespace, name and new pod-template-hash (package promscope).
	Query string `json:"query"`
	// SuccessCondition is an expr-lang expression over `result`.
	SuccessCondition string `json:"successCondition,omitempty"`
	// FailureCondition is an expr-lang expression over `result`.
	FailureCondition string `json:"failureCondition,omitempty"`
	// Interval between measurements; empty means a single measurement.
	Interval metav1.Duration `json:"interval,omitempty"`
	// InitialDelay is how long the first measurement waits after the
	// measurements start (the new revision's first Ready pod): one scrape
	// interval gives Prometheus the new pods' first samples.
	InitialDelay metav1.Duration `json:"initialDelay,omitempty"`
	// Count is the number of measurements (errors not counted) after which
	// the metric is Successful; nil or 0 with an interval means measure until
	// stopped, nil or 0 without one means one measurement (Argo's
	// Metric.EffectiveCount).
	Count *int32 `json:"count,omitempty"`
	// FailureLimit is how many Failed measurements are tolerated (default 0).
	FailureLimit *int32 `json:"failureLimit,omitempty"`
	// InconclusiveLimit is how many Inconclusive measurements are tolerated
	// (default 0).
	InconclusiveLimit *int32 `json:"inconclusiveLimit,omitempty"`
	// ConsecutiveErrorLimit is how many Error measurements in a row are
	// tolerated (default 4).
	ConsecutiveErrorLimit *int32 `json:"consecutiveErrorLimit,omitempty"`
	// DryRun makes the metric report only: it is measured and judged, but a
	// Failed verdict rolls nothing back.
	DryRun bool `json:"dryRun,omitempty"`
}

// EffectiveCount is the number of counted measurements after which the metric
// completes, and false when it runs until stopped. It matches Argo's
// Metric.EffectiveCount: no count and no interval means one measurement.
func (m Metric) EffectiveCount() (int32, bool) {
	if m.Count == nil || *m.Count == 0 {
		if m.Interval.Duration == 0 {
			return 1, true
		}
		return 0, false
	}
	return *m.Count, true
}

func (m Metric) failureLimit() int32      { return valueOr(m.FailureLimit, 0) }
func (m Metric) inconclusiveLimit() int32 { return valueOr(m.InconclusiveLimit, 0) }
func (m Metric) consecutiveErrorLimit() int32 {
	return valueOr(m.ConsecutiveErrorLimit, DefaultConsecutiveErrorLimit)
}

func valueOr(p *int32, def int32) int32 {
	if p == nil {
		return def
	}
	return *p
}

// ErrNoCondition is the reason a metric with neither condition is refused.
//
// Argo's code and docs disagree about such a metric: EvaluateResult makes
// every measurement Successful ("Always return success unless there is an
// error"), while docs/features/analysis.md ("Inconclusive Runs") says a
// metric with no conditions is how a run becomes Inconclusive. Neither is
// safe to copy: Successful marks a release checked when nothing was checked,
// and Inconclusive never rolls back either. A check that can never fail
// protects nothing, so the guard refuses it when the configuration is loaded
// (reconciler/analysis/README.md, "No condition").
const ErrNoCondition = "at least one of successCondition and failureCondition is required: a metric without conditions can never fail (Argo Rollouts would count every measurement Successful)"

// Validate returns every problem with the metric at once, each against its
// field path under path. It checks the conditions' syntax too (by compiling
// them), so that a bad expression is refused when the configuration is
// loaded, not at the first measurement.
func (m Metric) Validate(path *field.Path) field.ErrorList {
	_, errs := compile(m, path)
	return errs
}

func validateFields(m Metric, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if m.Name == "" {
		errs = append(errs, field.Required(path.Child("name"), "a metric needs a name to be reported by"))
	} else {
		for _, msg := range validation.IsDNS1123Label(m.Name) {
			errs = append(errs, field.Invalid(path.Child("name"), m.Name, msg))
		}
	}
	if m.Query == "" {
		errs = append(errs, field.Required(path.Child("query"), "the PromQL query to measure"))
	}
	if m.SuccessCondition == "" && m.FailureCondition == "" {
		errs = append(errs, field.Required(path.Child("successCondition"), ErrNoCondition))
	}
	if m.InitialDelay.Duration < 0 {
		errs = append(errs, field.Invalid(path.Child("initialDelay"), m.InitialDelay.Duration.String(), "must not be negative"))
	}
	if m.Interval.Duration < 0 {
		errs = append(errs, field.Invalid(path.Child("interval"), m.Interval.Duration.String(), "must not be negative"))
	} else if m.Interval.Duration > 0 && m.Interval.Duration < time.Second {
		errs = append(errs, field.Invalid(path.Child("interval"), m.Interval.Duration.String(), "must be at least 1s: Prometheus scrapes far less often"))
	}
	for _, f := range []struct {
		name string
		v    *int32
	}{
		{"count", m.Count},
		{"failureLimit", m.FailureLimit},
		{"inconclusiveLimit", m.InconclusiveLimit},
		{"consecutiveErrorLimit", m.ConsecutiveErrorLimit},
	} {
		if f.v != nil && *f.v < 0 {
			errs = append(errs, field.Invalid(path.Child(f.name), *f.v, "must not be negative"))
		}
	}
	// Argo's ValidateMetric: "interval must be specified when count > 1",
	// "count must be >= failureLimit", "count must be >= inconclusiveLimit".
	if m.Count != nil && *m.Count > 1 && m.Interval.Duration == 0 {
		errs = append(errs, field.Required(path.Child("interval"), fmt.Sprintf("count %d needs an interval between the measurements", *m.Count)))
	}
	if m.Count != nil && *m.Count > 0 {
		if m.failureLimit() > *m.Count {
			errs = append(errs, field.Invalid(path.Child("failureLimit"), m.failureLimit(), fmt.Sprintf("must not exceed count (%d)", *m.Count)))
		}
		if m.inconclusiveLimit() > *m.Count {
			errs = append(errs, field.Invalid(path.Child("inconclusiveLimit"), m.inconclusiveLimit(), fmt.Sprintf("must not exceed count (%d)", *m.Count)))
		}
	}
	return errs
}

// DeepCopy copies m (its limits are pointers).
func (m Metric) DeepCopy() Metric {
	out := m
	for _, p := range []**int32{&out.Count, &out.FailureLimit, &out.InconclusiveLimit, &out.ConsecutiveErrorLimit} {
		if *p != nil {
			v := **p
			*p = &v
		}
	}
	return out
}
