package review

import (
	"context"
	"errors"
	"sync"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	toolscache "k8s.io/client-go/tools/cache"
)

// ErrIndexNotSynced is returned while the index has not seen every
// Deployment yet: an answer then could miss an overlap.
var ErrIndexNotSynced = errors.New("the guard has not yet seen every Deployment")

// OverlapIndex indexes the Deployments of every namespace by the label pairs
// the overlap check looks for, so that a request finds its few candidates
// without listing, let alone copying, the namespace's Deployments.
//
// Two Deployments overlap when one's selector matches the other's pod
// template labels. For "my selector selects their pods", the candidates are
// the Deployments whose template has a label my selector requires (the
// requirement with the fewest of them). For "their selector selects my pods",
// each Deployment is filed under the label pairs one of its selector's
// equality (or set) requirements accepts, the one whose labels are the rarest
// among the namespace's pods when it is filed: any selector that matches my
// labels is filed under one of my label pairs. Selectors with no such requirement
// (only NotIn, Exists, DoesNotExist) are always candidates; selectors of mine
// with none are compared with the whole namespace. Both are rare.
type OverlapIndex struct {
	byNamespace
	synced func() bool
}

// byNamespace is what both indexes keep: selections filed by namespace,
// under a lock.
type byNamespace struct {
	mu   sync.RWMutex
	byNS map[string]*nsSelections
}

// lookup is how both indexes answer: ErrIndexNotSynced until synced, since
// an answer then could miss something; nothing for a namespace with nothing
// filed; otherwise what find finds in namespace's selections, under the read
// lock.
func lookup[T any](x *byNamespace, synced bool, namespace string, find func(*nsSelections) []T) ([]T, error) {
	if !synced {
		return nil, ErrIndexNotSynced
	}
	x.mu.RLock()
	defer x.mu.RUnlock()
	ns := x.byNS[namespace]
	if ns == nil {
		return nil, nil
	}
	return find(ns), nil
}

type nameSet map[string]struct{}

// add adds name to s, and reports whether it was not there yet.
func (s nameSet) add(name string) bool {
	if _, dup := s[name]; dup {
		return false
	}
	s[name] = struct{}{}
	return true
}

// names is the set of Deployments filed under one label pair. Most pairs
// of a namespace's templates and selectors are one Deployment's own (its
// app's name, its instance): that one is held as a string, and a map made
// only for a second. A map of one name costs about 300 bytes, and there are
// two or three such pairs per Deployment (BenchmarkOverlapIndexPerDeployment).
type names struct {
	one  string
	many nameSet
}

func (n names) len() int {
	if n.many != nil {
		return len(n.many)
	}
	if n.one != "" {
		return 1
	}
	return 0
}

// each calls f with every name.
func (n names) each(f func(string)) {
	if n.many != nil {
		for name := range n.many {
			f(name)
		}
		return
	}
	if n.one != "" {
		f(n.one)
	}
}

// with returns n and name.
func (n names) with(name string) names {
	switch {
	case n.many != nil:
		n.many[name] = struct{}{}
	case n.one == "" || n.one == name:
		n.one = name
	default:
		n = names{many: nameSet{n.one: {}, name: {}}}
	}
	return n
}

// without returns n without name; back to a string at one name.
func (n names) without(name string) names {
	if n.many == nil {
		if n.one == name {
			return names{}
		}
		return n
	}
	delete(n.many, name)
	if len(n.many) == 1 {
		for last := range n.many {
			return names{one: last}
		}
	}
	return n
}

type nsSelections struct {
	entries    map[string]filed
	byTemplate map[labelPair]names // pods labelled k=v
	byAnchor   map[labelPair]names // selectors that require k=v (first requirement)
	unanchored nameSet
}

func newNSSelections() *nsSelections {
	return &nsSelections{entries: map[string]filed{}, byTemplate: map[labelPair]names{}, byAnchor: map[labelPair]names{}, unanchored: nameSet{}}
}

type labelPair struct{ key, value string }

// filed is a Selection and the label pairs it is filed under in byAnchor
// (none: unanchored).
type filed struct {
	Selection
	anchors []labelPair
}

// NewOverlapIndex returns an empty index. synced, when set, reports whether
// the informer feeding it has delivered every existing Deployment.
func NewOverlapIndex(synced func() bool) *OverlapIndex {
	return &OverlapIndex{byNamespace: byNamespace{byNS: map[string]*nsSelections{}}, synced: synced}
}

// Set files (or refiles) a Deployment.
func (x *OverlapIndex) Set(d *appsv1.Deployment) {
	s, ok := SelectionOf(d)
	x.mu.Lock()
	defer x.mu.Unlock()
	ns := x.byNS[d.Namespace]
	if ns != nil {
		ns.remove(d.Name)
	}
	if !ok {
		if ns != nil && len(ns.entries) == 0 {
			delete(x.byNS, d.Namespace)
		}
		return
	}
	if ns == nil {
		ns = newNSSelections()
		x.byNS[d.Namespace] = ns
	}
	ns.add(s)
}

// Delete forgets a Deployment.
func (x *OverlapIndex) Delete(namespace, name string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if ns := x.byNS[namespace]; ns != nil {
		ns.remove(name)
		if len(ns.entries) == 0 {
			delete(x.byNS, namespace)
		}
	}
}

// Synced reports whether the informer feeding the index has delivered every
// Deployment that existed when it started (always, without an informer). A
// replica is not ready before: its overlap check could not answer.
func (x *OverlapIndex) Synced() bool { return x.synced == nil || x.synced() }

// Len is the number of Deployments filed, for tests and metrics.
func (x *OverlapIndex) Len() int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	n := 0
	for _, ns := range x.byNS {
		n += len(ns.entries)
	}
	return n
}

// OverlapCandidates implements OverlapSource.
func (x *OverlapIndex) OverlapCandidates(_ context.Context, d *appsv1.Deployment) ([]Selection, error) {
	mine, selects := SelectionOf(d)
	return lookup(&x.byNamespace, x.Synced(), d.Namespace, func(ns *nsSelections) (out []Selection) {
		if !selects {
			return nil
		}
		seen := nameSet{d.Name: {}}
		takeOne := func(n string) {
			if seen.add(n) {
				out = append(out, ns.entries[n].Selection)
			}
		}
		take := func(candidates names) { candidates.each(takeOne) }
		// Their pods, selected by my selector.
		if pairs, ok := narrowest(mine.Selector, ns.byTemplate); ok {
			for _, p := range pairs {
				take(ns.byTemplate[p])
			}
		} else {
			for n := range ns.entries {
				takeOne(n)
			}
		}
		// My pods, selected by theirs.
		for k, v := range mine.TemplateLabels {
			take(ns.byAnchor[labelPair{k, v}])
		}
		for n := range ns.unanchored {
			takeOne(n)
		}
		return out
	})
}

// Feed keeps the index up to date from a Deployment informer (the manager's:
// one watch serves the reconciler and the index). The index answers only once
// the informer has delivered every existing Deployment.
func (x *OverlapIndex) Feed(inf informer) error {
	synced, err := feed(inf, x.Set, x.Delete)
	x.synced = synced
	return err
}

// informer is what feed needs of a shared informer.
type informer interface {
	AddEventHandler(toolscache.ResourceEventHandler) (toolscache.ResourceEventHandlerRegistration, error)
}

// feed keeps an index of objects of type T up to date from inf: set on
// every add and update, forget on a delete (a tombstone's last state too).
// It returns whether inf has delivered what existed when it started.
func feed[T interface {
	GetNamespace() string
	GetName() string
}](inf informer, set func(T), forget func(namespace, name string)) (func() bool, error) {
	reg, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if o, ok := obj.(T); ok {
				set(o)
			}
		},
		UpdateFunc: func(_, obj any) {
			if o, ok := obj.(T); ok {
				set(o)
			}
		},
		DeleteFunc: func(obj any) {
			if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if o, ok := obj.(T); ok {
				forget(o.GetNamespace(), o.GetName())
			}
		},
	})
	if err != nil {
		return nil, err
	}
	return reg.HasSynced, nil
}

// narrowest returns the label pairs of the selector's equality or set
// requirement that the fewest pod templates carry; false when the selector
// has none.
func narrowest(sel labels.Selector, byTemplate map[labelPair]names) ([]labelPair, bool) {
	reqs, _ := sel.Requirements()
	best, bestCount := []labelPair(nil), -1
	for _, r := range reqs {
		pairs := requiredPairs(r)
		if pairs == nil {
			continue
		}
		n := 0
		for _, p := range pairs {
			n += byTemplate[p].len()
		}
		if bestCount < 0 || n < bestCount {
			best, bestCount = pairs, n
		}
	}
	return best, bestCount >= 0
}

// requiredPairs returns the label pairs of which a requirement accepts one:
// k=v for Equals, each k=v for In; nil for operators that accept labels the
// index cannot enumerate.
func requiredPairs(r labels.Requirement) []labelPair {
	switch r.Operator() {
	case selection.Equals, selection.DoubleEquals, selection.In:
		vals := r.Values().UnsortedList()
		out := make([]labelPair, 0, len(vals))
		for _, v := range vals {
			out = append(out, labelPair{r.Key(), v})
		}
		return out
	}
	return nil
}

func (ns *nsSelections) add(s Selection) {
	// Anchor on the requirement the fewest pods satisfy now, so that a common
	// label (part-of, team) does not make every Deployment a candidate.
	anchors, _ := narrowest(s.Selector, ns.byTemplate)
	ns.addAnchored(s, anchors)
}

// addAnchored files s under anchors (none: unanchored).
func (ns *nsSelections) addAnchored(s Selection, anchors []labelPair) {
	f := filed{Selection: s, anchors: anchors}
	ns.entries[s.Name] = f
	for k, v := range s.TemplateLabels {
		addName(ns.byTemplate, labelPair{k, v}, s.Name)
	}
	for _, p := range f.anchors {
		addName(ns.byAnchor, p, s.Name)
	}
	if f.anchors == nil {
		ns.unanchored[s.Name] = struct{}{}
	}
}

func (ns *nsSelections) remove(name string) {
	f, ok := ns.entries[name]
	if !ok {
		return
	}
	delete(ns.entries, name)
	for k, v := range f.TemplateLabels {
		removeName(ns.byTemplate, labelPair{k, v}, name)
	}
	for _, p := range f.anchors {
		removeName(ns.byAnchor, p, name)
	}
	delete(ns.unanchored, name)
}

func addName(m map[labelPair]names, p labelPair, name string) {
	m[p] = m[p].with(name)
}

func removeName(m map[labelPair]names, p labelPair, name string) {
	set, ok := m[p]
	if !ok {
		return
	}
	if set = set.without(name); set.len() == 0 {
		delete(m, p)
	} else {
		m[p] = set
	}
}

// rarest returns the label pairs of sel's requirement that the fewest of
// namespace's pod templates carry now, to file another kind of selector (a
// disruption budget's) under; nil when sel has no equality or set
// requirement.
func (x *OverlapIndex) rarest(namespace string, sel labels.Selector) []labelPair {
	x.mu.RLock()
	defer x.mu.RUnlock()
	var byTemplate map[labelPair]names
	if ns := x.byNS[namespace]; ns != nil {
		byTemplate = ns.byTemplate
	}
	pairs, _ := narrowest(sel, byTemplate)
	return pairs
}

// SelectedBy returns the Deployments of namespace whose pods sel selects
// (none being deleted): a disruption budget's. It costs the Deployments
// carrying sel's rarest required label, the whole namespace only for a
// selector with no equality or set requirement.
func (x *OverlapIndex) SelectedBy(namespace string, sel labels.Selector) ([]Selection, error) {
	return lookup(&x.byNamespace, x.Synced(), namespace, func(ns *nsSelections) (out []Selection) {
		consider := func(n string) {
			if e := ns.entries[n]; !e.Deleting && sel.Matches(e.TemplateLabels) {
				out = append(out, e.Selection)
			}
		}
		pairs, ok := narrowest(sel, ns.byTemplate)
		if !ok {
			for n := range ns.entries {
				consider(n)
			}
			return out
		}
		seen := nameSet{}
		for _, p := range pairs {
			ns.byTemplate[p].each(func(n string) {
				if seen.add(n) {
					consider(n)
				}
			})
		}
		return out
	})
}
