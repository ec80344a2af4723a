package policy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/open-policy-agent/opa/v1/topdown"
)

// errNoInput stands in for an evaluation when the caller passed no Input.
var errNoInput = errors.New("no input: the request could not be converted for policies")

// Evaluate runs every enabled policy of the active set on in (on a DELETE,
// every one that can tell a DELETE: PolicyInfo.Deletes) and returns the
// decision. Each policy has Options.EvalTimeout; one that errors or runs out
// of time becomes a finding under Options.FailureMode, and the others still
// decide. Evaluate never blocks on a Load.
func (e *Engine) Evaluate(ctx context.Context, in *Input) Decision {
	return e.evaluate(ctx, e.active.Load(), in, nil)
}

// EvaluateRequest converts r and evaluates it, with one policy set for both:
// the input leaves out what no policy of that set reads (input.oldObject,
// unless a policy reads it). A request that cannot be converted is an error
// for the caller to decide about.
func (e *Engine) EvaluateRequest(ctx context.Context, r Request) (Decision, error) {
	return e.Active().EvaluateRequest(ctx, r, nil)
}

// evaluate runs the set's policies that only selects (all when nil) on in.
func (e *Engine) evaluate(ctx context.Context, set *preparedSet, in *Input, only func(string) bool) Decision {
	if in != nil {
		if reason, ok := exemption(e.opts.Exempt, in.req); ok {
			e.metrics.exempt.Inc()
			return Decision{Exempt: true, ExemptReason: reason}
		}
	}
	// One watch of the caller's context for every policy of the request,
	// not one per policy.
	var abandoned atomic.Bool
	defer context.AfterFunc(ctx, func() { abandoned.Store(true) })()
	// A DELETE has no input.object: only the policies that can tell one
	// judge it (judgesDelete).
	deletion := in != nil && in.req.Operation == opDelete
	var d Decision
	for i := range set.policies {
		p := &set.policies[i]
		if only != nil && !only(p.name) || deletion && !p.deletes {
			continue
		}
		start := time.Now()
		var out outcome
		if in == nil {
			out = outcome{err: errNoInput}
		} else {
			out = p.evaluate(ctx, set.store, in.value, e.opts.EvalTimeout, &abandoned)
		}
		p.meter.latency.Observe(time.Since(start).Seconds())
		v := judge(p.name, p.mode, out, e.opts.FailureMode)
		p.meter.results[v.result].Inc()
		d.Denied = append(d.Denied, v.denied...)
		d.Warnings = append(d.Warnings, v.warnings...)
		d.Audited = append(d.Audited, v.audited...)
	}
	return d
}

// outcome is what one policy's query produced.
type outcome struct {
	deny, warn []any // elements of the deny and warn sets
	err        error
}

// halt stops one policy's evaluation (topdown.Cancel) when its budget runs
// out or the caller gives up. OPA checks it at every step, so it only loads
// two flags; OPA's own cancellation of a query would watch the context with
// a goroutine per evaluation instead.
type halt struct {
	abandoned *atomic.Bool
	over      atomic.Bool
}

// Cancel is the budget's: it counts only if the caller has not given up
// first, so that the failure names what stopped the policy first.
func (h *halt) Cancel() {
	if !h.abandoned.Load() {
		h.over.Store(true)
	}
}

func (h *halt) Cancelled() bool { return h.over.Load() || h.abandoned.Load() }

// evaluate runs p's query on input, as OPA's rego package evaluates a
// prepared query (rule indexing, early exit, a transaction on the set's
// store), without what the guard does not use: metrics, tracing and the
// conversion of every binding.
func (p *preparedPolicy) evaluate(ctx context.Context, store storage.Store, input ast.Value, budget time.Duration, abandoned *atomic.Bool) outcome {
	// OPA may finish a short query before it notices cancellation; decide
	// the same way every time once the caller has given up.
	if cause := context.Cause(ctx); cause != nil {
		return outcome{err: fmt.Errorf("the request was abandoned: %w", cause)}
	}
	h := &halt{abandoned: abandoned}
	timer := time.AfterFunc(budget, h.Cancel)
	defer timer.Stop()
	txn, err := store.NewTransaction(ctx)
	if err != nil {
		return outcome{err: err}
	}
	defer store.Abort(ctx, txn)
	q := topdown.NewQuery(p.query.body).
		WithQueryCompiler(p.query.queryCompiler).
		WithCompiler(p.query.compiler).
		WithStore(store).
		WithTransaction(txn).
		WithIndexing(true).
		WithEarlyExit(true).
		WithInput(ast.NewTerm(input)).
		WithCancel(h)
	var out outcome
	results := 0
	err = q.Iter(ctx, func(qr topdown.QueryResult) error {
		results++
		for v, t := range qr {
			var dst *[]any
			switch p.query.names[v] {
			case ruleDeny:
				dst = &out.deny
			case ruleWarn:
				dst = &out.warn
			default:
				continue
			}
			x, err := ast.JSON(t.Value)
			if err != nil {
				return err
			}
			*dst, _ = x.([]any)
		}
		return nil
	})
	if err != nil {
		// The watch of ctx runs on a goroutine of its own: a caller who has
		// given up may not have been noticed yet.
		switch cause := context.Cause(ctx); {
		case h.over.Load():
			return outcome{err: fmt.Errorf("it did not finish within its time budget of %v", budget)}
		case cause != nil:
			return outcome{err: fmt.Errorf("the request was abandoned: %w", cause)}
		}
		// OPA's error already names the source and line of the failing rule.
		return outcome{err: err}
	}
	if results == 0 {
		return outcome{}
	}
	return out
}

// verdict is one policy's share of a Decision and its metrics result.
type verdict struct {
	denied, warnings, audited []Finding
	result                    string
}

// judge places one policy's outcome in the decision according to its mode and
// the failure mode. It is pure: the rules of the Decision type live here.
func judge(policy string, mode Mode, out outcome, fm FailureMode) verdict {
	var v verdict
	if out.err != nil {
		f := Finding{Policy: policy, Mode: mode, EvalFailed: true,
			Message: "policy could not be evaluated: " + out.err.Error()}
		switch {
		case mode == ModeAudit:
			v.audited = []Finding{f}
		case mode == ModeEnforce && fm == FailureDeny:
			f.Message += " (failure mode deny refuses the request)"
			v.denied = []Finding{f}
		default:
			if mode == ModeEnforce {
				f.Message += " (failure mode allow lets the request through)"
			}
			v.warnings = []Finding{f}
		}
		v.result = ResultError
		return v
	}

	deny := toFindings(policy, mode, ruleDeny, out.deny)
	warn := toFindings(policy, mode, ruleWarn, out.warn)
	switch mode {
	case ModeAudit:
		v.audited = append(deny, warn...)
	case ModeWarn:
		v.warnings = append(deny, warn...)
	default:
		v.denied, v.warnings = deny, warn
	}
	switch {
	case len(v.denied) > 0:
		v.result = ResultDeny
	case len(v.warnings) > 0:
		v.result = ResultWarn
	case len(v.audited) > 0:
		v.result = ResultAudit
	default:
		v.result = ResultAllow
	}
	return v
}

// toFindings converts set elements, sorted by field then message so that
// output is stable for users and tests.
func toFindings(policy string, mode Mode, rule string, elems []any) []Finding {
	if len(elems) == 0 {
		return nil
	}
	fs := make([]Finding, len(elems))
	for i, el := range elems {
		fs[i] = toFinding(policy, mode, el)
		fs[i].Rule = rule
	}
	slices.SortFunc(fs, func(a, b Finding) int {
		if c := strings.Compare(a.Field, b.Field); c != 0 {
			return c
		}
		return strings.Compare(a.Message, b.Message)
	})
	return fs
}

// toFinding reads a string or {"msg": …, "field": …}. Anything else is still
// a finding (a deny must never vanish for being malformed), shown as JSON.
func toFinding(policy string, mode Mode, el any) Finding {
	f := Finding{Policy: policy, Mode: mode}
	switch v := el.(type) {
	case string:
		f.Message = v
		return f
	case map[string]any:
		msg, okMsg := v["msg"].(string)
		if field, ok := v["field"].(string); ok {
			f.Field = field
		}
		if okMsg {
			f.Message = msg
			return f
		}
	}
	b, err := json.Marshal(el)
	if err != nil {
		f.Message = fmt.Sprint(el)
	} else {
		f.Message = string(b)
	}
	return f
}
