package audit

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/time/rate"
	appsv1 "k8s.io/api/apps/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/deployguard/deployguard/policy"
	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/webhook/exception"
	"github.com/deployguard/deployguard/webhook/review"
)

// Options are the audit's settings from the config file.
type Options struct {
	// Period is the safety-net interval of a full pass.
	Period time.Duration
	// Rate is how many Deployments a second the audit evaluates, at most.
	Rate float64
	// Format is FormatPolicyReport or FormatOpenReports.
	Format string
	// IgnoredNamespaces are never audited (the guard's own, kube-system).
	IgnoredNamespaces []string
	// PageSize is the most whole Deployments a List of the API server
	// returns to a pass; 0 is pageSize.
	PageSize int64
}

// Runner audits on the leader: a full pass on start, on every policy-set
// change and each Period; a namespace again when one of its Deployments
// changes. It reads Deployments from the shared cache, never from the
// admission path, and evaluates at most Rate of them a second.
type Runner struct {
	Client client.Client // reads from the cache, writes to the API server
	// APIReader reads from the API server a Deployment whose cached copy
	// lacks what a policy may read (rollout.Incomplete: its pod template, or
	// annotations the cache trimmed), at the audit's rate: a full pass and
	// the refresh after a policy-set change list them in pages (they need
	// list on Deployments cluster-wide, as the cache does), a partial pass
	// gets each. Nil judges the cached copy as it is: a cache without the
	// guard's transform.
	APIReader client.Reader
	Cache     cache.Cache
	Evaluator *Evaluator
	Metrics   *Metrics
	Options   Options
	Log       logr.Logger
	// Now is the clock of report timestamps.
	Now func() time.Time
	// Status, when set, is told whether reports are written; it outlives
	// the runner, which lasts one leader term.
	Status *Status

	mu    sync.Mutex
	dirty map[client.ObjectKey]bool // Deployments to audit again; the zero key means all
	// known holds each audited Deployment's results between passes, so that a
	// change re-evaluates one Deployment, not its namespace. Passes are only
	// counted: a namespace of 10,000 Deployments keeps its failures and counts.
	known map[string]map[string]entry
	// judgedWith is the digest, by policy name, of the policies every known
	// entry was judged with; nil until the first full pass. A new policy set
	// re-evaluates only the policies whose digest it changed.
	judgedWith map[string]string
	policies   bool // a new policy set is waiting to be audited
	kick       chan struct{}
	// unread is how many Deployments the last pass could not read: marked
	// again, their previous results standing, and retried after a wait.
	unread int
	// listRetry replaces listRetry in tests (nil: listRetry).
	listRetry *wait.Backoff

	missing     atomic.Bool // the report CRD is not installed
	everMissing atomic.Bool
	warnedOnce  sync.Once
}

var _ manager.LeaderElectionRunnable = &Runner{}

// batchWindow gathers the Deployment changes of one second into one pass.
const batchWindow = time.Second

// maxRetryWait bounds the wait before Deployments a pass could not read are
// read again.
const maxRetryWait = 5 * time.Minute

// NeedLeaderElection: one replica writes the reports.
func (r *Runner) NeedLeaderElection() bool { return true }

// ReportsDisabled reports whether the report CRD was found missing.
func (r *Runner) ReportsDisabled() bool { return r.everMissing.Load() }

// Status is what the audit has to say on /readyz's detail.
type Status struct {
	note atomic.Pointer[string]
}

// Note is "" while reports are written, or why they are not.
func (s *Status) Note() string {
	if p := s.note.Load(); p != nil {
		return *p
	}
	return ""
}

func (s *Status) set(note string) {
	if s != nil {
		s.note.Store(&note)
	}
}

// entry is one Deployment's last results: the non-pass ones, and how many
// results of each policy passed.
type entry struct {
	results []Result
	passes  map[string]int
}

func newEntry(results []Result) entry {
	e := entry{passes: map[string]int{}}
	e.add(results)
	return e
}

func (e *entry) add(results []Result) {
	for _, r := range results {
		if r.Result == ResultPass {
			e.passes[r.Policy]++
		} else {
			e.results = append(e.results, r)
		}
	}
}

// replace drops the results of the policies drop selects (by report policy
// name, "deployguard.<name>") and adds results in their place.
func (e entry) replace(drop func(policy string) bool, results []Result) entry {
	n := entry{passes: map[string]int{}}
	for p, c := range e.passes {
		if !drop(p) {
			n.passes[p] = c
		}
	}
	for _, r := range e.results {
		if !drop(r.Policy) {
			n.results = append(n.results, r)
		}
	}
	n.add(results)
	return n
}

func (r *Runner) mark(keys ...client.ObjectKey) {
	r.mu.Lock()
	for _, key := range keys {
		r.dirty[key] = true
	}
	r.mu.Unlock()
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// maxOverlapMarks bounds the Deployments one change marks for their overlap
// results: a Deployment overlapping more is a namespace already in a mess,
// and the period's full pass refreshes the rest.
const maxOverlapMarks = 100

// overlapping returns the Deployments d overlaps as the index knows them now:
// those whose overlap result a change of d (created, new template labels,
// deleted) may turn. It costs d's candidates, never the namespace; nothing
// without an overlap source, or while the index has not synced (the first
// full pass, which waits for it, is yet to come).
func (r *Runner) overlapping(ctx context.Context, d *appsv1.Deployment) []client.ObjectKey {
	if r.Evaluator.Overlaps == nil {
		return nil
	}
	mine, ok := review.SelectionOf(d)
	if !ok {
		return nil
	}
	others, err := r.Evaluator.Overlaps.OverlapCandidates(ctx, d)
	if err != nil {
		return nil
	}
	var keys []client.ObjectKey
	for _, o := range others {
		// CheckOverlap's test without its messages. A Deployment being
		// deleted is marked too: its own result may name d.
		if mine.Selector.Matches(o.TemplateLabels) || o.Selector.Matches(mine.TemplateLabels) {
			keys = append(keys, client.ObjectKey{Namespace: d.Namespace, Name: o.Name})
			if len(keys) == maxOverlapMarks {
				break
			}
		}
	}
	return keys
}

// underBudgets returns the Deployments that share a disruption budget with
// d: their drain result counts d's replicas.
func (r *Runner) underBudgets(d *appsv1.Deployment) []client.ObjectKey {
	if r.Evaluator.Budgets == nil {
		return nil
	}
	budgets, err := r.Evaluator.Budgets.Selecting(d.Namespace, labels.Set(d.Spec.Template.Labels))
	if err != nil {
		return nil
	}
	var keys []client.ObjectKey
	for _, b := range budgets {
		keys = append(keys, r.budgetTargets(d.Namespace, b)...)
	}
	return keys
}

// budgetTargets returns the Deployments a budget selects now.
func (r *Runner) budgetTargets(namespace string, b review.Budget) []client.ObjectKey {
	sels, err := r.Evaluator.Budgets.Targets(namespace, b.Selector)
	if err != nil {
		return nil
	}
	keys := make([]client.ObjectKey, 0, len(sels))
	for _, s := range sels {
		keys = append(keys, client.ObjectKey{Namespace: namespace, Name: s.Name})
	}
	return keys
}

// budgetChanged marks the Deployments a budget selected and selects: a
// budget created, changed or deleted turns their drain result.
func (r *Runner) budgetChanged(pdbs ...any) {
	var keys []client.ObjectKey
	for _, o := range pdbs {
		if t, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
			o = t.Obj
		}
		p, ok := o.(*policyv1.PodDisruptionBudget)
		if !ok || r.ignored(p.Namespace) {
			continue
		}
		if b, ok := review.BudgetOf(p); ok {
			keys = append(keys, r.budgetTargets(p.Namespace, b)...)
		}
	}
	if len(keys) > 0 {
		r.mark(keys...)
	}
}

// covered returns the Deployments e covers, from the cache: those it names,
// or those of its namespace it selects.
func (r *Runner) covered(ctx context.Context, e *exception.Exception) []client.ObjectKey {
	if e == nil || r.ignored(e.Namespace) {
		return nil
	}
	var keys []client.ObjectKey
	if len(e.Names) > 0 {
		for _, n := range e.Names {
			keys = append(keys, client.ObjectKey{Namespace: e.Namespace, Name: n})
		}
		return keys
	}
	var list appsv1.DeploymentList
	if err := r.Client.List(ctx, &list, client.InNamespace(e.Namespace)); err != nil {
		// The period's full pass catches up.
		r.Log.Error(err, "listing the Deployments an exception covers", "exception", e.Name)
		return nil
	}
	for i := range list.Items {
		if e.Covers(&list.Items[i]) {
			keys = append(keys, client.ObjectKeyFromObject(&list.Items[i]))
		}
	}
	return keys
}

// Start runs until ctx ends.
func (r *Runner) Start(ctx context.Context) error {
	if r.Now == nil {
		r.Now = time.Now
	}
	r.dirty, r.kick = map[client.ObjectKey]bool{{}: true}, make(chan struct{}, 1)
	r.known = map[string]map[string]entry{}
	inf, err := r.Cache.GetInformer(ctx, &appsv1.Deployment{})
	if err != nil {
		return fmt.Errorf("audit: getting the Deployment informer: %w", err)
	}
	// touch marks d and, when its overlaps may have changed, the
	// Deployments it overlaps (overlapped, for the old state of an update or
	// the last of a deletion): their results name d, and would otherwise
	// stay stale until the period's full pass. The handlers only read the
	// index and mark; the pass, a batch window later, does the work.
	touch := func(d *appsv1.Deployment, overlaps ...*appsv1.Deployment) {
		keys := []client.ObjectKey{client.ObjectKeyFromObject(d)}
		for _, o := range overlaps {
			keys = append(keys, r.overlapping(ctx, o)...)
		}
		r.mark(keys...)
	}
	reg, err := inf.AddEventHandler(toolscache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(o any, initial bool) {
			// The first pass covers what was there.
			if d, ok := o.(*appsv1.Deployment); ok && !initial {
				touch(d, d)
				r.mark(r.underBudgets(d)...)
			}
		},
		UpdateFunc: func(old, o any) {
			od, ok1 := old.(*appsv1.Deployment)
			nd, ok2 := o.(*appsv1.Deployment)
			if !ok2 {
				return
			}
			switch {
			case !ok1:
				touch(nd, nd)
			// Status-only updates change nothing the checks read.
			case od.Generation == nd.Generation && equalMeta(od, nd):
			case review.OverlapMayChange(od, nd):
				touch(nd, od, nd)
			default:
				touch(nd)
			}
			// A scale, by hand or by an HPA, turns the drain result of every
			// Deployment under the same budgets (nd's own is marked above).
			if ok1 && (rollout.Replicas(od) != rollout.Replicas(nd) || review.OverlapMayChange(od, nd)) {
				r.mark(append(r.underBudgets(od), r.underBudgets(nd)...)...)
			}
		},
		DeleteFunc: func(o any) {
			if t, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
				o = t.Obj
			}
			if d, ok := o.(*appsv1.Deployment); ok {
				touch(d, d)
				// Its pods no longer count under its budgets.
				r.mark(r.underBudgets(d)...)
			}
		},
	})
	if err != nil {
		return fmt.Errorf("audit: watching Deployments: %w", err)
	}
	defer func() { _ = inf.RemoveEventHandler(reg) }()
	if r.Evaluator.Budgets != nil {
		pdbs, err := r.Cache.GetInformer(ctx, &policyv1.PodDisruptionBudget{})
		if err != nil {
			return fmt.Errorf("audit: getting the PodDisruptionBudget informer: %w", err)
		}
		preg, err := pdbs.AddEventHandler(toolscache.ResourceEventHandlerDetailedFuncs{
			AddFunc: func(o any, initial bool) {
				if !initial {
					r.budgetChanged(o)
				}
			},
			UpdateFunc: func(old, o any) {
				op, ok1 := old.(*policyv1.PodDisruptionBudget)
				np, ok2 := o.(*policyv1.PodDisruptionBudget)
				// The disruption controller writes the status often: only
				// the spec turns a result.
				if ok1 && ok2 && op.Generation == np.Generation {
					return
				}
				r.budgetChanged(old, o)
			},
			DeleteFunc: func(o any) { r.budgetChanged(o) },
		})
		if err != nil {
			return fmt.Errorf("audit: watching PodDisruptionBudgets: %w", err)
		}
		defer func() { _ = pdbs.RemoveEventHandler(preg) }()
	}
	if x, ok := r.Evaluator.Exceptions.(*exception.Index); ok {
		// An exception added, changed, removed or expired re-judges what it
		// covered and covers: the report follows within a batch window, not
		// at the next full pass.
		defer x.Watch(func(old, now *exception.Exception) {
			r.mark(append(r.covered(ctx, old), r.covered(ctx, now)...)...)
		})()
	}
	if !r.Cache.WaitForCacheSync(ctx) {
		return nil
	}
	// The overlap index is fed by a handler of its own on the same informer,
	// which may deliver the existing Deployments a moment later: audited
	// before, every overlap result would be an error until the next full pass.
	for _, src := range []any{r.Evaluator.Overlaps, r.Evaluator.Budgets} {
		if s, ok := src.(interface{ Synced() bool }); ok {
			if wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(context.Context) (bool, error) { return s.Synced(), nil }) != nil {
				return nil
			}
		}
	}
	limiter := rate.NewLimiter(rate.Limit(r.Options.Rate), max(1, int(r.Options.Rate)))
	period := time.NewTicker(r.Options.Period)
	defer period.Stop()
	// changed is kept across iterations and renewed only once seen closed: a
	// policy change during a pass or a batch wait closes the channel taken
	// before it, and must not be lost by taking the next one.
	changed := r.Evaluator.Engine.Changed()
	// retry wakes the loop for the Deployments a pass could not read, after
	// a wait that doubles while reads keep failing (any trigger sooner
	// retries them too).
	var retry <-chan time.Time
	retryWait := batchWindow
	for {
		select {
		case <-changed:
			changed = r.Evaluator.Engine.Changed()
			r.policies = true
		default:
		}
		r.mu.Lock()
		dirty := r.dirty
		r.dirty = map[client.ObjectKey]bool{}
		r.mu.Unlock()
		policies := r.policies
		r.policies = false
		if len(dirty) > 0 || policies {
			if err := r.pass(ctx, limiter, dirty, policies); err != nil && ctx.Err() == nil {
				// A failed policy refresh is tried again on the next
				// trigger; the period's full pass catches up at worst.
				r.policies = r.policies || policies
				r.Log.Error(err, "audit pass failed; the next trigger retries", "reason", "AuditFailed")
			}
			switch {
			case r.unread > 0:
				retry = time.After(retryWait)
				retryWait = min(2*retryWait, maxRetryWait)
			case ctx.Err() == nil:
				retryWait = batchWindow
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-r.kick:
			// Changes arriving together (a fill, a GitOps sync) make one
			// pass and one report write per namespace, not one each.
			batch := time.NewTimer(batchWindow)
			select {
			case <-ctx.Done():
				batch.Stop()
				return nil
			case <-batch.C:
			}
		case <-changed:
			// Marked at the top of the loop, where the channel is renewed.
		case <-retry:
			retry = nil
		case <-period.C:
			r.mark(client.ObjectKey{})
		}
	}
}

// equalMeta: the metadata a check or policy may read is unchanged (a
// status-only update changes none of it, nor the generation).
func equalMeta(a, b *appsv1.Deployment) bool {
	return maps.Equal(a.Labels, b.Labels) && maps.Equal(a.Annotations, b.Annotations) &&
		slices.Equal(a.Finalizers, b.Finalizers) && a.DeletionTimestamp.Equal(b.DeletionTimestamp)
}

// pass audits the dirty Deployments (the zero key: every one), and after a
// policy-set change the policies it changed on every Deployment, then writes
// the reports of the namespaces it touched. A Deployment it cannot read
// keeps its previous results and is marked to be audited again: one failed
// read never costs the others' results.
func (r *Runner) pass(ctx context.Context, limiter *rate.Limiter, dirty map[client.ObjectKey]bool, policies bool) error {
	start := time.Now()
	full := dirty[client.ObjectKey{}] || (policies && r.judgedWith == nil)
	scope := "partial"
	touched := map[string]bool{}
	r.unread = 0
	var unread []client.ObjectKey
	var unreadErr error
	failed := func(key client.ObjectKey, err error) {
		unread = append(unread, key)
		if unreadErr == nil {
			unreadErr = err
		}
	}
	evaluate := func(d *appsv1.Deployment) error {
		if err := limiter.Wait(ctx); err != nil {
			return err
		}
		whole, err := r.whole(ctx, d)
		switch {
		case err != nil && ctx.Err() != nil:
			return ctx.Err()
		case err != nil:
			// Its previous results stand until it is read.
			failed(client.ObjectKeyFromObject(d), err)
			return nil
		case whole == nil:
			delete(r.known[d.Namespace], d.Name)
			touched[d.Namespace] = true
			return nil
		}
		d = whole
		if r.known[d.Namespace] == nil {
			r.known[d.Namespace] = map[string]entry{}
		}
		r.known[d.Namespace][d.Name] = newEntry(r.Evaluator.Evaluate(ctx, d))
		touched[d.Namespace] = true
		return nil
	}
	n := 0
	switch {
	case full:
		scope = "full"
		// A full pass looks for the report CRD again: it may have been
		// installed since it was found missing.
		r.missing.Store(false)
		m, err := r.evaluateAll(ctx, limiter, touched, failed)
		n += m
		if err != nil {
			return err
		}
	case policies:
		scope = "policies"
		m, err := r.refreshPolicies(ctx, limiter, dirty, touched, failed)
		n += m
		if err != nil {
			return err
		}
		fallthrough
	default:
		for key := range dirty {
			if r.ignored(key.Namespace) {
				continue
			}
			d := &appsv1.Deployment{}
			err := r.Client.Get(ctx, key, d)
			switch {
			case apierrors.IsNotFound(err):
				delete(r.known[key.Namespace], key.Name)
				touched[key.Namespace] = true
				continue
			case err != nil:
				failed(key, fmt.Errorf("reading Deployment %s from the cache: %w", key, err))
				continue
			}
			if err := evaluate(d); err != nil {
				return err
			}
			n++
		}
	}
	var errs []error
	for ns := range touched {
		if err := r.write(ctx, ns, r.content(ns)); err != nil {
			errs = append(errs, err)
		}
		if len(r.known[ns]) == 0 {
			delete(r.known, ns)
		}
	}
	if full && !r.missing.Load() {
		if r.Metrics != nil {
			r.Metrics.reportsDisabled.Set(0)
		}
		r.Status.set("")
	}
	if full {
		if err := r.dropStale(ctx, namespacesOf(unread)); err != nil {
			errs = append(errs, err)
		}
	}
	r.markUnread(unread, unreadErr)
	if r.Metrics != nil {
		r.Metrics.observePass(time.Since(start), scope, r.known)
	}
	r.Log.V(1).Info("audit pass", "deployments", n, "namespaces", len(touched), "scope", scope, "duration", time.Since(start))
	return errors.Join(errs...)
}

// evaluateAll judges every Deployment the cache lists, outside the ignored
// namespaces, whole and with the active set, and swaps the results in only
// once it is through: a pass that stops half-way leaves the previous results
// whole. The copies the cache keeps incomplete (all of them under the
// guard's transform) are read from the API server in pages (eachWhole). One
// the API server no longer lists is not judged; one it could not list keeps
// its previous results and is handed to failed.
func (r *Runner) evaluateAll(ctx context.Context, limiter *rate.Limiter, touched map[string]bool, failed func(client.ObjectKey, error)) (int, error) {
	// Taken before the list: a set loaded during the pass is newer than
	// some results, and its change is waiting to refresh them.
	set := r.Evaluator.active()
	var list appsv1.DeploymentList
	if err := r.Client.List(ctx, &list); err != nil {
		return 0, fmt.Errorf("listing Deployments: %w", err)
	}
	for ns := range r.known {
		touched[ns] = true // emptied namespaces lose their report
	}
	known := map[string]map[string]entry{}
	n := 0
	judge := func(d *appsv1.Deployment) error {
		if err := limiter.Wait(ctx); err != nil {
			return err
		}
		put(known, client.ObjectKeyFromObject(d), newEntry(r.Evaluator.evaluate(ctx, d, set, nil, true)))
		touched[d.Namespace] = true
		n++
		return nil
	}
	skip := func(key client.ObjectKey) bool { return r.ignored(key.Namespace) }
	unread := func(key client.ObjectKey, err error) {
		if e, ok := r.known[key.Namespace][key.Name]; ok {
			put(known, key, e)
		}
		failed(key, err)
	}
	if err := r.eachWhole(ctx, list.Items, skip, judge, unread); err != nil {
		return n, err
	}
	r.known, r.judgedWith = known, digests(set)
	return n, nil
}

// markUnread marks the Deployments a pass could not read to be audited
// again, without a kick: the run loop retries them after a wait (or at any
// trigger sooner), and says what failed.
func (r *Runner) markUnread(keys []client.ObjectKey, err error) {
	r.unread = len(keys)
	if len(keys) == 0 {
		return
	}
	r.mu.Lock()
	if r.dirty == nil {
		r.dirty = map[client.ObjectKey]bool{}
	}
	for _, key := range keys {
		r.dirty[key] = true
	}
	r.mu.Unlock()
	r.Log.Error(err, "audit: Deployments not read; their previous results stand and they are read again",
		"reason", "AuditReadFailed", "deployments", len(keys), "first", keys[0].String())
}

// put sets a Deployment's entry in known.
func put(known map[string]map[string]entry, key client.ObjectKey, e entry) {
	if known[key.Namespace] == nil {
		known[key.Namespace] = map[string]entry{}
	}
	known[key.Namespace][key.Name] = e
}

// whole returns d as policies may read it: the cached copy when it is
// complete, else the Deployment read from the API server (nil when it is
// gone: the informer's deletion marks it for a new audit). What decides is
// only what the cache transform left, never an annotation a tenant wrote
// (rollout.CacheTrimmed is the transform's own).
func (r *Runner) whole(ctx context.Context, d *appsv1.Deployment) (*appsv1.Deployment, error) {
	if r.APIReader == nil || !rollout.Incomplete(d) {
		return d, nil
	}
	full := &appsv1.Deployment{}
	err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(d), full)
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading Deployment %s/%s from the API server: %w", d.Namespace, d.Name, err)
	}
	return full, nil
}

// refreshPolicies re-evaluates, on every Deployment, the policies the active
// set changed (new module, library or mode, or new policy) and drops the
// results of the policies it removed; the other results stand. Deployments
// in dirty are left to the full evaluation that follows, and a Deployment
// never audited is evaluated whole. Those the cache keeps incomplete are
// read in pages, as a full pass reads them (eachWhole); one the API server
// no longer lists is left to the informer's deletion. One it cannot read
// keeps its previous results and is handed to failed, to be audited whole
// again.
func (r *Runner) refreshPolicies(ctx context.Context, limiter *rate.Limiter, dirty map[client.ObjectKey]bool, touched map[string]bool, failed func(client.ObjectKey, error)) (int, error) {
	set := r.Evaluator.active()
	now := digests(set)
	changed := map[string]bool{}
	drop := map[string]bool{}
	for name, d := range now {
		if r.judgedWith[name] != d {
			changed[name] = true
			drop["deployguard."+name] = true
		}
	}
	for name := range r.judgedWith {
		if _, ok := now[name]; !ok {
			drop["deployguard."+name] = true
		}
	}
	if len(drop) == 0 {
		return 0, nil
	}
	var list appsv1.DeploymentList
	if err := r.Client.List(ctx, &list); err != nil {
		return 0, fmt.Errorf("listing Deployments: %w", err)
	}
	// Recorded first: should the refresh stop half-way, what it refreshed is
	// newer, and the rest is audited again by the retry or the next full pass.
	r.judgedWith = nil
	n := 0
	judge := func(d *appsv1.Deployment) error {
		if err := limiter.Wait(ctx); err != nil {
			return err
		}
		e, ok := r.known[d.Namespace][d.Name]
		if ok {
			e = e.replace(func(p string) bool { return drop[p] },
				r.Evaluator.EvaluatePolicies(ctx, d, set, func(name string) bool { return changed[name] }))
		} else {
			e = newEntry(r.Evaluator.evaluate(ctx, d, set, nil, true))
		}
		put(r.known, client.ObjectKeyFromObject(d), e)
		touched[d.Namespace] = true
		n++
		return nil
	}
	skip := func(key client.ObjectKey) bool { return r.ignored(key.Namespace) || dirty[key] }
	// One it could not read keeps its previous results where they are.
	if err := r.eachWhole(ctx, list.Items, skip, judge, failed); err != nil {
		return n, err
	}
	r.judgedWith = now
	return n, nil
}

// digests are the set's policy digests by name; none without policies.
func digests(set *policy.Set) map[string]string {
	out := map[string]string{}
	if set == nil {
		return out
	}
	for _, p := range set.Policies() {
		out[p.Name] = p.Digest
	}
	return out
}

// content is a namespace's report content from its Deployments' entries.
func (r *Runner) content(ns string) Content {
	var results []Result
	passes := 0
	for _, e := range r.known[ns] {
		results = append(results, e.results...)
		for _, n := range e.passes {
			passes += n
		}
	}
	c := Summarize(results)
	c.Summary.Pass += passes
	return c
}

func (r *Runner) ignored(ns string) bool {
	for _, n := range r.Options.IgnoredNamespaces {
		if n == ns {
			return true
		}
	}
	return false
}

// write updates the namespace's report only when its content changed.
func (r *Runner) write(ctx context.Context, ns string, c Content) error {
	if r.missing.Load() {
		return nil
	}
	gvk, err := GVK(r.Options.Format)
	if err != nil {
		return err
	}
	stored := &unstructured.Unstructured{}
	stored.SetGroupVersionKind(gvk)
	err = r.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: ReportName}, stored)
	switch {
	case meta.IsNoMatchError(err):
		r.noCRD(err)
		return nil
	case apierrors.IsNotFound(err):
		if len(c.Results) == 0 && c.Summary == (Summary{}) {
			return nil
		}
		u, err := Build(r.Options.Format, ns, c, nil, r.Now())
		if err != nil {
			return err
		}
		if err := r.Client.Create(ctx, u); err != nil {
			return fmt.Errorf("creating the report of %s: %w", ns, err)
		}
		r.Metrics.countWrite()
		return nil
	case err != nil:
		return fmt.Errorf("reading the report of %s: %w", ns, err)
	}
	if c.Summary == (Summary{}) {
		if err := r.Client.Delete(ctx, stored); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("deleting the empty report of %s: %w", ns, err)
		}
		r.Metrics.countWrite()
		return nil
	}
	if SameContent(stored, c) {
		return nil
	}
	u, err := Build(r.Options.Format, ns, c, Timestamps(stored), r.Now())
	if err != nil {
		return err
	}
	u.SetResourceVersion(stored.GetResourceVersion())
	if err := r.Client.Update(ctx, u); err != nil {
		return fmt.Errorf("updating the report of %s: %w", ns, err)
	}
	r.Metrics.countWrite()
	return nil
}

// namespacesOf is the set of keys' namespaces.
func namespacesOf(keys []client.ObjectKey) map[string]bool {
	out := map[string]bool{}
	for _, k := range keys {
		out[k.Namespace] = true
	}
	return out
}

// dropStale deletes the guard's reports of namespaces that no longer hold a
// Deployment, after a full pass; not of those in unread, which hold
// Deployments the pass could not read (a failed List leaves a whole tail of
// the cluster so, and the results of a new leader's first pass are all
// they would have had).
func (r *Runner) dropStale(ctx context.Context, unread map[string]bool) error {
	if r.missing.Load() {
		return nil
	}
	gvk, _ := GVK(r.Options.Format)
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
	if err := r.Client.List(ctx, list, client.MatchingLabels{"app.kubernetes.io/managed-by": "deployguard"}); err != nil {
		if meta.IsNoMatchError(err) {
			r.noCRD(err)
			return nil
		}
		return fmt.Errorf("listing reports: %w", err)
	}
	for i := range list.Items {
		u := &list.Items[i]
		if _, ok := r.known[u.GetNamespace()]; ok || unread[u.GetNamespace()] || u.GetName() != ReportName {
			continue
		}
		if err := r.Client.Delete(ctx, u); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("deleting the report of %s: %w", u.GetNamespace(), err)
		}
	}
	return nil
}

// noCRD turns reports off for this process, saying so once.
func (r *Runner) noCRD(err error) {
	r.missing.Store(true)
	if r.Metrics != nil {
		r.Metrics.reportsDisabled.Set(1)
	}
	r.everMissing.Store(true)
	gvk, _ := GVK(r.Options.Format)
	r.Status.set(fmt.Sprintf("the %s CRD (%s) is not installed: the audit evaluates and counts (deployguard_audit_results) but writes no reports until it is; apply config/crd/policyreport", gvk.Kind, gvk.GroupVersion()))
	r.warnedOnce.Do(func() {
		r.Log.Info("the report CRD is not installed: the audit keeps evaluating and counting, and writes no reports until a full pass finds the CRD",
			"reason", "NoReportCRD", "format", r.Options.Format, "error", err.Error())
	})
}
