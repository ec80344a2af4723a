package policy

import (
	"github.com/open-policy-agent/opa/v1/ast"
)

// opDelete is the operation of a deletion: input.object is null, the
// Deployment being deleted is input.oldObject.
const opDelete = "DELETE"

// judgesDelete reports whether the policy at path (its rules, and the rules
// and functions they use, in any module) can tell a DELETE from the write it
// was written for: whether it reads input.operation, input.oldObject, or
// input.object as a whole value (`input.object == null`, `not input.object`).
// Only such a policy is evaluated on a DELETE. The others read parts of
// input.object alone, which a DELETE does not have, and a negated rule about
// one of them (`not input.object.metadata.labels.owner`) would find fault
// with every deletion. What the analysis cannot bound (a `with`, the bare
// input, a member of input chosen by a variable, more work than the budget)
// judges DELETE: a deletion rule is never skipped for being hard to read.
func judgesDelete(c *ast.Compiler, path ast.Ref, rules []string) bool {
	var todo []*ast.Rule
	for _, name := range rules {
		todo = append(todo, c.GetRulesExact(path.Copy().Append(ast.StringTerm(name)))...)
	}
	a := &readsAnalysis{c: c, root: &projection{}, budget: 20000}
	seen := map[*ast.Rule]bool{}
	for len(todo) > 0 {
		r := todo[len(todo)-1]
		todo = todo[:len(todo)-1]
		if seen[r] {
			continue
		}
		seen[r] = true
		if hasWith(r) {
			return true
		}
		a.rule(r, nil)
		for dep := range c.Graph.Dependencies(r) {
			if d, ok := dep.(*ast.Rule); ok {
				todo = append(todo, d)
			}
		}
	}
	root := a.root
	if a.all || a.budget < 0 || root.whole || root.any != nil {
		return true
	}
	if root.members["operation"] != nil || root.members["oldObject"] != nil {
		return true
	}
	object := root.members["object"]
	return object != nil && object.whole
}
