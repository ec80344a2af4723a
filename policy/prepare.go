package policy

import (
	"context"
	"fmt"
	"slices"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/storage"
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
	// nondeterministic: a module calls a builtin whose result may differ
	// from one evaluation to the next on the same input (time.now_ns,
	// rand.intn, uuid.rfc4122, …).
	nondeterministic bool
	// store is the set's data: empty, policies read only input.
	store storage.Store
}

// preparedPolicy is one policy ready to evaluate.
type preparedPolicy struct {
	name   string
	source string
	mode   Mode // effective: metadata with Options applied
	// severity and category from the METADATA, "" when absent.
	severity, category string
	digest             string
	query              compiledQuery
	rules              []string
	// deletes: the policy is evaluated on a DELETE (judgesDelete).
	deletes bool
	meter   policyMeter
}

// prepare builds one query per enabled policy. A query per policy, rather
// than one for the set, lets an error or time-out be pinned on its policy
// while the others still decide.
func prepare(_ context.Context, cs *compiledSet, opts Options, m *metrics) (*preparedSet, error) {
	set := &preparedSet{reads: inputReads(cs.compiler.Modules, cs.compiler), nondeterministic: callsNondeterministic(cs.compiler.Modules),
		store: inmem.New()}
	for _, p := range cs.policies {
		if opts.disabled(p.name) {
			set.disabled = append(set.disabled, p.name)
			continue
		}
		q, err := compileQuery(cs.compiler, policyQuery(p))
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
			query:   q,
			rules:   p.rules,
			deletes: judgesDelete(cs.compiler, p.path, p.rules),
			meter:   m.forPolicy(p.name),
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

// compiledQuery is a policy's query as the evaluator runs it, and the names
// of the variables it binds (the compiler renames them).
type compiledQuery struct {
	body          ast.Body
	compiler      *ast.Compiler
	queryCompiler ast.QueryCompiler
	names         map[ast.Var]string
}

// compileQuery compiles body against c as OPA's rego package prepares a
// query for evaluation (no package, no imports, print statements off).
func compileQuery(c *ast.Compiler, body ast.Body) (compiledQuery, error) {
	qc := c.QueryCompiler().WithStrict(false)
	compiled, err := qc.Compile(body)
	if err != nil {
		return compiledQuery{}, err
	}
	names := map[ast.Var]string{}
	for _, expr := range body {
		if v, ok := expr.Operand(0).Value.(ast.Var); ok {
			names[v] = string(v)
		}
	}
	for renamed, v := range qc.RewrittenVars() {
		if _, ok := names[v]; ok {
			names[renamed] = string(v)
		}
	}
	return compiledQuery{body: compiled, compiler: c, queryCompiler: qc, names: names}, nil
}

// callsNondeterministic reports whether a module refers to a builtin that
// OPA marks nondeterministic, or to one that reads the clock without the
// mark (clockBuiltins).
func callsNondeterministic(modules map[string]*ast.Module) bool {
	found := false
	for _, m := range modules {
		ast.WalkRefs(m, func(r ast.Ref) bool {
			name := r.String()
			if b, ok := ast.BuiltinMap[name]; ok && (b.Nondeterministic || slices.Contains(clockBuiltins, name)) {
				found = true
			}
			return found
		})
		if found {
			break
		}
	}
	return found
}

// clockBuiltins verify certificates against the current time when given
// none, though OPA does not mark them nondeterministic.
var clockBuiltins = []string{"crypto.x509.parse_and_verify_certificates", "crypto.x509.parse_and_verify_certificates_with_options"}
