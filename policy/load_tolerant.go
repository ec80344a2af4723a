package policy

import (
	"context"
	"slices"
)

// sourceGroup is sources that stand or fall together: the keys of one
// ConfigMap. Leaving out part of a ConfigMap would run half a policy set its
// author never tested.
type sourceGroup struct {
	name    string
	sources []Source
}

// loadTolerant loads base plus every group that compiles with it. A group
// with an error in any of its sources is left out whole and the rest is
// compiled again, until it compiles; so one team's broken ConfigMap cannot
// lift everyone else's rules. An error in base (the built-in library and the
// policy directory) refuses the set, and the previous set stays active.
// It returns the load errors of the groups it left out, by group name.
func (e *Engine) loadTolerant(ctx context.Context, base []Source, groups []sourceGroup) (map[string]*LoadError, error) {
	e.loadMu.Lock()
	defer e.loadMu.Unlock()

	owner := map[string]string{}
	for _, g := range groups {
		for _, s := range g.sources {
			owner[s.Name] = g.name
		}
	}
	rejected := map[string]*LoadError{}
	active := slices.Clone(groups)
	for {
		sources := slices.Clone(base)
		for _, g := range active {
			sources = append(sources, g.sources...)
		}
		set, err := e.build(ctx, sources)
		if err == nil {
			e.swap(set)
			return rejected, nil
		}
		lerr, ok := AsLoadError(err)
		if !ok {
			return rejected, err
		}
		failed := map[string][]SourceError{}
		for _, se := range lerr.Errors {
			if g, ok := owner[se.Source]; ok {
				failed[g] = append(failed[g], se)
			}
		}
		if len(failed) == 0 {
			// Only base (or nothing we can attribute) failed: nothing to leave out.
			return rejected, err
		}
		for g, errs := range failed {
			rejected[g] = &LoadError{Errors: errs}
		}
		// Each round removes at least one group, so the loop ends.
		active = slices.DeleteFunc(active, func(g sourceGroup) bool {
			_, bad := failed[g.name]
			return bad
		})
	}
}
