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
	// readsOldObject: some module may read input.oldObject; without one, the
	// input is built without it (converting it is half an UPDATE's cost).
	readsOldObject bool
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
	set := &preparedSet{readsOldObject: readsOldObject(cs.compiler.Modules)}
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

// readsOldObject reports whether any module may read input.oldObject: a
// reference to it, to input as a whole (a bare input term: assigned, passed
// to a function), or to a member of input chosen at evaluation time.
// Conservative: unsure means yes.
func readsOldObject(modules map[string]*ast.Module) bool {
	reads := false
	var vis *ast.GenericVisitor
	vis = ast.NewGenericVisitor(func(x any) bool {
		if reads {
			return true
		}
		switch v := x.(type) {
		case ast.Ref:
			if !v[0].Equal(ast.InputRootDocument) {
				return false // its terms are visited: data.x[input] reads input
			}
			if len(v) == 1 {
				reads = true
				return true
			}
			if key, ok := v[1].Value.(ast.String); !ok || key == "oldObject" {
				reads = true
				return true
			}
			// input.object…: only the index terms after it may read more.
			for _, t := range v[2:] {
				vis.Walk(t)
			}
			return true
		case ast.Var:
			reads = v.Equal(ast.InputRootDocument.Value)
			return reads
		}
		return false
	})
	for _, m := range modules {
		vis.Walk(m)
		if reads {
			return true
		}
	}
	return false
}
