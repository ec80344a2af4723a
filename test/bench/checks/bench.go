package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/analysis"
	"github.com/deployguard/deployguard/reconciler/analysis/checks"
	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/test/bench/load"
	"github.com/deployguard/deployguard/test/harness"
)

// benchLabel marks the bench's namespaces (the check selects them) and
// Deployments (listed by it).
const benchLabel = "bench.deployguard.io/checks"

// failingShare is the 5xx share fed to the failing revisions.
const failingShare = 0.3

type bench struct {
	o       options
	c       client.WithWatch
	l       *harness.Local
	pprof   string
	work    string
	stub    string
	counter *queryCounter
}

func nsName(i int) string { return fmt.Sprintf("checks-%02d", i) }

// deploymentAt is the i-th Deployment: spread over the namespaces in turn.
func (b *bench) deploymentAt(i int) (ns, name string) {
	return nsName(i % b.o.namespaces), fmt.Sprintf("app-%04d", i)
}

// failingAt: the k-th failing Deployment is k×step + k mod namespaces, so
// that they are spread over the namespaces as evenly as over the indexes.
func (b *bench) failingAt(i int) bool {
	if b.o.failing == 0 {
		return false
	}
	step := b.o.deployments / b.o.failing
	k := i / step
	return k < b.o.failing && i == k*step+k%b.o.namespaces
}

func (b *bench) measure(ctx context.Context) (results, error) {
	var res results
	fmt.Printf("Creating %d Deployments (1 replica) in %d namespaces, no check …\n", b.o.deployments, b.o.namespaces)
	start := time.Now()
	if err := b.create(ctx); err != nil {
		return res, err
	}
	if err := b.waitAll(ctx, 10*time.Minute, "revision 1 known-good", func(s state) bool { return s.knownGood == b.o.deployments }); err != nil {
		return res, err
	}
	res.CreateSeconds = time.Since(start).Seconds()
	// The guard has run with checks.prometheus set from the start: until
	// the ClusterDeploymentCheck below, no check selects these revisions.
	if err := b.settle(ctx); err != nil {
		return res, err
	}
	res.NoCheck = b.memory("no-check")
	fmt.Printf("  every revision 1 known-good after %.0fs; guard RSS %d MiB, heap in use %d MiB, live %d MiB\n",
		res.CreateSeconds, res.NoCheck.RSS>>20, res.NoCheck.Heap>>20, res.NoCheck.Live>>20)

	if err := b.c.Create(ctx, b.check()); err != nil {
		return res, fmt.Errorf("creating the ClusterDeploymentCheck: %w", err)
	}
	feed := newFeeder(b.stub)
	feedCtx, stopFeed := context.WithCancel(ctx)
	defer stopFeed()
	feedErrs := make(chan error, 1)
	go feed.run(feedCtx, feedErrs)
	rb := newRollbacks()
	if err := b.watch(feedCtx, feed, rb); err != nil {
		return res, err
	}
	before, err := load.Scrape(b.l.Guard)
	if err != nil {
		return res, err
	}
	fmt.Printf("Rolling all %d out to revision 2 under the check (interval %s, bake window %s); %d of them fed %.0f%% 5xx …\n",
		b.o.deployments, b.o.interval, b.o.bake, b.o.failing, failingShare*100)
	bump := time.Now()
	if err := b.bump(ctx); err != nil {
		return res, err
	}
	res.BumpWriteSeconds = time.Since(bump).Seconds()
	healthy := b.o.deployments - b.o.failing
	q := newQueueWatch(b.l.Guard, b.pprof, filepath.Join(b.work, "guard-goroutines-bump.txt"))
	go q.run(feedCtx)
	var inBake state
	err = b.waitAll(ctx, b.o.bake+10*time.Minute, "every healthy revision 2 in its bake window", func(s state) bool {
		inBake = s
		return s.healthyBaking+s.knownGood2 >= healthy
	})
	if err != nil {
		return res, err
	}
	res.AllInBakeSeconds = time.Since(bump).Seconds()
	res.BakedBeforeAllInBake = inBake.knownGood2
	res.Checked = b.memory("checks")
	fmt.Printf("  every healthy revision in its bake window %.0fs after the bump (%d already known-good then); guard RSS %d MiB, heap in use %d MiB, live %d MiB\n",
		res.AllInBakeSeconds, inBake.knownGood2, res.Checked.RSS>>20, res.Checked.Heap>>20, res.Checked.Live>>20)

	err = b.waitAll(ctx, b.o.bake+10*time.Minute, "every healthy revision 2 known-good and every failing one rolled back", func(s state) bool {
		return s.knownGood2+s.rolledBack == b.o.deployments
	})
	if err != nil {
		return res, err
	}
	end := time.Now()
	res.BumpSeconds = end.Sub(bump).Seconds()
	stopFeed()
	select {
	case err := <-feedErrs:
		fmt.Println("  feeding the stand-in failed at least once:", err)
	default:
	}
	after, err := load.Scrape(b.l.Guard)
	if err != nil {
		return res, err
	}
	res.Queries = queriesFrom(before, after)
	res.StandIn = b.counter.between(bump, end)
	res.Queue = q.result()
	res.Throttled = q.throttled()
	res.GuardCPUSeconds = after.Sum("process_cpu_seconds_total", nil) - before.Sum("process_cpu_seconds_total", nil)
	res.Reconciles = after.Sum("controller_runtime_reconcile_total", map[string]string{"controller": "deployguard-rollout"}) -
		before.Sum("controller_runtime_reconcile_total", map[string]string{"controller": "deployguard-rollout"})
	guardReaction := after.Histogram("deployguard_check_rollback_reaction_seconds", nil).Minus(before.Histogram("deployguard_check_rollback_reaction_seconds", nil))
	res.GuardReaction, res.GuardReaction90 = guardReaction.Quantile(.5), guardReaction.Quantile(.9)
	runs, err := b.runs(ctx)
	if err != nil {
		return res, err
	}
	res.Ledgers = ledgerSummary(runs, b.o.interval)
	res.Reaction = rb.reactions()
	res.Reaction.SeenRollbacks, res.Reaction.SeenFailedRuns = rb.counts()
	return res, nil
}

// create makes the namespaces (labelled for the check) and the
// Deployments, 16 at a time.
func (b *bench) create(ctx context.Context) error {
	for i := range b.o.namespaces {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nsName(i), Labels: map[string]string{benchLabel: "true"}}}
		if err := b.c.Create(ctx, ns); err != nil {
			return err
		}
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for i := range b.o.deployments {
		g.Go(func() error {
			ns, name := b.deploymentAt(i)
			d := harness.Deployment(ns, name, "app:1", harness.Replicas(1))
			d.Labels = map[string]string{benchLabel: "true"}
			return b.c.Create(gctx, d)
		})
	}
	return g.Wait()
}

// check is the ClusterDeploymentCheck: the docs' error rate, on the
// revision's own series (pod_template_hash), failureLimit 1.
func (b *bench) check() *checks.ClusterDeploymentCheck {
	one := int32(1)
	return &checks.ClusterDeploymentCheck{
		ObjectMeta: metav1.ObjectMeta{Name: "bench-error-rate"},
		Spec: checks.ClusterSpec{
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{benchLabel: "true"}},
			Spec: checks.Spec{
				BakeWindow: &metav1.Duration{Duration: b.o.bake},
				Metrics: []analysis.Metric{{
					Name: "error-rate",
					Query: `sum(rate(http_requests_total{namespace="{{.Namespace}}",pod_template_hash="{{.PodTemplateHash}}",code=~"5.."}[30s]))` +
						` / sum(rate(http_requests_total{namespace="{{.Namespace}}",pod_template_hash="{{.PodTemplateHash}}"}[30s]))`,
					SuccessCondition: "len(result) > 0 && result[0] <= 0.05",
					FailureCondition: "len(result) > 0 && result[0] > 0.05",
					Interval:         metav1.Duration{Duration: b.o.interval},
					// One scrape, so that the feeder has the revision's
					// series before its first measurement.
					InitialDelay: metav1.Duration{Duration: scrapeEvery},
					FailureLimit: &one,
				}},
			},
		},
	}
}

// bump rolls every Deployment out to app:2, 16 writes at a time.
func (b *bench) bump(ctx context.Context) error {
	patch := []byte(`{"spec":{"template":{"spec":{"containers":[{"name":"app","image":"app:2"}]}}}}`)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for i := range b.o.deployments {
		g.Go(func() error {
			ns, name := b.deploymentAt(i)
			d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
			return b.c.Patch(gctx, d, client.RawPatch(types.StrategicMergePatchType, patch))
		})
	}
	return g.Wait()
}

// watch feeds every revision 2 ReplicaSet of the bench's Deployments to the
// stand-in as soon as it is created (failing ones at failingShare), and
// times every rollback of revision 2, until ctx ends.
func (b *bench) watch(ctx context.Context, feed *feeder, rb *rollbacks) error {
	failing := b.failingKeys()
	rsw, err := b.c.Watch(ctx, &appsv1.ReplicaSetList{}, client.MatchingLabels{})
	if err != nil {
		return err
	}
	dw, err := b.c.Watch(ctx, &appsv1.DeploymentList{}, client.MatchingLabels{benchLabel: "true"})
	if err != nil {
		rsw.Stop()
		return err
	}
	go func() {
		defer rsw.Stop()
		for ev := range rsw.ResultChan() {
			rs, ok := ev.Object.(*appsv1.ReplicaSet)
			if !ok {
				continue
			}
			owner := metav1.GetControllerOf(rs)
			if owner == nil || rs.Annotations[vocab.RevisionAnnotation] != "2" {
				continue
			}
			share := 0.0
			if failing[rs.Namespace+"/"+owner.Name] {
				share = failingShare
			}
			feed.add(rs.Namespace, rs.Labels[appsv1.DefaultDeploymentUniqueLabelKey], share)
		}
	}()
	go func() {
		defer dw.Stop()
		for ev := range dw.ResultChan() {
			d, ok := ev.Object.(*appsv1.Deployment)
			if !ok || ev.Type != watch.Modified {
				continue
			}
			key := d.Namespace + "/" + d.Name
			l, _ := rollout.ReadLedger(d)
			// The failed run of revision 2 as first seen: after the
			// rollback the restored revision's run (or none) replaces it,
			// so that the Deployments listed at the end no longer hold it.
			if _, failed := l.Checks.FailedTime(); failed && l.Checks.Revision == 2 {
				rb.run(key, l.Checks)
			}
			if l.RolledBackRevision == 2 {
				rb.seen(key, time.Now())
			}
		}
	}()
	return nil
}

// failingKeys are the namespace/name of the Deployments fed 5xx.
func (b *bench) failingKeys() map[string]bool {
	failing := map[string]bool{}
	for i := range b.o.deployments {
		if b.failingAt(i) {
			ns, name := b.deploymentAt(i)
			failing[ns+"/"+name] = true
		}
	}
	return failing
}

// state counts the bench's Deployments by where their revisions are.
type state struct {
	knownGood  int // newest known-good is revision 1
	knownGood2 int // revision 2 known-good (baked)
	baking     int // revision 2 measured, in its bake window
	measuring  int // revision 2 measured, rollout not complete
	rolledBack int // revision 2 rolled back
	// healthyBaking: baking, and not fed 5xx.
	healthyBaking int
}

func (s state) String() string {
	return fmt.Sprintf("%d on revision 1 known-good, %d measured during the rollout, %d in the bake window, %d revision 2 known-good, %d rolled back",
		s.knownGood, s.measuring, s.baking, s.knownGood2, s.rolledBack)
}

func (b *bench) list(ctx context.Context) ([]appsv1.Deployment, error) {
	var l appsv1.DeploymentList
	if err := b.c.List(ctx, &l, client.MatchingLabels{benchLabel: "true"}); err != nil {
		return nil, err
	}
	return l.Items, nil
}

func stateOf(ds []appsv1.Deployment, failing map[string]bool) state {
	var s state
	for i := range ds {
		healthy := !failing[ds[i].Namespace+"/"+ds[i].Name]
		l, _ := rollout.ReadLedger(&ds[i])
		switch newest := l.Newest(); {
		case l.RolledBackRevision == 2:
			s.rolledBack++
		case newest != nil && newest.Revision == 2:
			s.knownGood2++
		case l.Checks != nil && l.Checks.Revision == 2 && l.Checks.BakeUntil != "":
			s.baking++
			if healthy {
				s.healthyBaking++
			}
		case l.Checks != nil && l.Checks.Revision == 2:
			s.measuring++
		case newest != nil && newest.Revision == 1:
			s.knownGood++
		}
	}
	return s
}

// waitAll polls the Deployments' ledgers every 2 s until done holds,
// printing their state every 30 s.
func (b *bench) waitAll(ctx context.Context, timeout time.Duration, what string, done func(state) bool) error {
	var last state
	failing := b.failingKeys()
	told := time.Now()
	err := wait.PollUntilContextTimeout(ctx, 2*time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		ds, err := b.list(ctx)
		if err != nil {
			return false, nil
		}
		last = stateOf(ds, failing)
		if time.Since(told) > 30*time.Second {
			fmt.Println("  …", last)
			told = time.Now()
		}
		return done(last), nil
	})
	if err != nil {
		return fmt.Errorf("waiting for %s: %w; %s", what, err, last)
	}
	return nil
}

// runs reads every Deployment's check run of revision 2.
func (b *bench) runs(ctx context.Context) (map[string]*rollout.CheckRun, error) {
	ds, err := b.list(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]*rollout.CheckRun{}
	for i := range ds {
		if l, _ := rollout.ReadLedger(&ds[i]); l.Checks != nil && l.Checks.Revision == 2 {
			out[ds[i].Namespace+"/"+ds[i].Name] = l.Checks
		}
	}
	return out, nil
}

// settle waits until the guard's reconciler has nothing queued.
func (b *bench) settle(ctx context.Context) error {
	return wait.PollUntilContextTimeout(ctx, time.Second, 10*time.Minute, false, func(ctx context.Context) (bool, error) {
		m, err := load.Scrape(b.l.Guard)
		if err != nil {
			return false, nil
		}
		return m.Sum("workqueue_depth", map[string]string{"name": "deployguard-rollout"}) == 0, nil
	})
}

// memory reads the guard's RSS and heap in use, then forces a collection
// (the heap profile does) and reads the heap in use again, as bench-scale.
func (b *bench) memory(label string) mem {
	var m mem
	m.RSS, _ = load.RSS(b.l.Guard.Pid)
	if s, err := load.Scrape(b.l.Guard); err == nil {
		m.Heap = int64(s.Sum("go_memstats_heap_inuse_bytes", nil))
	}
	if err := load.SaveURL(fmt.Sprintf("http://%s/debug/pprof/heap?gc=1", b.pprof), filepath.Join(b.work, "guard-heap-"+label+".pprof")); err == nil {
		if s, err := load.Scrape(b.l.Guard); err == nil {
			m.Live = int64(s.Sum("go_memstats_heap_inuse_bytes", nil))
		}
	}
	return m
}

// rollbacks times when each rollback was first seen, and keeps the last
// run of revision 2 seen on each Deployment.
type rollbacks struct {
	mu   sync.Mutex
	at   map[string]time.Time
	runs map[string]*rollout.CheckRun
}

func newRollbacks() *rollbacks {
	return &rollbacks{at: map[string]time.Time{}, runs: map[string]*rollout.CheckRun{}}
}

func (r *rollbacks) run(key string, c *rollout.CheckRun) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.runs[key]; !ok {
		r.runs[key] = c
	}
}

// counts are the rollbacks and failed runs the watch saw, for a reaction
// that pairs fewer of them.
func (r *rollbacks) counts() (rollbacks, failedRuns int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.at), len(r.runs)
}

func (r *rollbacks) seen(key string, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.at[key]; !ok {
		r.at[key] = at
	}
}

// reactions pairs each rollback with its run's first failed measurement,
// as the watch last saw the run.
func (r *rollbacks) reactions() reaction {
	r.mu.Lock()
	defer r.mu.Unlock()
	return reactionOf(r.at, r.runs)
}

// queueWatch samples the guard's reconcile queue every 2 s, and its
// goroutines waiting in the kube client's rate limiter every 10 s.
type queueWatch struct {
	g     *harness.Guard
	pprof string
	// dump is where the dump with the most throttled goroutines is kept.
	dump        string
	mu          sync.Mutex
	q           queue
	t           throttled
	first, last load.Histogram
	// work: the reconciles' own durations (workqueue_work_duration_seconds).
	workFirst, workLast load.Histogram
}

func newQueueWatch(g *harness.Guard, pprof, dump string) *queueWatch {
	return &queueWatch{g: g, pprof: pprof, dump: dump}
}

// sampleThrottled reads the guard's goroutine dump.
func (w *queueWatch) sampleThrottled(ctx context.Context) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s/debug/pprof/goroutine?debug=2", w.pprof), nil)
	if err != nil {
		return
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return
	}
	defer resp.Body.Close()
	dump, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return
	}
	n := throttledIn(string(dump))
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.t.Samples == 0 || n > w.t.Max {
		_ = os.WriteFile(w.dump, dump, 0o644)
	}
	w.t.Samples++
	w.t.Sum += n
	w.t.Max = max(w.t.Max, n)
}

func (w *queueWatch) run(ctx context.Context) {
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if i%5 == 0 {
			w.sampleThrottled(ctx)
		}
		m, err := load.Scrape(w.g)
		if err != nil {
			continue
		}
		depth := m.Sum("workqueue_depth", map[string]string{"name": "deployguard-rollout"})
		wait := m.Histogram("workqueue_queue_duration_seconds", map[string]string{"name": "deployguard-rollout"})
		work := m.Histogram("workqueue_work_duration_seconds", map[string]string{"name": "deployguard-rollout"})
		w.mu.Lock()
		w.q.MaxDepth = max(w.q.MaxDepth, depth)
		w.q.Samples++
		w.q.SumDepth += depth
		if w.q.Samples == 1 {
			w.first, w.workFirst = wait, work
		}
		w.last, w.workLast = wait, work
		w.mu.Unlock()
	}
}

func (w *queueWatch) throttled() throttled {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.t
}

func (w *queueWatch) result() queue {
	w.mu.Lock()
	defer w.mu.Unlock()
	q := w.q
	if q.Samples > 0 {
		q.MeanDepth = q.SumDepth / float64(q.Samples)
	}
	h := w.last.Minus(w.first)
	q.WaitP50, q.WaitP99 = h.Quantile(.5), h.Quantile(.99)
	work := w.workLast.Minus(w.workFirst)
	q.WorkP50, q.WorkP99 = work.Quantile(.5), work.Quantile(.99)
	return q
}
