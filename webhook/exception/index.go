package exception

import (
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
)

// Exception is a PolicyException as the index keeps it, ready to match.
type Exception struct {
	// Name is the object's namespace/name.
	Name      types.NamespacedName
	UID       types.UID
	Namespace string   // of the Deployments it covers
	Names     []string // empty: every Deployment the selector selects, or the namespace
	Selector  labels.Selector
	Policies  []string
	Checks    []string
	ExpiresAt time.Time
	Owner     string
	Reason    string
}

// Active reports whether e applies at now: until ExpiresAt, not after.
func (e *Exception) Active(now time.Time) bool { return now.Before(e.ExpiresAt) }

// Covers reports whether e exempts d.
func (e *Exception) Covers(d *appsv1.Deployment) bool {
	if d.Namespace != e.Namespace {
		return false
	}
	switch {
	case len(e.Names) > 0:
		return slices.Contains(e.Names, d.Name)
	case e.Selector != nil:
		return e.Selector.Matches(labels.Set(d.Labels))
	}
	return true
}

// Exempts reports whether e exempts the finding of a policy (policy set) or
// of a spec check (check set).
func (e *Exception) Exempts(policy, check string) bool {
	if policy != "" {
		return slices.Contains(e.Policies, policy)
	}
	return slices.Contains(e.Checks, check)
}

// String names e for a message: "PolicyException ns/name until T (owner O)".
func (e *Exception) String() string {
	return fmt.Sprintf("PolicyException %s until %s (owner %s)", e.Name, e.ExpiresAt.UTC().Format(time.RFC3339), e.Owner)
}

// From reads a PolicyException for the index.
func From(pe *PolicyException) (*Exception, error) {
	e := &Exception{
		Name:      types.NamespacedName{Namespace: pe.Namespace, Name: pe.Name},
		UID:       pe.UID,
		Namespace: pe.Spec.Match.Namespace, Names: pe.Spec.Match.Names,
		Policies: pe.Spec.Policies, Checks: pe.Spec.Checks,
		ExpiresAt: pe.Spec.ExpiresAt.Time, Owner: pe.Spec.Owner, Reason: pe.Spec.Reason,
	}
	if pe.Spec.Match.Selector != nil {
		sel, err := metav1.LabelSelectorAsSelector(pe.Spec.Match.Selector)
		if err != nil {
			return nil, err
		}
		e.Selector = sel
	}
	return e, nil
}

// Index holds the exceptions of the one namespace they are honoured in, by
// the namespace they cover and the names they list, so that a Deployment's
// lookup costs the exceptions of its namespace that list it or select by
// labels, never every exception in the cluster.
type Index struct {
	// Namespace is where exceptions are honoured; others are ignored.
	Namespace string

	mu     sync.RWMutex
	all    map[types.NamespacedName]*Exception
	byNS   map[string]*covering
	timers map[types.NamespacedName]*time.Timer
	// watchers are told of each exception that was added, changed, removed
	// or expired, with what it covered before and covers now.
	watchers []*func(old, now *Exception)
}

type covering struct {
	byName map[string][]*Exception
	wide   []*Exception // by selector, or the whole namespace
}

// NewIndex returns an empty index of the exceptions in namespace.
func NewIndex(namespace string) *Index {
	return &Index{Namespace: namespace, all: map[types.NamespacedName]*Exception{}, byNS: map[string]*covering{},
		timers: map[types.NamespacedName]*time.Timer{}}
}

// Watch calls fn, outside the index's lock, whenever an exception is added,
// changed or removed (old or now nil), and at its expiry (old == now).
// The returned func stops the calls.
func (x *Index) Watch(fn func(old, now *Exception)) (stop func()) {
	w := &fn
	x.mu.Lock()
	x.watchers = append(x.watchers, w)
	x.mu.Unlock()
	return func() {
		x.mu.Lock()
		x.watchers = slices.DeleteFunc(x.watchers, func(o *func(old, now *Exception)) bool { return o == w })
		x.mu.Unlock()
	}
}

// Covering returns the exceptions active at now that cover d.
func (x *Index) Covering(d *appsv1.Deployment, now time.Time) []*Exception {
	x.mu.RLock()
	defer x.mu.RUnlock()
	c := x.byNS[d.Namespace]
	if c == nil {
		return nil
	}
	var out []*Exception
	for _, e := range c.byName[d.Name] {
		if e.Active(now) {
			out = append(out, e)
		}
	}
	for _, e := range c.wide {
		if e.Active(now) && e.Covers(d) {
			out = append(out, e)
		}
	}
	return out
}

// List returns every exception, by name.
func (x *Index) List() []*Exception {
	x.mu.RLock()
	out := make([]*Exception, 0, len(x.all))
	for _, e := range x.all {
		out = append(out, e)
	}
	x.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name.String() < out[j].Name.String() })
	return out
}

// Set adds or replaces pe. An exception outside the index's namespace, or
// one that cannot be read, is dropped.
func (x *Index) Set(pe *PolicyException) {
	key := types.NamespacedName{Namespace: pe.Namespace, Name: pe.Name}
	e, err := From(pe)
	if err != nil || (x.Namespace != "" && pe.Namespace != x.Namespace) {
		x.Delete(key)
		return
	}
	x.mu.Lock()
	old := x.remove(key)
	x.all[key] = e
	c := x.byNS[e.Namespace]
	if c == nil {
		c = &covering{byName: map[string][]*Exception{}}
		x.byNS[e.Namespace] = c
	}
	if len(e.Names) > 0 {
		for _, n := range e.Names {
			c.byName[n] = append(c.byName[n], e)
		}
	} else {
		c.wide = append(c.wide, e)
	}
	if wait := time.Until(e.ExpiresAt); wait > 0 {
		// At its expiry the audit judges again what it covered.
		x.timers[key] = time.AfterFunc(wait, func() { x.notify(e, e) })
	}
	x.mu.Unlock()
	x.notify(old, e)
}

// Delete removes the exception named key.
func (x *Index) Delete(key types.NamespacedName) {
	x.mu.Lock()
	old := x.remove(key)
	x.mu.Unlock()
	if old != nil {
		x.notify(old, nil)
	}
}

// remove drops key from the maps; the caller holds the lock.
func (x *Index) remove(key types.NamespacedName) *Exception {
	old := x.all[key]
	if old == nil {
		return nil
	}
	delete(x.all, key)
	if t := x.timers[key]; t != nil {
		t.Stop()
		delete(x.timers, key)
	}
	c := x.byNS[old.Namespace]
	for _, n := range old.Names {
		c.byName[n] = slices.DeleteFunc(c.byName[n], func(e *Exception) bool { return e == old })
		if len(c.byName[n]) == 0 {
			delete(c.byName, n)
		}
	}
	c.wide = slices.DeleteFunc(c.wide, func(e *Exception) bool { return e == old })
	if len(c.byName) == 0 && len(c.wide) == 0 {
		delete(x.byNS, old.Namespace)
	}
	return old
}

func (x *Index) notify(old, now *Exception) {
	x.mu.RLock()
	ws := slices.Clone(x.watchers)
	x.mu.RUnlock()
	for _, w := range ws {
		(*w)(old, now)
	}
}

// Feed keeps the index in step with an informer of PolicyExceptions.
func (x *Index) Feed(inf interface {
	AddEventHandler(toolscache.ResourceEventHandler) (toolscache.ResourceEventHandlerRegistration, error)
}) error {
	_, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { x.setObject(obj) },
		UpdateFunc: func(_, obj any) { x.setObject(obj) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if pe, ok := obj.(*PolicyException); ok {
				x.Delete(types.NamespacedName{Namespace: pe.Namespace, Name: pe.Name})
			}
		},
	})
	return err
}

func (x *Index) setObject(obj any) {
	if pe, ok := obj.(*PolicyException); ok {
		x.Set(pe)
	}
}
