package prom

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/deployguard/deployguard/reconciler/analysis"
)

// MaxSamples bounds the samples of a vector: a check's query aggregates
// (`sum(rate(…))`); thousands of series mean a query that forgot to.
const MaxSamples = 1000

// envelope is the part of Prometheus's HTTP API answer the client reads.
type envelope struct {
	Status    string `json:"status"`
	ErrorType string `json:"errorType"`
	Error     string `json:"error"`
	Data      struct {
		ResultType string          `json:"resultType"`
		Result     json.RawMessage `json:"result"`
	} `json:"data"`
}

// sample is one element of a vector; its labels are not decoded (a Value
// holds the values only, in result order).
type sample struct {
	Value     []json.RawMessage `json:"value"`
	Histogram json.RawMessage   `json:"histogram"`
}

// apiError reads a body as a Prometheus API error; ok is false when it is
// not one (not JSON, or not status "error").
func apiError(body []byte) (e envelope, ok bool) {
	if err := json.Unmarshal(body, &e); err != nil {
		return e, false
	}
	return e, e.Status == "error" && (e.ErrorType != "" || e.Error != "")
}

// decode turns a 2xx body into a Value. The errors never quote the body but
// for a Prometheus API error's text, cut at 256 bytes.
func decode(body []byte) (analysis.Value, error) {
	var e envelope
	if err := json.Unmarshal(body, &e); err != nil {
		return analysis.Value{}, &Error{Kind: KindDecode, Msg: "Prometheus's answer is not its API's JSON: " + jsonProblem(err)}
	}
	switch e.Status {
	case "success":
	case "error":
		return analysis.Value{}, newAPIError(0, e)
	default:
		return analysis.Value{}, &Error{Kind: KindDecode, Msg: fmt.Sprintf("Prometheus's answer has status %q, want \"success\" or \"error\"", cut(e.Status, 32))}
	}
	switch e.Data.ResultType {
	case "scalar":
		v, err := pair(e.Data.Result)
		if err != nil {
			return analysis.Value{}, &Error{Kind: KindDecode, Msg: "Prometheus's scalar: " + err.Error()}
		}
		return analysis.Scalar(v), nil
	case "vector":
		return decodeVector(e.Data.Result)
	case "matrix":
		return analysis.Value{}, &Error{Kind: KindDecode, Msg: "the query returned a range vector (matrix); it must return a scalar or an instant vector: wrap the range selector in a function such as rate() or avg_over_time()"}
	case "string":
		return analysis.Value{}, &Error{Kind: KindDecode, Msg: "the query returned a string; it must return a scalar or an instant vector"}
	default:
		return analysis.Value{}, &Error{Kind: KindDecode, Msg: fmt.Sprintf("Prometheus's answer has resultType %q; the query must return a scalar or an instant vector", cut(e.Data.ResultType, 32))}
	}
}

func decodeVector(raw json.RawMessage) (analysis.Value, error) {
	var samples []json.RawMessage
	if err := json.Unmarshal(raw, &samples); err != nil {
		return analysis.Value{}, &Error{Kind: KindDecode, Msg: "Prometheus's vector is not a list: " + jsonProblem(err)}
	}
	if len(samples) > MaxSamples {
		return analysis.Value{}, &Error{Kind: KindDecode, Msg: fmt.Sprintf("the query returned %d samples, over the %d a check may read: aggregate it (sum, max, … by the labels you need)", len(samples), MaxSamples)}
	}
	values := make([]float64, 0, len(samples))
	for i, r := range samples {
		var s sample
		if err := json.Unmarshal(r, &s); err != nil {
			return analysis.Value{}, &Error{Kind: KindDecode, Msg: fmt.Sprintf("Prometheus's sample %d: %s", i, jsonProblem(err))}
		}
		if s.Value == nil && s.Histogram != nil {
			return analysis.Value{}, &Error{Kind: KindDecode, Msg: fmt.Sprintf("sample %d is a native histogram; the query must return float samples: use histogram_quantile, histogram_count or histogram_sum", i)}
		}
		v, err := pairValues(s.Value)
		if err != nil {
			return analysis.Value{}, &Error{Kind: KindDecode, Msg: fmt.Sprintf("Prometheus's sample %d: %s", i, err)}
		}
		values = append(values, v)
	}
	return analysis.Vector(values), nil
}

// pair reads [<unix time>, "<value>"], Prometheus's encoding of one sample.
func pair(raw json.RawMessage) (float64, error) {
	var p []json.RawMessage
	if err := json.Unmarshal(raw, &p); err != nil {
		return 0, fmt.Errorf("not a [time, value] pair: %s", jsonProblem(err))
	}
	return pairValues(p)
}

func pairValues(p []json.RawMessage) (float64, error) {
	if len(p) != 2 {
		return 0, fmt.Errorf("%d elements, want [time, value]", len(p))
	}
	var s string
	if err := json.Unmarshal(p[1], &s); err != nil {
		return 0, fmt.Errorf("the value is not a string: %s", jsonProblem(err))
	}
	// ParseFloat reads "NaN", "+Inf" and "-Inf" as Prometheus writes them.
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("the value %q is not a number", cut(s, 32))
	}
	return v, nil
}

// jsonProblem says what is wrong without quoting the body: a syntax error's
// offset, or a type mismatch's types.
func jsonProblem(err error) string {
	if e, ok := errors.AsType[*json.SyntaxError](err); ok {
		return fmt.Sprintf("invalid JSON at byte %d", e.Offset)
	}
	if e, ok := errors.AsType[*json.UnmarshalTypeError](err); ok {
		return fmt.Sprintf("a JSON %s where a %s belongs", e.Value, e.Type)
	}
	return "invalid JSON"
}

// newAPIError is a Prometheus API error: its errorType and its error text,
// cut. status is the HTTP status code, 0 when it was a 2xx.
func newAPIError(status int, e envelope) *Error {
	msg := "Prometheus refused the query"
	if status != 0 {
		msg += fmt.Sprintf(" (HTTP %d)", status)
	}
	msg += fmt.Sprintf(": %s: %s", cut(e.ErrorType, 32), cut(e.Error, maxAPIErrorBytes))
	return &Error{Kind: KindAPI, Msg: msg}
}
