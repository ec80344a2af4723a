package analysis

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/expr-lang/expr"
	"github.com/expr-lang/expr/file"
	"github.com/expr-lang/expr/vm"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Phase is the outcome of one measurement or of a whole metric, spelled as
// Argo Rollouts' AnalysisPhase.
type Phase string

// The phases. Pending and Running are never the outcome of one measurement.
const (
	PhasePending      Phase = "Pending"
	PhaseRunning      Phase = "Running"
	PhaseSuccessful   Phase = "Successful"
	PhaseFailed       Phase = "Failed"
	PhaseInconclusive Phase = "Inconclusive"
	PhaseError        Phase = "Error"
)

// Completed says whether the phase is final.
func (p Phase) Completed() bool {
	switch p {
	case PhaseSuccessful, PhaseFailed, PhaseInconclusive, PhaseError:
		return true
	}
	return false
}

// Value is a query result as the conditions see it, shaped as Argo's
// Prometheus provider shapes it (processResponse): a scalar is a float64, an
// instant vector is a []float64 of its samples' values, even with one sample
// or none (so `result[0] < 0.05` from an AnalysisTemplate means the same
// here, and an empty vector makes `result[0]` an Error).
type Value struct {
	scalar   float64
	vector   []float64
	isScalar bool
}

// Scalar is the result of a query that returned a scalar.
func Scalar(v float64) Value { return Value{scalar: v, isScalar: true} }

// Vector is the result of a query that returned an instant vector.
func Vector(samples []float64) Value {
	// Argo always hands a non-nil slice over, so `isNil(result)` is false and
	// `default(result, x)` returns the empty vector; keep it so.
	v := make([]float64, len(samples))
	copy(v, samples)
	return Value{vector: v}
}

func (v Value) any() any {
	if v.isScalar {
		return v.scalar
	}
	if v.vector == nil {
		return nil
	}
	return v.vector
}

// String prints the value as Argo records it in a measurement: "0.5" or
// "[0.5,1]".
func (v Value) String() string {
	if v.isScalar {
		return strconv.FormatFloat(v.scalar, 'g', -1, 64)
	}
	parts := make([]string, len(v.vector))
	for i, s := range v.vector {
		parts[i] = strconv.FormatFloat(s, 'g', -1, 64)
	}
	return "[" + strings.Join(parts, ",") + "]"
}

// Check is a validated Metric with its conditions compiled: compile once when
// the configuration is loaded, evaluate at every measurement.
type Check struct {
	Metric  Metric
	success *vm.Program
	failure *vm.Program
}

// Compile validates the metric and compiles its conditions. The errors are
// against field paths under path.
func Compile(m Metric, path *field.Path) (*Check, field.ErrorList) {
	return compile(m, path)
}

func compile(m Metric, path *field.Path) (*Check, field.ErrorList) {
	errs := validateFields(m, path)
	c := &Check{Metric: m}
	var err error
	if m.SuccessCondition != "" {
		if c.success, err = compileCondition(m.SuccessCondition); err != nil {
			errs = append(errs, field.Invalid(path.Child("successCondition"), m.SuccessCondition, err.Error()))
		}
	}
	if m.FailureCondition != "" {
		if c.failure, err = compileCondition(m.FailureCondition); err != nil {
			errs = append(errs, field.Invalid(path.Child("failureCondition"), m.FailureCondition, err.Error()))
		}
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return c, nil
}

// conditionEnv is what a condition can name, as in Argo's EvalCondition:
// `result` and the helpers asInt, asFloat, isNaN, isInf, isNil and default.
// isNil and default read the measured result, whatever their first argument,
// exactly as Argo's closures do. A struct rather than a map, so that result
// is typed as an interface when compiling: its value is only known when the
// condition runs, a float64 or a []float64.
type conditionEnv struct {
	Result  any                               `expr:"result"`
	AsInt   func(any) (int64, error)          `expr:"asInt"`
	AsFloat func(any) (float64, error)        `expr:"asFloat"`
	IsNaN   func(float64) bool                `expr:"isNaN"`
	IsInf   func(float64) bool                `expr:"isInf"`
	IsNil   func(any) bool                    `expr:"isNil"`
	Default func(_ any, defaultValue any) any `expr:"default"`
}

func newConditionEnv(result any) conditionEnv {
	return conditionEnv{
		Result:  result,
		AsInt:   asInt,
		AsFloat: asFloat,
		IsNaN:   math.IsNaN,
		IsInf:   func(f float64) bool { return math.IsInf(f, 0) },
		IsNil:   func(any) bool { return result == nil },
		Default: func(_ any, def any) any {
			if result == nil {
				return def
			}
			return result
		},
	}
}

func compileCondition(condition string) (*vm.Program, error) {
	p, err := expr.Compile(condition, expr.Env(conditionEnv{}), expr.AsBool())
	if err != nil {
		return nil, unwrapFileError(err)
	}
	return p, nil
}

func unwrapFileError(err error) error {
	var fe *file.Error
	if errors.As(err, &fe) {
		return errors.New(fe.Message)
	}
	return err
}

func evalCondition(p *vm.Program, result any) (bool, error) {
	out, err := expr.Run(p, newConditionEnv(result))
	if err != nil {
		return false, unwrapFileError(err)
	}
	b, ok := out.(bool)
	if !ok {
		return false, fmt.Errorf("condition returned %T, not a bool", out)
	}
	return b, nil
}

// Evaluate judges one measured result, as Argo's EvaluateResult does:
//   - a condition that cannot be evaluated (an index past an empty vector, a
//     type mismatch, a helper given a bad argument) is Error, with the error;
//   - a success condition alone: false is Failed;
//   - a failure condition alone: false is Successful;
//   - both: failure true is Failed (whatever success says), success true is
//     Successful, neither true is Inconclusive.
//
// A metric without conditions never reaches here: Compile refuses it
// (ErrNoCondition).
func (c *Check) Evaluate(result Value) (Phase, error) {
	return Evaluate(result, c)
}

// Evaluate is (*Check).Evaluate as a function.
func Evaluate(result Value, c *Check) (Phase, error) {
	if c == nil || (c.success == nil && c.failure == nil) {
		return PhaseError, errors.New(ErrNoCondition)
	}
	r := result.any()
	var success, failure bool
	var err error
	if c.success != nil {
		if success, err = evalCondition(c.success, r); err != nil {
			return PhaseError, fmt.Errorf("successCondition %q on %s: %w", c.Metric.SuccessCondition, result, err)
		}
	}
	if c.failure != nil {
		if failure, err = evalCondition(c.failure, r); err != nil {
			return PhaseError, fmt.Errorf("failureCondition %q on %s: %w", c.Metric.FailureCondition, result, err)
		}
	}
	switch {
	case c.failure == nil:
		failure = !success
	case c.success == nil:
		success = !failure
	}
	switch {
	case failure:
		return PhaseFailed, nil
	case success:
		return PhaseSuccessful, nil
	default:
		return PhaseInconclusive, nil
	}
}

// asInt and asFloat convert a number or a numeric string, as Argo's helpers
// do; a bad argument is an error (Argo panics, which expr turns into one).
func asInt(in any) (int64, error) {
	switch v := in.(type) {
	case float64:
		return int64(v), nil
	case int:
		return int64(v), nil
	case int64:
		return v, nil
	case string:
		i, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("asInt: %w", err)
		}
		return i, nil
	}
	return 0, fmt.Errorf("asInt() not supported on %T %v", in, in)
}

func asFloat(in any) (float64, error) {
	switch v := in.(type) {
	case float64:
		return v, nil
	case int:
		return float64(v), nil
	case int64:
		return float64(v), nil
	case string:
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, fmt.Errorf("asFloat: %w", err)
		}
		return f, nil
	}
	return 0, fmt.Errorf("asFloat() not supported on %T %v", in, in)
}
