package policy

import (
	"context"
	"fmt"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
)

// preparedSet is an active policy set: immutable once built, shared by every
// evaluation until the next set replaces it.
type preparedSet struct {
	policies []preparedPolicy // enabled policies, sorted by name
	disabled []string         // names compiled but not evaluated
	// reads is what the set's modules can read of input (inputReads): the
	// input is built of that only.
	reads *projection
}

// preparedPolicy is one policy ready to evaluate.
type preparedPolicy struct {
	name   string
	source string
	mode   Mode // effective: metadata with Options applied
	// severity and category from the METADATA, "" when absent.
	severity, category string
	digest             string
	query              rego.PreparedEvalQuery
	rules              []string
	meter              policyMeter
}

// prepare builds one query per enabled policy. A query per policy, rather
// than one for the set, lets an error or time-out be pinned on its policy
// while the others still decide.
func prepare(ctx context.Context, cs *compiledSet, opts Options, m *metrics) (*preparedSet, error) {
	set := &preparedSet{reads: inputReads(cs.compiler.Modules, cs.compiler)}
	// One empty store for the set: policies read only input.
	store := inmem.New()
	for _, p := range cs.policies {
		if opts.disabled(p.name) {
			set.disabled = append(set.disabled, p.name)
			continue
		}
		q, err := rego.New(
			rego.Compiler(cs.compiler),
			rego.Store(store),
			rego.ParsedQuery(policyQuery(p)),
		).PrepareForEval(ctx)
		if err != nil {
			return nil, fmt.Errorf("preparing policy %q from %s: %w", p.name, p.source, err)
		}
		mode := opts.effectiveMode(p.name, p.mode)
		set.policies = append(set.policies, preparedPolicy{
			name:     p.name,
			source:   p.source,
			mode:     mode,
			digest:   policyDigest(p.text, cs.libraries, mode),
			severity: p.severity, category: p.category,
			query: q,
			rules: p.rules,
			meter: m.forPolicy(p.name),
		})
	}
	return set, nil
}

// policyQuery binds each rule the policy defines to a variable of its name:
// deny := data.deployguard.<name>.deny; warn := data.deployguard.<name>.warn.
// Both are partial sets, defined (maybe empty) for every input, so the query
// always has exactly one result.
func policyQuery(p policyModule) ast.Body {
	exprs := make([]*ast.Expr, 0, len(p.rules))
	for _, rule := range p.rules {
		ref := p.path.Copy().Append(ast.StringTerm(rule))
		exprs = append(exprs, ast.Assign.Expr(ast.VarTerm(rule), ast.NewTerm(ref)))
	}
	return ast.NewBody(exprs...)
}
