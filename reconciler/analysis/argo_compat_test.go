package analysis

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

func i32(v int32) *int32 { return &v }

// The same measurements give the same verdicts as the semantics documented
// in Argo Rollouts' analysis docs (docs/features/analysis.md) and code
// (utils/evaluate/evaluate.go EvaluateResult, analysis/analysis.go
// assessMetricStatus): one table for a measurement, one for the limits.
func TestArgoCompatEvaluate(t *testing.T) {
	nan := math.NaN()
	cases := []struct {
		name    string
		success string
		failure string
		result  Value
		want    Phase
		wantErr string
	}{
		// Argo docs: "result[0] >= 0.95" over a Prometheus vector.
		{name: "success only, true: Successful", success: "result[0] >= 0.95", result: Vector([]float64{0.99}), want: PhaseSuccessful},
		{name: "success only, false: Failed", success: "result[0] >= 0.95", result: Vector([]float64{0.5}), want: PhaseFailed},
		{name: "failure only, true: Failed", failure: "result[0] > 0.05", result: Vector([]float64{0.3}), want: PhaseFailed},
		{name: "failure only, false: Successful", failure: "result[0] > 0.05", result: Vector([]float64{0.01}), want: PhaseSuccessful},
		{name: "both, success true: Successful", success: "result < 0.01", failure: "result > 0.05", result: Scalar(0.001), want: PhaseSuccessful},
		{name: "both, failure true: Failed", success: "result < 0.01", failure: "result > 0.05", result: Scalar(0.3), want: PhaseFailed},
		{name: "both true: Failed wins", success: "result >= 0", failure: "result > 0.05", result: Scalar(0.3), want: PhaseFailed},
		{name: "both set, neither true: Inconclusive", success: "result < 0.01", failure: "result > 0.05", result: Scalar(0.03), want: PhaseInconclusive},
		{name: "scalar result is a float", success: "result == 2", result: Scalar(2), want: PhaseSuccessful},
		{name: "one-sample vector is still a vector", success: "len(result) == 1 && result[0] == 2", result: Vector([]float64{2}), want: PhaseSuccessful},
		{name: "all over a vector", success: "all(result, {# < 1})", result: Vector([]float64{0.1, 0.2, 3}), want: PhaseFailed},
		{name: "empty vector indexed: Error", success: "result[0] >= 0.95", result: Vector(nil), want: PhaseError, wantErr: "out of range"},
		{name: "empty vector measured by len: Inconclusive", success: "len(result) > 0 && result[0] < 0.05", failure: "len(result) > 0 && result[0] >= 0.05", result: Vector(nil), want: PhaseInconclusive},
		{name: "no result at all: Error", success: "result < 1", result: Value{}, want: PhaseError},
		{name: "isNil on no result", success: "!isNil(result)", result: Value{}, want: PhaseFailed},
		{name: "default on no result", success: "default(result, 0) == 0", result: Value{}, want: PhaseSuccessful},
		{name: "default on an empty vector keeps the vector, as in Argo", success: "len(default(result, [1])) == 0", result: Vector(nil), want: PhaseSuccessful},
		{name: "NaN (0/0 rate) guarded by isNaN", success: "!isNaN(result) && result < 0.05", result: Scalar(nan), want: PhaseFailed},
		{name: "NaN compares false: success only is Failed", success: "result < 0.05", result: Scalar(nan), want: PhaseFailed},
		{name: "isInf", failure: "isInf(result)", result: Scalar(math.Inf(1)), want: PhaseFailed},
		{name: "isNaN on a vector: Error", success: "isNaN(result)", result: Vector([]float64{1}), want: PhaseError},
		{name: "asInt and asFloat", success: "asInt(result) == 2 && asFloat('1.5') == 1.5", result: Scalar(2.7), want: PhaseSuccessful},
		{name: "asFloat of junk: Error", success: "asFloat('x') > 0", result: Scalar(1), want: PhaseError, wantErr: "asFloat"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, errs := Compile(Metric{Name: "m", Query: "q", SuccessCondition: tc.success, FailureCondition: tc.failure}, field.NewPath("metric"))
			require.Empty(t, errs)
			got, err := c.Evaluate(tc.result)
			assert.Equal(t, tc.want, got)
			if tc.want == PhaseError {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
			} else {
				assert.NoError(t, err)
			}
		})
	}
}

func TestArgoCompatTally(t *testing.T) {
	const (
		S = PhaseSuccessful
		F = PhaseFailed
		I = PhaseInconclusive
		E = PhaseError
	)
	every := metav1.Duration{Duration: time.Minute}
	cases := []struct {
		name     string
		metric   Metric
		phases   []Phase
		want     Phase
		message  string
		rollback bool
	}{
		{name: "no measurement: Pending", metric: Metric{Interval: every}, want: PhasePending},
		{name: "one measurement, no count, no interval: count is 1", metric: Metric{}, phases: []Phase{S}, want: S, message: "count (1) reached"},
		{name: "interval without count runs until stopped", metric: Metric{Interval: every}, phases: []Phase{S, S, S, S, S, S}, want: PhaseRunning},
		{name: "count reached: Successful", metric: Metric{Interval: every, Count: i32(3)}, phases: []Phase{S, S, S}, want: S},
		{name: "count not reached: Running", metric: Metric{Interval: every, Count: i32(3)}, phases: []Phase{S, S}, want: PhaseRunning},
		{name: "errors are not counted towards count", metric: Metric{Interval: every, Count: i32(3)}, phases: []Phase{S, E, S}, want: PhaseRunning},
		{name: "count 0 with interval runs until stopped", metric: Metric{Interval: every, Count: i32(0)}, phases: []Phase{S, S}, want: PhaseRunning},
		{name: "failureLimit default 0: first failure fails", metric: Metric{Interval: every}, phases: []Phase{S, F}, want: F, message: "failed (1) > failureLimit (0)", rollback: true},
		{name: "failureLimit at its bound: Running", metric: Metric{Interval: every, FailureLimit: i32(2)}, phases: []Phase{F, S, F}, want: PhaseRunning},
		{name: "failureLimit past its bound: Failed", metric: Metric{Interval: every, FailureLimit: i32(2)}, phases: []Phase{F, S, F, F}, want: F, message: "failed (3) > failureLimit (2)", rollback: true},
		{name: "failures within the limit at count: Successful", metric: Metric{Interval: every, Count: i32(4), FailureLimit: i32(2)}, phases: []Phase{F, S, F, S}, want: S},
		{name: "inconclusiveLimit default 0", metric: Metric{Interval: every}, phases: []Phase{I}, want: I, message: "inconclusive (1) > inconclusiveLimit (0)"},
		{name: "inconclusiveLimit at its bound: Running", metric: Metric{Interval: every, InconclusiveLimit: i32(1)}, phases: []Phase{I, S}, want: PhaseRunning},
		{name: "inconclusiveLimit past its bound", metric: Metric{Interval: every, InconclusiveLimit: i32(1)}, phases: []Phase{I, S, I}, want: I, message: "inconclusive (2) > inconclusiveLimit (1)"},
		{name: "consecutiveErrorLimit default 4: four errors Running", metric: Metric{Interval: every}, phases: []Phase{E, E, E, E}, want: PhaseRunning},
		{name: "consecutiveErrorLimit default 4: fifth error is Error", metric: Metric{Interval: every}, phases: []Phase{E, E, E, E, E}, want: E, message: "consecutiveErrors (5) > consecutiveErrorLimit (4)"},
		{name: "a measurement resets consecutive errors", metric: Metric{Interval: every}, phases: []Phase{E, E, E, E, S, E, E, E, E}, want: PhaseRunning},
		{name: "consecutiveErrorLimit 0: first error is Error", metric: Metric{Interval: every, ConsecutiveErrorLimit: i32(0)}, phases: []Phase{E}, want: E},
		{name: "consecutiveErrorLimit at its bound", metric: Metric{Interval: every, ConsecutiveErrorLimit: i32(2)}, phases: []Phase{E, E}, want: PhaseRunning},
		{name: "the first limit passed decides: error before a failure", metric: Metric{Interval: every, FailureLimit: i32(0), ConsecutiveErrorLimit: i32(0)}, phases: []Phase{E, F}, want: E},
		{name: "the first limit passed decides: failure before inconclusive", metric: Metric{Interval: every}, phases: []Phase{F, I}, want: F, rollback: true},
		{name: "the first complete verdict stands", metric: Metric{Interval: every, Count: i32(2)}, phases: []Phase{S, S, F}, want: S},
		{name: "dry run: Failed reported, no rollback", metric: Metric{Interval: every, DryRun: true}, phases: []Phase{F}, want: F, message: "failed (1) > failureLimit (0)"},
		{name: "dry run: Successful stays Successful", metric: Metric{DryRun: true}, phases: []Phase{S}, want: S},
		{name: "inconclusive never rolls back", metric: Metric{}, phases: []Phase{I}, want: I},
		{name: "error never rolls back", metric: Metric{ConsecutiveErrorLimit: i32(0)}, phases: []Phase{E}, want: E},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := Tally(tc.metric, tc.phases)
			assert.Equal(t, tc.want, v.Phase)
			if tc.message != "" {
				assert.Equal(t, tc.message, v.Message)
			}
			assert.Equal(t, tc.rollback, v.RollsBack())
			assert.Equal(t, tc.metric.DryRun, v.DryRun)
		})
	}
}

// When several limits are past in one assessment (counters that were not
// built one measurement at a time), the last of Argo's assignments stands:
// Error over Inconclusive over Failed.
func TestArgoCompatLimitPrecedence(t *testing.T) {
	cases := []struct {
		name   string
		counts Counts
		want   Phase
	}{
		{name: "failed alone", counts: Counts{Count: 1, Failed: 1}, want: PhaseFailed},
		{name: "inconclusive over failed", counts: Counts{Count: 2, Failed: 1, Inconclusive: 1}, want: PhaseInconclusive},
		{name: "error over inconclusive and failed", counts: Counts{Count: 2, Failed: 1, Inconclusive: 1, Error: 5, ConsecutiveError: 5}, want: PhaseError},
		{name: "none past: count reached", counts: Counts{Count: 1, Successful: 1}, want: PhaseSuccessful},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, assess(Metric{}, tc.counts).Phase)
		})
	}
}

// Argo's code counts a metric without conditions Successful whatever it
// measures; the guard refuses it (ErrNoCondition).
func TestArgoCompatNoCondition(t *testing.T) {
	_, errs := Compile(Metric{Name: "m", Query: "up"}, field.NewPath("spec", "metrics").Index(0))
	require.Len(t, errs, 1)
	assert.Equal(t, "spec.metrics[0].successCondition", errs[0].Field)
	assert.Equal(t, field.ErrorTypeRequired, errs[0].Type)
	assert.Contains(t, errs[0].Detail, "can never fail")

	phase, err := Evaluate(Scalar(1), &Check{Metric: Metric{Name: "m"}})
	assert.Equal(t, PhaseError, phase)
	assert.Error(t, err)
}
