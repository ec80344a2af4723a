package analysis

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

func TestMetricValidate(t *testing.T) {
	good := Metric{Name: "error-rate", Query: "sum(rate(x[1m]))", SuccessCondition: "result[0] < 0.05", Interval: metav1.Duration{Duration: time.Minute}}
	with := func(f func(*Metric)) Metric { m := good; f(&m); return m }
	cases := []struct {
		name   string
		metric Metric
		want   []string // "type field"
	}{
		{name: "good", metric: good},
		{name: "everything missing at once", metric: Metric{}, want: []string{
			"FieldValueRequired m.name", "FieldValueRequired m.query", "FieldValueRequired m.successCondition"}},
		{name: "name not a DNS label", metric: with(func(m *Metric) { m.Name = "Error_Rate" }), want: []string{"FieldValueInvalid m.name"}},
		{name: "condition does not parse", metric: with(func(m *Metric) { m.SuccessCondition = "result[0] <" }), want: []string{"FieldValueInvalid m.successCondition"}},
		{name: "condition not a bool", metric: with(func(m *Metric) { m.FailureCondition = "1 + 2" }), want: []string{"FieldValueInvalid m.failureCondition"}},
		{name: "unknown helper", metric: with(func(m *Metric) { m.SuccessCondition = "nope(result)" }), want: []string{"FieldValueInvalid m.successCondition"}},
		{name: "negative interval", metric: with(func(m *Metric) { m.Interval.Duration = -time.Second }), want: []string{"FieldValueInvalid m.interval"}},
		{name: "interval under a second", metric: with(func(m *Metric) { m.Interval.Duration = time.Millisecond }), want: []string{"FieldValueInvalid m.interval"}},
		{name: "negative limits", metric: with(func(m *Metric) {
			m.FailureLimit, m.InconclusiveLimit, m.ConsecutiveErrorLimit, m.Count = i32(-1), i32(-1), i32(-1), i32(-1)
		}), want: []string{"FieldValueInvalid m.count", "FieldValueInvalid m.failureLimit", "FieldValueInvalid m.inconclusiveLimit", "FieldValueInvalid m.consecutiveErrorLimit"}},
		{name: "count without interval", metric: with(func(m *Metric) { m.Interval.Duration = 0; m.Count = i32(3) }), want: []string{"FieldValueRequired m.interval"}},
		{name: "limits past count", metric: with(func(m *Metric) { m.Count = i32(2); m.FailureLimit = i32(3); m.InconclusiveLimit = i32(3) }),
			want: []string{"FieldValueInvalid m.failureLimit", "FieldValueInvalid m.inconclusiveLimit"}},
		{name: "limits with count 0 (unbounded) are fine", metric: with(func(m *Metric) { m.Count = i32(0); m.FailureLimit = i32(3) })},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			errs := tc.metric.Validate(field.NewPath("m"))
			got := make([]string, 0, len(errs))
			for _, e := range errs {
				got = append(got, string(e.Type)+" "+e.Field)
			}
			assert.ElementsMatch(t, tc.want, got)
		})
	}
}

func TestValueString(t *testing.T) {
	assert.Equal(t, "0.5", Scalar(0.5).String())
	assert.Equal(t, "[0.5,1]", Vector([]float64{0.5, 1}).String())
	assert.Equal(t, "[]", Vector(nil).String())
}
