package review

import (
	"context"
	"fmt"
	"strconv"

	appsv1 "k8s.io/api/apps/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// BudgetSource finds the disruption budgets that select a Deployment's pods,
// and the Deployments a budget selects, without listing a namespace.
type BudgetSource interface {
	// Selecting returns the budgets of namespace that select pods labelled podLabels.
	Selecting(namespace string, podLabels labels.Set) ([]Budget, error)
	// Targets returns the Deployments of namespace whose pods sel selects.
	Targets(namespace string, sel labels.Selector) ([]Selection, error)
}

// BudgetIndex indexes the PodDisruptionBudgets of every namespace as the
// overlap index files selectors: under the label pairs of the requirement
// the fewest of the namespace's Deployments' pods carry when it is filed
// (the overlap index counts them), so that a Deployment finds the budgets
// selecting its pods among those filed under one of its template labels
// (and the few with no such requirement). The Deployments a budget selects
// come from the overlap index, which files them by template label.
type BudgetIndex struct {
	byNamespace
	budgets map[string]map[string]Budget
	// unjudged are the budgets not filed for a selector over the bound,
	// by namespace/name: counted, for the operator (Unjudged).
	unjudged    map[string]struct{}
	synced      func() bool
	Deployments *OverlapIndex
}

// NewBudgetIndex returns an empty index over deployments' Deployments.
func NewBudgetIndex(deployments *OverlapIndex) *BudgetIndex {
	return &BudgetIndex{byNamespace: byNamespace{byNS: map[string]*nsSelections{}}, budgets: map[string]map[string]Budget{},
		unjudged: map[string]struct{}{}, Deployments: deployments}
}

// selectorNotKept marks a budget whose selector StripBudgetForCache dropped;
// its value is the selector's number of terms. Set on the cache's copy after
// every annotation the budget carried is gone, so only the guard writes it.
const selectorNotKept = "deployguard.io/selector-not-kept"

// oversized reports whether p's selector is over the bound, as written or as
// the cache transform left it: marked, with no selector. A manifest that
// carries the mark beside a selector (`deployguard check` files manifests
// untransformed) is judged by its selector.
func oversized(p *policyv1.PodDisruptionBudget) bool {
	_, marked := p.Annotations[selectorNotKept]
	return (marked && p.Spec.Selector == nil) || SelectorTerms(p.Spec.Selector) > MaxBudgetSelectorTerms
}

// StripBudgetForCache is the cache transform of PodDisruptionBudgets. The
// budget index reads a budget's identity, generation, deletion and spec; its
// labels, annotations, owners and finalizers, which tenants write as large as
// the object may be, and its status (an entry per disrupted pod) are not
// kept. Its selector is kept whole, the index needs it exactly, up to
// MaxBudgetSelectorTerms: a larger one is not kept at all, and its budget not
// filed (Set), so that what a tenant writes never sizes the guard. It runs
// once on each object the informer receives, as client-go's informers do:
// run again, it would drop the mark it set.
func StripBudgetForCache(obj any) (any, error) {
	p, ok := obj.(*policyv1.PodDisruptionBudget)
	if !ok {
		return obj, nil
	}
	p.ObjectMeta = metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion,
		Generation: p.Generation, CreationTimestamp: p.CreationTimestamp, DeletionTimestamp: p.DeletionTimestamp}
	if n := SelectorTerms(p.Spec.Selector); n > MaxBudgetSelectorTerms {
		p.Spec.Selector = nil
		p.Annotations = map[string]string{selectorNotKept: strconv.Itoa(n)}
	}
	p.Status = policyv1.PodDisruptionBudgetStatus{}
	return p, nil
}

// Set files (or refiles) a budget; one whose selector is over
// MaxBudgetSelectorTerms is not filed.
func (x *BudgetIndex) Set(p *policyv1.PodDisruptionBudget) {
	b, ok := BudgetOf(p)
	over := oversized(p)
	ok = ok && !over
	var anchors []labelPair
	if ok {
		// Counted before taking this index's lock: the two are never held
		// together.
		if x.Deployments != nil {
			anchors = x.Deployments.rarest(p.Namespace, b.Selector)
		} else {
			anchors, _ = narrowest(b.Selector, nil)
		}
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	x.remove(p.Namespace, p.Name)
	if over {
		x.unjudged[p.Namespace+"/"+p.Name] = struct{}{}
	}
	if !ok {
		return
	}
	ns := x.byNS[p.Namespace]
	if ns == nil {
		ns = newNSSelections()
		x.byNS[p.Namespace] = ns
		x.budgets[p.Namespace] = map[string]Budget{}
	}
	ns.addAnchored(Selection{Name: b.Name, Selector: b.Selector}, anchors)
	x.budgets[p.Namespace][b.Name] = b
}

// Delete forgets a budget.
func (x *BudgetIndex) Delete(namespace, name string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.remove(namespace, name)
}

func (x *BudgetIndex) remove(namespace, name string) {
	delete(x.unjudged, namespace+"/"+name)
	ns := x.byNS[namespace]
	if ns == nil {
		return
	}
	ns.remove(name)
	delete(x.budgets[namespace], name)
	if len(ns.entries) == 0 {
		delete(x.byNS, namespace)
		delete(x.budgets, namespace)
	}
}

// Synced reports whether both informers have delivered what existed.
func (x *BudgetIndex) Synced() bool {
	return (x.synced == nil || x.synced()) && (x.Deployments == nil || x.Deployments.Synced())
}

// Len is the number of budgets filed.
func (x *BudgetIndex) Len() int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	n := 0
	for _, ns := range x.budgets {
		n += len(ns)
	}
	return n
}

// Unjudged is the number of budgets not filed because their selector is over
// MaxBudgetSelectorTerms: the drain check judges none of them.
func (x *BudgetIndex) Unjudged() int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return len(x.unjudged)
}

// Selecting implements BudgetSource.
func (x *BudgetIndex) Selecting(namespace string, podLabels labels.Set) ([]Budget, error) {
	return lookup(&x.byNamespace, x.Synced(), namespace, func(ns *nsSelections) (out []Budget) {
		seen := nameSet{}
		consider := func(n string) {
			if seen.add(n) {
				if b := x.budgets[namespace][n]; b.Selector.Matches(podLabels) {
					out = append(out, b)
				}
			}
		}
		for k, v := range podLabels {
			ns.byAnchor[labelPair{k, v}].each(consider)
		}
		for n := range ns.unanchored {
			consider(n)
		}
		return out
	})
}

// Targets implements BudgetSource.
func (x *BudgetIndex) Targets(namespace string, sel labels.Selector) ([]Selection, error) {
	if x.Deployments == nil {
		return nil, nil
	}
	return x.Deployments.SelectedBy(namespace, sel)
}

// Feed keeps the index up to date from a PodDisruptionBudget informer.
func (x *BudgetIndex) Feed(inf informer) error {
	synced, err := feed(inf, x.Set, x.Delete)
	x.synced = synced
	return err
}

// Indexes returns the overlap and budget indexes, fed by the cache's
// Deployment and PodDisruptionBudget informers (the Deployment one is the
// reconciler's too: one watch).
func Indexes(ctx context.Context, informers cache.Informers) (*OverlapIndex, *BudgetIndex, error) {
	overlaps := NewOverlapIndex(nil)
	if err := feedFrom(ctx, informers, &appsv1.Deployment{}, "Deployment", "the overlap check", overlaps.Feed); err != nil {
		return nil, nil, err
	}
	budgets := NewBudgetIndex(overlaps)
	if err := feedFrom(ctx, informers, &policyv1.PodDisruptionBudget{}, "PodDisruptionBudget", "the drain check", budgets.Feed); err != nil {
		return nil, nil, err
	}
	return overlaps, budgets, nil
}

// feedFrom feeds an index, for check, from the cache's informer of obj's
// kind.
func feedFrom(ctx context.Context, informers cache.Informers, obj client.Object, kind, check string, feed func(informer) error) error {
	inf, err := informers.GetInformer(ctx, obj)
	if err != nil {
		return fmt.Errorf("getting the %s informer: %w", kind, err)
	}
	if err := feed(inf); err != nil {
		return fmt.Errorf("indexing %ss for %s: %w", kind, check, err)
	}
	return nil
}
