package policy

import (
	"strconv"

	"github.com/open-policy-agent/opa/v1/ast"
)

// projection is the part of a JSON value that a policy set can read. The
// input is converted to Rego values on every request, and most of a
// Deployment (its env, its volumes, its other probes) is read by no rule: a
// value outside the projection is checked as JSON but not built.
//
// A nil *projection reads nothing. A whole one reads the value as it is.
// Otherwise an object keeps only the members that child reads, and an array
// keeps its length, with null for the elements nothing reads.
type projection struct {
	whole   bool
	members map[string]*projection
	any     *projection // every member and element; merged into members
}

// wholeValue reads everything.
var wholeValue = &projection{whole: true}

// child is what p reads of the member key; nil when nothing.
func (p *projection) child(key string) *projection {
	if p.whole {
		return p
	}
	if m, ok := p.members[key]; ok {
		return m
	}
	return p.any
}

// element is child for array element i; the common case, no index named,
// allocates nothing.
func (p *projection) element(i int) *projection {
	if p.whole {
		return p
	}
	if len(p.members) == 0 {
		return p.any
	}
	return p.child(strconv.Itoa(i))
}

// step is one step of a path into the input: a member name (an array index
// in decimal), or any member.
type step struct {
	key string
	any bool
}

// add marks the value at path as read whole.
func (p *projection) add(path []step) {
	n := p.touch(path)
	n.whole, n.members, n.any = true, nil, nil
}

// touch marks the value at path as read at least in part: a reference to it
// is defined or not, and a variable member in the path enumerates the
// members. It returns the value's node.
func (p *projection) touch(path []step) *projection {
	n := p
	for _, s := range path {
		if n.whole {
			return n
		}
		var next *projection
		if s.any {
			if n.any == nil {
				n.any = &projection{}
			}
			next = n.any
		} else {
			if n.members == nil {
				n.members = map[string]*projection{}
			}
			if next = n.members[s.key]; next == nil {
				next = &projection{}
				n.members[s.key] = next
			}
		}
		n = next
	}
	return n
}

// normalize merges any into every named member, so that child needs one
// lookup, and drops what a whole node makes redundant.
func (p *projection) normalize() {
	if p.whole {
		// wholeValue is shared: written only if it must be.
		if p.members != nil || p.any != nil {
			p.members, p.any = nil, nil
		}
		return
	}
	if p.any != nil {
		p.any.normalize()
		for k, m := range p.members {
			p.members[k] = merged(m, p.any)
		}
	}
	for _, m := range p.members {
		m.normalize()
	}
}

// merged is a new projection that reads what a or b reads.
func merged(a, b *projection) *projection {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	case a.whole || b.whole:
		return wholeValue
	}
	m := &projection{any: merged(a.any, b.any)}
	if len(a.members)+len(b.members) > 0 {
		m.members = make(map[string]*projection, len(a.members)+len(b.members))
		for k, x := range a.members {
			m.members[k] = merged(x, b.members[k])
		}
		for k, x := range b.members {
			if _, ok := a.members[k]; !ok {
				m.members[k] = x
			}
		}
	}
	return m
}

// inputReads is what the modules can read of input: wholeValue when they
// may read all of it. The analysis follows each reference to input, through the local
// variables bound to a part of it and the functions it is passed to; any
// other use of a part (a comparison, a builtin, a rule's value) reads that
// part whole. Unsure means whole: a `with` anywhere, the bare input, or more
// work than the budget.
func inputReads(modules map[string]*ast.Module, c *ast.Compiler) *projection {
	a := &readsAnalysis{c: c, root: &projection{}, budget: 20000}
	for _, m := range modules {
		if hasWith(m) {
			return wholeValue
		}
	}
	for _, m := range modules {
		for _, r := range m.Rules {
			a.rule(r, nil)
		}
	}
	if a.all || a.budget < 0 || a.root.whole {
		return wholeValue
	}
	a.root.normalize()
	return a.root
}

// hasWith reports whether x (a module, a rule) has an expression with a
// `with` modifier.
func hasWith(x any) bool {
	found := false
	ast.WalkExprs(x, func(e *ast.Expr) bool {
		if len(e.With) > 0 {
			found = true
		}
		return found
	})
	return found
}

type readsAnalysis struct {
	c      *ast.Compiler
	root   *projection
	all    bool
	budget int
}

// paths are the parts of input a variable may stand for.
type paths [][]step

// maxPaths bounds the paths one reference fans out to; beyond it, any.
const maxPaths = 64

// scope is what is known of the variables of one rule.
type scope struct {
	// bound: variables bound to parts of input, by a binding expression
	// ("x = input.a.b" in compiled form).
	bound map[ast.Var]paths
	// binding: the expressions that bind.
	binding map[*ast.Expr]bool
	// sides counts the candidate bindings each variable is the variable
	// side of, in the whole rule: one binds; two compare two values.
	sides map[ast.Var]int
	known known
	// changed: the binding sweep bound a variable; uses: the sweeps record
	// uses now.
	changed, uses bool
}

// known is what the expressions evaluated so far say of the variables: a
// closure sees what its enclosing body knew where it stands, and an
// expression only what precedes it, as OPA evaluates a body in order.
type known struct {
	// domain: the member names a variable can only take ("v = C[k]" with C
	// constant: k a key of C, v a value).
	domain map[ast.Var][]string
	// literal: variables bound to a ground collection.
	literal map[ast.Var]*ast.Term
}

func (k known) copy() known {
	c := known{domain: make(map[ast.Var][]string, len(k.domain)), literal: make(map[ast.Var]*ast.Term, len(k.literal))}
	for v, d := range k.domain {
		c.domain[v] = d
	}
	for v, l := range k.literal {
		c.literal[v] = l
	}
	return c
}

// rule analyses r and its else chain; params binds function parameters to
// the parts of input a call passed.
func (a *readsAnalysis) rule(r *ast.Rule, params map[int]paths) {
	for ; r != nil; r = r.Else {
		if a.budget--; a.budget < 0 {
			return
		}
		s := &scope{bound: map[ast.Var]paths{}, binding: map[*ast.Expr]bool{}, sides: map[ast.Var]int{}}
		// A variable that holds a value before any expression runs (a
		// parameter, an every's key and value) is compared by "=", never
		// bound: it counts as two sides.
		inArgs := map[ast.Var]int{}
		for _, arg := range r.Head.Args {
			ast.WalkVars(arg, func(v ast.Var) bool {
				inArgs[v]++
				s.sides[v] += 2
				return false
			})
		}
		ast.WalkExprs(r, func(e *ast.Expr) bool {
			if v, _, ok := candidate(e); ok {
				s.sides[v]++
			}
			if every, ok := e.Terms.(*ast.Every); ok {
				for _, t := range []*ast.Term{every.Key, every.Value} {
					if t != nil {
						ast.WalkVars(t, func(v ast.Var) bool {
							s.sides[v] += 2
							return false
						})
					}
				}
			}
			return false
		})
		for i, ps := range params {
			// A parameter stands for the part only when it is a plain
			// variable of its own; f(x, x) or f({"a": x}) unifies it.
			if i < len(r.Head.Args) {
				if v, ok := r.Head.Args[i].Value.(ast.Var); ok && !v.IsWildcard() && inArgs[v] == 1 {
					s.bound[v] = ps
					continue
				}
			}
			a.wholeAll(ps)
		}
		// Every binding, in every nested body, before any use: a use seen
		// before its variable is known to be bound would read nothing.
		for s.changed = true; s.changed; {
			s.changed = false
			a.body(s, r.Body, known{})
		}
		s.uses = true
		a.body(s, r.Body, known{})
		h := r.Head
		if h.Key != nil {
			a.term(s, h.Key)
		}
		if h.Value != nil {
			a.term(s, h.Value)
		}
		for _, t := range h.Reference {
			a.term(s, t)
		}
	}
}

// candidate: e may bind v to the part of input r reads.
func candidate(e *ast.Expr) (ast.Var, ast.Ref, bool) {
	if e.Negated || len(e.With) > 0 || !e.IsEquality() {
		return "", nil, false
	}
	ops := e.Operands()
	for _, o := range [][2]*ast.Term{{ops[0], ops[1]}, {ops[1], ops[0]}} {
		v, ok := o[0].Value.(ast.Var)
		r, isRef := o[1].Value.(ast.Ref)
		if ok && isRef && !v.IsWildcard() && !v.Equal(ast.InputRootDocument.Value) {
			return v, r, true
		}
	}
	return "", nil, false
}

// body sweeps the expressions of one body in order, with what the
// expressions before each say of the variables: binding them (the nested
// bodies too) until s.uses, then recording every use. outer is what the
// enclosing body knew where the body stands.
func (a *readsAnalysis) body(s *scope, b ast.Body, outer known) {
	saved := s.known
	defer func() { s.known = saved }()
	s.known = outer.copy()
	for _, e := range b {
		if s.uses {
			a.expr(s, e)
		} else {
			a.bind(s, e)
		}
		a.domains(s, e)
	}
}

// bind records the binding e makes, if any, and those of its nested bodies.
func (a *readsAnalysis) bind(s *scope, e *ast.Expr) {
	if v, r, ok := candidate(e); ok && s.sides[v] == 1 {
		if _, already := s.bound[v]; !already {
			if ps, ok := a.refPaths(s, r); ok {
				s.bound[v], s.binding[e] = ps, true
				s.changed = true
			}
		}
	}
	vis := ast.NewGenericVisitor(func(x any) bool {
		switch c := x.(type) {
		case *ast.ArrayComprehension:
			a.body(s, c.Body, s.known)
		case *ast.SetComprehension:
			a.body(s, c.Body, s.known)
		case *ast.ObjectComprehension:
			a.body(s, c.Body, s.known)
		case *ast.Every:
			a.body(s, c.Body, s.known)
		default:
			return false
		}
		return true
	})
	vis.Walk(e)
}

// domains records what a positive expression says of its variables.
func (a *readsAnalysis) domains(s *scope, e *ast.Expr) {
	if e.Negated || len(e.With) > 0 {
		return
	}
	if t, ok := e.Terms.(*ast.Term); ok {
		// "C[k]" alone: k is a key of C.
		if r, ok := t.Value.(ast.Ref); ok {
			a.indexDomain(s, r)
		}
		return
	}
	if !e.IsEquality() {
		return
	}
	ops := e.Operands()
	for _, o := range [][2]*ast.Term{{ops[0], ops[1]}, {ops[1], ops[0]}} {
		v, ok := o[0].Value.(ast.Var)
		if !ok {
			continue
		}
		switch x := o[1].Value.(type) {
		case ast.Set, *ast.Array, ast.Object:
			if o[1].IsGround() {
				s.known.literal[v] = o[1]
			}
		case ast.Ref:
			// "v = C[k]": v is also a value of C.
			if coll := a.indexDomain(s, x); coll != nil {
				if vals, ok := valuesOf(coll); ok {
					s.known.domain[v] = vals
				}
			}
		}
	}
}

// indexDomain: r is C[k] with C a constant collection and k a variable,
// which can then only be a key of C. It returns C, or nil.
func (a *readsAnalysis) indexDomain(s *scope, r ast.Ref) *ast.Term {
	if len(r) < 2 {
		return nil
	}
	k, ok := r[len(r)-1].Value.(ast.Var)
	if !ok {
		return nil
	}
	coll := a.constant(s, r[:len(r)-1])
	if coll == nil {
		return nil
	}
	if keys, ok := keysOf(coll); ok {
		s.known.domain[k] = keys
	}
	return coll
}

// constant is the ground collection r stands for: a variable bound to a
// literal, or a rule of constant value with no body and no other definition.
func (a *readsAnalysis) constant(s *scope, r ast.Ref) *ast.Term {
	if len(r) == 1 {
		if v, ok := r[0].Value.(ast.Var); ok {
			return s.known.literal[v]
		}
		return nil
	}
	if !r[0].Equal(ast.DefaultRootDocument) || !r.IsGround() {
		return nil
	}
	rules := a.c.GetRulesExact(r)
	if len(rules) != 1 {
		return nil
	}
	x := rules[0]
	if x.Default || x.Else != nil || len(x.Head.Args) > 0 || x.Head.Value == nil || !x.Head.Value.IsGround() ||
		len(x.Body) != 1 || !x.Body[0].Equal(ast.NewExpr(ast.BooleanTerm(true))) {
		return nil
	}
	return x.Head.Value
}

// keysOf: the member names of a collection (a set's are its elements).
func keysOf(t *ast.Term) ([]string, bool) {
	var out []string
	switch c := t.Value.(type) {
	case ast.Object:
		for _, k := range c.Keys() {
			s, ok := k.Value.(ast.String)
			if !ok {
				return nil, false
			}
			out = append(out, string(s))
		}
	case ast.Set:
		return valuesOf(t)
	case *ast.Array:
		for i := range c.Len() {
			out = append(out, strconv.Itoa(i))
		}
	default:
		return nil, false
	}
	return out, true
}

// valuesOf: the values of a collection, when all are strings.
func valuesOf(t *ast.Term) ([]string, bool) {
	var out []string
	ok := true
	add := func(v *ast.Term) {
		s, isString := v.Value.(ast.String)
		ok = ok && isString
		out = append(out, string(s))
	}
	switch c := t.Value.(type) {
	case ast.Object:
		c.Foreach(func(_, v *ast.Term) { add(v) })
	case ast.Set:
		c.Foreach(add)
	case *ast.Array:
		c.Foreach(add)
	default:
		return nil, false
	}
	return out, ok
}

// refPaths: the parts of input r reads, when it starts at input or at a
// variable bound to a part of it.
func (a *readsAnalysis) refPaths(s *scope, r ast.Ref) (paths, bool) {
	var ps paths
	switch {
	case r[0].Equal(ast.InputRootDocument):
		ps = paths{nil}
	default:
		v, ok := r[0].Value.(ast.Var)
		if !ok {
			return nil, false
		}
		if ps, ok = s.bound[v]; !ok {
			return nil, false
		}
	}
	for _, t := range r[1:] {
		ps = a.extend(s, ps, t)
	}
	for _, p := range ps {
		a.root.touch(p)
	}
	return ps, true
}

// extend appends the steps term t may stand for to each path.
func (a *readsAnalysis) extend(s *scope, ps paths, t *ast.Term) paths {
	var keys []string
	switch k := t.Value.(type) {
	case ast.String:
		keys = []string{string(k)}
	case ast.Number:
		if i, ok := k.Int(); ok && i >= 0 {
			keys = []string{strconv.Itoa(i)}
		}
	case ast.Var:
		keys = s.known.domain[k]
	}
	out := make(paths, 0, len(ps)*max(len(keys), 1))
	for _, p := range ps {
		if len(keys) == 0 || len(ps)*len(keys) > maxPaths {
			out = append(out, append(p[:len(p):len(p)], step{any: true}))
			continue
		}
		for _, k := range keys {
			out = append(out, append(p[:len(p):len(p)], step{key: k}))
		}
	}
	return out
}

func (a *readsAnalysis) wholeAll(ps paths) {
	for _, p := range ps {
		a.root.add(p)
	}
}

// expr records the uses of an expression.
func (a *readsAnalysis) expr(s *scope, e *ast.Expr) {
	if s.binding[e] {
		// Its variable stands for the part; only the index terms read.
		_, r, _ := candidate(e)
		for _, t := range r[1:] {
			a.term(s, t)
		}
		return
	}
	switch x := e.Terms.(type) {
	case *ast.Term:
		a.term(s, x)
	case []*ast.Term:
		a.call(s, x[0], x[1:])
	case *ast.Every:
		a.term(s, x.Domain)
		a.body(s, x.Body, s.known)
	default:
		// A declaration left by the compiler, or a form this analysis does
		// not know: input is read whole.
		ast.WalkTerms(e, func(t *ast.Term) bool {
			a.term(s, t)
			return true
		})
	}
}

// term records the uses of a term.
func (a *readsAnalysis) term(s *scope, t *ast.Term) {
	switch x := t.Value.(type) {
	case ast.Var:
		if x.Equal(ast.InputRootDocument.Value) {
			a.all = true
		} else if ps, ok := s.bound[x]; ok {
			a.wholeAll(ps)
		}
	case ast.Ref:
		if ps, ok := a.refPaths(s, x); ok {
			a.wholeAll(ps)
			for _, c := range x[1:] {
				a.term(s, c)
			}
			return
		}
		for _, c := range x {
			a.term(s, c)
		}
	case ast.Call:
		a.call(s, x[0], x[1:])
	case *ast.Array:
		x.Foreach(func(e *ast.Term) { a.term(s, e) })
	case ast.Set:
		x.Foreach(func(e *ast.Term) { a.term(s, e) })
	case ast.Object:
		x.Foreach(func(k, v *ast.Term) { a.term(s, k); a.term(s, v) })
	case *ast.ArrayComprehension:
		a.body(s, x.Body, s.known)
		a.term(s, x.Term)
	case *ast.SetComprehension:
		a.body(s, x.Body, s.known)
		a.term(s, x.Term)
	case *ast.ObjectComprehension:
		a.body(s, x.Body, s.known)
		a.term(s, x.Key)
		a.term(s, x.Value)
	case ast.String, ast.Number, ast.Boolean, ast.Null:
	default:
		a.all = true
	}
}

// operand: the parts of input a call's argument stands for.
func (a *readsAnalysis) operand(s *scope, t *ast.Term) (paths, bool) {
	switch x := t.Value.(type) {
	case ast.Var:
		ps, ok := s.bound[x]
		return ps, ok
	case ast.Ref:
		return a.refPaths(s, x)
	}
	return nil, false
}

// call records the uses of a call: object.get with a constant key reads
// that member; a function of the policies reads what its body reads of the
// parameter; any other call reads its arguments whole.
func (a *readsAnalysis) call(s *scope, op *ast.Term, args []*ast.Term) {
	ref, ok := op.Value.(ast.Ref)
	if !ok {
		a.term(s, op)
		for _, t := range args {
			a.term(s, t)
		}
		return
	}
	if ref.Equal(ast.ObjectGet.Ref()) && len(args) >= 3 {
		if ps, ok := a.operand(s, args[0]); ok {
			if keys, ok := args[1].Value.(*ast.Array); ok {
				keys.Foreach(func(k *ast.Term) { ps = a.extend(s, ps, k) })
			} else {
				ps = a.extend(s, ps, args[1])
			}
			a.wholeAll(ps)
			a.operandIndexes(s, args[0])
			for _, t := range args[1:] {
				a.term(s, t)
			}
			return
		}
	}
	var rules []*ast.Rule
	if ref[0].Equal(ast.DefaultRootDocument) {
		rules = a.c.GetRulesExact(ref)
	}
	if len(rules) == 0 || len(rules[0].Head.Args) == 0 {
		for _, t := range args {
			a.term(s, t)
		}
		return
	}
	params := map[int]paths{}
	for i, t := range args {
		if ps, ok := a.operand(s, t); ok && i < len(rules[0].Head.Args) {
			params[i] = ps
			a.operandIndexes(s, t)
			continue
		}
		a.term(s, t)
	}
	if len(params) == 0 {
		return
	}
	for _, r := range rules {
		a.rule(r, params)
	}
}

// operandIndexes records the uses of the index terms of an operand that is
// a reference.
func (a *readsAnalysis) operandIndexes(s *scope, t *ast.Term) {
	if r, ok := t.Value.(ast.Ref); ok {
		for _, c := range r[1:] {
			a.term(s, c)
		}
	}
}
