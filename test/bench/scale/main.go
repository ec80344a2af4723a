// Command scale is `make bench-scale`: it fills one namespace of the local
// cluster with Deployments (realistic templates, several revisions each),
// through the guard's real webhooks and reconciler, and at each size records
// the admission latency of CREATE and UPDATE (in the guard, from its own
// histogram, and end to end through kube-apiserver), the guard's memory, and,
// at the largest size, the time a restarted guard takes to sync its caches
// and to reconcile every Deployment once. A set of Deployments with replicas
// rolls out for real, so that known-good marking runs at scale too.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/test/bench/load"
	"github.com/deployguard/deployguard/test/harness"
)

const namespace = "scale"

type options struct {
	tools, guard, workDir, out string
	sizes                      []int
	revisions, clients, probe  int
	rollouts                   int
	containers, envVars        int
	pprof                      bool
	webhooks                   string
}

// step is what was measured with the namespace at one size.
type step struct {
	Deployments int `json:"deployments"`
	ReplicaSets int `json:"replicaSets"`
	// In the guard, from deployguard_admission_duration_seconds.
	ValidatingCreate quantiles `json:"validatingCreate"`
	ValidatingUpdate quantiles `json:"validatingUpdate"`
	MutatingCreate   quantiles `json:"mutatingCreate"`
	MutatingUpdate   quantiles `json:"mutatingUpdate"`
	// Through kube-apiserver, dry runs, one at a time.
	EndToEndCreate quantiles `json:"endToEndCreate"`
	EndToEndUpdate quantiles `json:"endToEndUpdate"`
	Failed         int       `json:"failedAdmissions"`
	GuardRSS       int64     `json:"guardRssBytes"`
	GuardHeap      int64     `json:"guardHeapInuseBytes"`
	// GuardLiveHeap is the heap in use right after a full collection: what
	// the guard needs to keep, whatever GOGC lets garbage grow to.
	GuardLiveHeap int64   `json:"guardLiveHeapBytes"`
	FillSeconds   float64 `json:"fillSeconds"`
}

type quantiles struct {
	P50 time.Duration `json:"p50Ns"`
	P99 time.Duration `json:"p99Ns"`
}

type restart struct {
	Deployments     int           `json:"deployments"`
	Ready           time.Duration `json:"readyNs"`
	ReconciledAll   time.Duration `json:"reconciledAllNs"`
	GuardRSS        int64         `json:"guardRssBytes"`
	GuardHeap       int64         `json:"guardHeapInuseBytes"`
	GuardLiveHeap   int64         `json:"guardLiveHeapBytes"`
	RolloutsMarked  int           `json:"rolloutsMarkedKnownGood"`
	RolloutsSeconds float64       `json:"rolloutsSeconds"`
}

func main() {
	var o options
	sizes := flag.String("sizes", "100,1000,5000,10000", "namespace sizes to measure at, in Deployments, increasing")
	flag.StringVar(&o.tools, "tools", "", "the control plane binaries (make tools)")
	flag.StringVar(&o.guard, "guard", "bin/deployguard", "the deployguard binary")
	flag.StringVar(&o.workDir, "workdir", "bin/bench-scale", "folder for the cluster and the logs")
	flag.StringVar(&o.out, "out", "bin/bench-scale.json", "where the results are written as JSON")
	flag.IntVar(&o.revisions, "revisions", 3, "revisions (ReplicaSets) of every Deployment")
	flag.IntVar(&o.clients, "clients", 8, "concurrent clients filling the namespace")
	flag.IntVar(&o.probe, "probe", 200, "admissions of each kind measured at each size")
	flag.IntVar(&o.rollouts, "rollouts", 30, "Deployments with replicas that roll out for real at the largest size")
	flag.IntVar(&o.containers, "containers", 2, "containers per pod template")
	flag.IntVar(&o.envVars, "env", 30, "env vars per container")
	flag.StringVar(&o.webhooks, "webhooks", "", "webhook configurations to install (default: config/webhook/manifests.yaml; an earlier version's, to compare)")
	flag.BoolVar(&o.pprof, "pprof", true, "serve the guard's pprof and measure its live heap (a guard built before --pprof-bind-address existed needs false)")
	flag.Parse()
	for _, s := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 || (len(o.sizes) > 0 && n <= o.sizes[len(o.sizes)-1]) {
			fmt.Fprintf(os.Stderr, "bench-scale: -sizes: want increasing positive numbers, got %q\n", *sizes)
			os.Exit(2)
		}
		o.sizes = append(o.sizes, n)
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "bench-scale:", err)
		os.Exit(1)
	}
}

func run(o options) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	tools, work, logFile, err := load.Prepare(o.tools, o.workDir)
	if err != nil {
		return err
	}
	defer logFile.Close()
	o.tools = tools

	fmt.Println("Starting the local cluster and the guard (default configuration, deployed Go runtime settings) …")
	// The controllers' client rate limits (20 requests/s by default) would make
	// filling the namespace take hours; the guard's own client is not changed.
	pprofPort, err := harness.FreePort()
	if err != nil {
		return err
	}
	pprofAddr := fmt.Sprintf("127.0.0.1:%d", pprofPort)
	var guardArgs []string
	if o.pprof {
		guardArgs = []string{"--pprof-bind-address", pprofAddr}
	} else {
		pprofAddr = ""
	}
	l, err := harness.StartLocal(ctx, harness.LocalOptions{Tools: o.tools, Guard: o.guard, Name: "dg-bench-scale", WorkDir: work, Nodes: 2, Log: logFile,
		ClusterArgs: []string{"--disable-qps-limits"}, GuardArgs: guardArgs, WebhookManifests: o.webhooks,
		CRDs: []string{filepath.Join(harness.RepoRoot(), "config", "crd", "policyreport")}})
	if err != nil {
		return err
	}
	defer l.Stop()
	cfg, err := l.Cluster.RESTConfig()
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = 10000, 10000
	cfg.WarningHandler = rest.NoWarnings{}
	c, err := client.New(cfg, client.Options{Scheme: l.Scheme})
	if err != nil {
		return err
	}
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil {
		return err
	}

	b := &bench{o: o, c: c, l: l, pprof: pprofAddr, work: work}
	var steps []step
	for _, n := range o.sizes {
		s, err := b.measureAt(ctx, n)
		if err != nil {
			return err
		}
		steps = append(steps, s)
	}
	r, err := b.restartAndRollouts(ctx)
	if err != nil {
		return err
	}
	a, err := b.auditPass(ctx)
	if err != nil {
		return err
	}
	printTables(os.Stdout, steps, r)
	fmt.Printf("\nAudit with %d Deployments: the start-up full pass took %.1fs (rate limit %d/s); a new policy's results on every Deployment (%d failing) took %.1fs from its ConfigMap and %.1fs of the guard's CPU; "+
		"the namespace's PolicyReport is %d bytes as stored (%d results listed, %s omitted, summary %v)\n",
		a.Deployments, a.FullPassSeconds, auditRate, a.Failing, a.PolicySeconds, a.CPUSeconds, a.ReportBytes, a.Listed, a.Omitted, a.Summary)
	out, err := json.MarshalIndent(map[string]any{
		"date": time.Now().UTC().Format(time.RFC3339), "revisions": o.revisions, "containers": o.containers, "envVars": o.envVars,
		"steps": steps, "restart": r, "audit": a,
	}, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(o.out, out, 0o644)
}

type bench struct {
	o       options
	c       client.Client
	l       *harness.Local
	pprof   string // the guard's pprof address
	work    string
	created int
}

func name(i int) string { return fmt.Sprintf("app-%05d", i) }

// fill creates Deployments up to n, each given its revisions, by concurrent
// clients, and waits until the Deployment controller has created every
// ReplicaSet.
func (b *bench) fill(ctx context.Context, n int) (time.Duration, error) {
	start := time.Now()
	next := atomic.Int64{}
	next.Store(int64(b.created))
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	for range b.o.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := b.createWithRevisions(ctx, i); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return 0, firstErr
	}
	b.created = n
	err := wait.PollUntilContextTimeout(ctx, time.Second, 30*time.Minute, true, func(ctx context.Context) (bool, error) {
		rss, err := b.count(ctx, "ReplicaSetList")
		return rss >= n*b.o.revisions, err
	})
	return time.Since(start), err
}

func (b *bench) createWithRevisions(ctx context.Context, i int) error {
	d := load.Deployment(namespace, name(i), 0, b.o.containers, b.o.envVars)
	if err := retry(ctx, func() error { return b.c.Create(ctx, d) }); err != nil {
		return fmt.Errorf("creating %s: %w", d.Name, err)
	}
	for r := 2; r <= b.o.revisions; r++ {
		// A revision the Deployment controller has not seen would be folded
		// into the next one: one ReplicaSet fewer.
		if err := b.waitObserved(ctx, d.Name); err != nil {
			return err
		}
		patch := []byte(fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"bench.deployguard.io/revision":"%d"}}}}}`, r))
		if err := retry(ctx, func() error {
			return b.c.Patch(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: d.Name}}, client.RawPatch(types.MergePatchType, patch))
		}); err != nil {
			return fmt.Errorf("revision %d of %s: %w", r, d.Name, err)
		}
	}
	return nil
}

// waitObserved waits until the Deployment controller has synced the
// Deployment's current generation (and so created its newRS).
func (b *bench) waitObserved(ctx context.Context, name string) error {
	return wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		d := &appsv1.Deployment{}
		if err := b.c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, d); err != nil {
			return false, nil
		}
		return d.Status.ObservedGeneration >= d.Generation, nil
	})
}

// retry retries a write the API server throttled or timed out.
func retry(ctx context.Context, f func() error) error {
	var err error
	for attempt := range 5 {
		if err = f(); err == nil || ctx.Err() != nil {
			return err
		}
		if !strings.Contains(err.Error(), "timeout") && !strings.Contains(err.Error(), "TooManyRequests") && !strings.Contains(err.Error(), "connection") {
			return err
		}
		time.Sleep(time.Duration(attempt+1) * 200 * time.Millisecond)
	}
	return err
}

// count counts the objects of a list kind in the namespace, metadata only.
func (b *bench) count(ctx context.Context, listKind string) (int, error) {
	l := &metav1.PartialObjectMetadataList{}
	l.SetGroupVersionKind(appsv1.SchemeGroupVersion.WithKind(listKind))
	if err := b.c.List(ctx, l, client.InNamespace(namespace)); err != nil {
		return 0, err
	}
	return len(l.Items), nil
}

// settle waits until the guard's reconciler has nothing queued and its
// memory has stopped growing.
func (b *bench) settle(ctx context.Context) error {
	return wait.PollUntilContextTimeout(ctx, time.Second, 20*time.Minute, false, func(ctx context.Context) (bool, error) {
		m, err := load.Scrape(b.l.Guard)
		if err != nil {
			return false, nil
		}
		return m.Sum("workqueue_depth", map[string]string{"name": "deployguard-rollout"}) == 0, nil
	})
}

// memory reads the guard's RSS and heap in use, then forces a collection
// (the heap profile does) and reads the heap in use again: the live heap. The
// profile is kept, for `go tool pprof`.
func (b *bench) memory(label string) (rss, heap, live int64) {
	rss, _ = load.RSS(b.l.Guard.Pid)
	if m, err := load.Scrape(b.l.Guard); err == nil {
		heap = int64(m.Sum("go_memstats_heap_inuse_bytes", nil))
	}
	if b.pprof == "" {
		return rss, heap, 0
	}
	if err := load.SaveURL(fmt.Sprintf("http://%s/debug/pprof/heap?gc=1", b.pprof), filepath.Join(b.work, "guard-heap-"+label+".pprof")); err == nil {
		if m, err := load.Scrape(b.l.Guard); err == nil {
			live = int64(m.Sum("go_memstats_heap_inuse_bytes", nil))
		}
	}
	return rss, heap, live
}

func (b *bench) measureAt(ctx context.Context, n int) (step, error) {
	fmt.Printf("Filling namespace %s to %d Deployments × %d revisions …\n", namespace, n, b.o.revisions)
	took, err := b.fill(ctx, n)
	if err != nil {
		return step{}, err
	}
	if err := b.settle(ctx); err != nil {
		return step{}, err
	}
	s := step{Deployments: n, FillSeconds: took.Seconds()}
	s.ReplicaSets, _ = b.count(ctx, "ReplicaSetList")
	before, err := load.Scrape(b.l.Guard)
	if err != nil {
		return step{}, err
	}
	template := load.Deployment(namespace, "probe", 0, b.o.containers, b.o.envVars)
	creates, failedC, errC := load.Latencies(ctx, b.o.probe, func(ctx context.Context, i int) error {
		d := template.DeepCopy()
		d.Name = fmt.Sprintf("probe-%d-%d", n, i)
		return b.c.Create(ctx, d, client.DryRunAll)
	})
	updates, failedU, errU := load.Latencies(ctx, b.o.probe, func(ctx context.Context, i int) error {
		patch := []byte(fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"bench.deployguard.io/probe":"%d"}}}}}`, i))
		return b.c.Patch(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name(i * n / b.o.probe)}},
			client.RawPatch(types.MergePatchType, patch), client.DryRunAll)
	})
	after, err := load.Scrape(b.l.Guard)
	if err != nil {
		return step{}, err
	}
	for _, e := range []string{errC, errU} {
		if e != "" {
			fmt.Println("  a probe admission failed:", e)
		}
	}
	s.Failed = failedC + failedU
	s.EndToEndCreate = quantiles{load.Quantile(creates, .5), load.Quantile(creates, .99)}
	s.EndToEndUpdate = quantiles{load.Quantile(updates, .5), load.Quantile(updates, .99)}
	in := func(webhook, op string) quantiles {
		l := map[string]string{"webhook": webhook, "operation": op}
		h := after.Histogram("deployguard_admission_duration_seconds", l).Minus(before.Histogram("deployguard_admission_duration_seconds", l))
		return quantiles{h.Quantile(.5), h.Quantile(.99)}
	}
	s.ValidatingCreate, s.ValidatingUpdate = in("validating", "CREATE"), in("validating", "UPDATE")
	s.MutatingCreate, s.MutatingUpdate = in("mutating", "CREATE"), in("mutating", "UPDATE")
	s.GuardRSS, s.GuardHeap, s.GuardLiveHeap = b.memory(strconv.Itoa(n))
	fmt.Printf("  %d Deployments, %d ReplicaSets: validating CREATE p99 %s in the guard, %s end to end; guard RSS %d MiB\n",
		n, s.ReplicaSets, load.Millis(s.ValidatingCreate.P99), load.Millis(s.EndToEndCreate.P99), s.GuardRSS>>20)
	return s, nil
}

// restartAndRollouts restarts the guard (as a rolling update would: SIGTERM,
// then a new process) and measures how long it takes to be ready and to
// reconcile every Deployment once; then rolls out Deployments with replicas.
func (b *bench) restartAndRollouts(ctx context.Context) (restart, error) {
	r := restart{Deployments: b.created}
	fmt.Printf("Restarting the guard with %d Deployments in the namespace …\n", b.created)
	port := b.l.Guard.Opts.WebhookPort
	if err := b.l.Guard.Stop(); err != nil {
		return r, err
	}
	start := time.Now()
	g, err := harness.StartGuard(harness.GuardOptions{
		Binary: b.o.guard, Kubeconfig: b.l.GuardKubeconfig, WorkDir: filepath.Join(b.l.Opts.WorkDir, "guard"),
		WebhookPort: port, Env: harness.DeployedRuntimeEnv(), Output: b.l.Opts.Log, ExtraArgs: b.l.Opts.GuardArgs,
	})
	if err != nil {
		return r, err
	}
	b.l.Guard = g
	if err := g.WaitReady(ctx, 10*time.Minute); err != nil {
		return r, err
	}
	r.Ready = time.Since(start)
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 20*time.Minute, true, func(ctx context.Context) (bool, error) {
		m, err := load.Scrape(g)
		if err != nil {
			return false, nil
		}
		// The first list queues every Deployment once (the queue folds the
		// ReplicaSet events of a queued Deployment into it): done when as many
		// reconciles as Deployments have run and nothing is queued.
		return m.Sum("controller_runtime_reconcile_total", map[string]string{"controller": "deployguard-rollout"}) >= float64(b.created) &&
			m.Sum("workqueue_depth", map[string]string{"name": "deployguard-rollout"}) == 0, nil
	})
	if err != nil {
		return r, fmt.Errorf("waiting for every Deployment to be reconciled: %w", err)
	}
	r.ReconciledAll = time.Since(start)
	if err := b.settle(ctx); err != nil {
		return r, err
	}
	r.GuardRSS, r.GuardHeap, r.GuardLiveHeap = b.memory("restarted")
	fmt.Printf("  ready after %s, every Deployment reconciled after %s\n", r.Ready.Round(100*time.Millisecond), r.ReconciledAll.Round(100*time.Millisecond))

	fmt.Printf("Rolling out %d Deployments with 2 replicas, twice …\n", b.o.rollouts)
	start = time.Now()
	for i := range b.o.rollouts {
		d := load.Deployment(namespace, fmt.Sprintf("live-%03d", i), 2, 1, 5)
		if err := b.c.Create(ctx, d); err != nil {
			return r, err
		}
	}
	if err := b.waitKnownGood(ctx, "1"); err != nil {
		return r, err
	}
	for i := range b.o.rollouts {
		d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: fmt.Sprintf("live-%03d", i)}}
		patch := []byte(`{"spec":{"template":{"spec":{"containers":[{"name":"c0","image":"registry.example.com/bench/c0:2.0.0"}]}}}}`)
		if err := b.c.Patch(ctx, d, client.RawPatch(types.StrategicMergePatchType, patch)); err != nil {
			return r, err
		}
	}
	if err := b.waitKnownGood(ctx, "2"); err != nil {
		return r, err
	}
	r.RolloutsMarked, r.RolloutsSeconds = b.o.rollouts, time.Since(start).Seconds()
	return r, nil
}

func (b *bench) waitKnownGood(ctx context.Context, revision string) error {
	return wait.PollUntilContextTimeout(ctx, time.Second, 10*time.Minute, true, func(ctx context.Context) (bool, error) {
		for i := range b.o.rollouts {
			d := &appsv1.Deployment{}
			if err := b.c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: fmt.Sprintf("live-%03d", i)}, d); err != nil {
				return false, err
			}
			l, _ := rollout.ReadLedger(d)
			if n := l.Newest(); n == nil || strconv.FormatInt(n.Revision, 10) != revision {
				return false, nil
			}
		}
		return true, nil
	})
}

func printTables(w io.Writer, steps []step, r restart) {
	fmt.Fprintln(w, "\n| Deployments | ReplicaSets | validating CREATE p50 / p99 | validating UPDATE p50 / p99 | mutating CREATE p99 | mutating UPDATE p99 | end to end CREATE p50 / p99 | end to end UPDATE p50 / p99 | guard RSS | guard heap in use / live | failed |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|")
	for _, s := range steps {
		fmt.Fprintf(w, "| %d | %d | %s / %s | %s / %s | %s | %s | %s / %s | %s / %s | %d MiB | %d / %d MiB | %d |\n",
			s.Deployments, s.ReplicaSets,
			load.Millis(s.ValidatingCreate.P50), load.Millis(s.ValidatingCreate.P99),
			load.Millis(s.ValidatingUpdate.P50), load.Millis(s.ValidatingUpdate.P99),
			load.Millis(s.MutatingCreate.P99), load.Millis(s.MutatingUpdate.P99),
			load.Millis(s.EndToEndCreate.P50), load.Millis(s.EndToEndCreate.P99),
			load.Millis(s.EndToEndUpdate.P50), load.Millis(s.EndToEndUpdate.P99),
			s.GuardRSS>>20, s.GuardHeap>>20, s.GuardLiveHeap>>20, s.Failed)
	}
	fmt.Fprintf(w, "\nRestart with %d Deployments: ready (caches synced, overlap index built) after %s; every Deployment reconciled after %s; RSS then %d MiB, heap in use %d MiB, live %d MiB.\n",
		r.Deployments, r.Ready.Round(10*time.Millisecond), r.ReconciledAll.Round(10*time.Millisecond), r.GuardRSS>>20, r.GuardHeap>>20, r.GuardLiveHeap>>20)
	fmt.Fprintf(w, "%d Deployments with replicas rolled out twice and marked known-good each time in %.1f s.\n", r.RolloutsMarked, r.RolloutsSeconds)
}

// auditRate is the default config's audit.rate, which the bench measures.
const auditRate = 200

// auditResult is what the audit costs at the largest size.
type auditResult struct {
	Deployments int `json:"deployments"`
	// FullPassSeconds is the start-up pass over every Deployment after the
	// guard's restart (its own duration metric); its CPU is not told apart
	// from the start-up's.
	FullPassSeconds float64 `json:"fullPassSeconds"`
	// PolicySeconds and CPUSeconds: from a new policy's ConfigMap to its
	// results on every Deployment, and the guard's CPU meanwhile.
	PolicySeconds float64        `json:"policyChangeSeconds"`
	CPUSeconds    float64        `json:"guardCpuSeconds"`
	Failing       int            `json:"failing"`
	ReportBytes   int            `json:"reportBytes"`
	Listed        int            `json:"resultsListed"`
	Omitted       string         `json:"omittedResults"`
	Summary       map[string]any `json:"summary"`
}

// auditPass waits for the guard's start-up audit pass, then loads a policy,
// in audit mode, that every Deployment of the namespace fails, and measures
// until the audit's results count every one of them: the time, the guard's
// CPU meanwhile, and the report it leaves (its JSON is what etcd stores for
// a custom resource).
func (b *bench) auditPass(ctx context.Context) (auditResult, error) {
	a := auditResult{Deployments: b.created}
	g := b.l.Guard
	full := map[string]string{"scope": "full"}
	fmt.Printf("Waiting for the audit's start-up pass over %d Deployments …\n", b.created)
	var before load.Metrics
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 30*time.Minute, true, func(context.Context) (bool, error) {
		m, err := load.Scrape(g)
		if err != nil {
			return false, nil
		}
		before = m
		return m.Histogram("deployguard_audit_pass_duration_seconds", full).Count > 0, nil
	})
	if err != nil {
		return a, fmt.Errorf("waiting for the start-up audit pass: %w", err)
	}
	a.FullPassSeconds = before.Histogram("deployguard_audit_pass_duration_seconds", full).Sum
	fmt.Printf("Auditing %d Deployments after a policy change …\n", b.created)
	owner := map[string]string{"policy": "deployguard.benchowner", "result": "fail"}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "bench-audit-policy", Namespace: harness.GuardNamespace, Labels: map[string]string{vocab.LabelPolicy: "true"}},
		Data: map[string]string{"owner.rego": `# METADATA
# custom:
#   mode: audit
#   severity: medium
#   category: Ownership
package deployguard.benchowner

deny contains {"msg": "every Deployment needs an owner label", "field": "metadata.labels.owner"} if {
	not input.object.metadata.labels.owner
}
`},
	}
	created := time.Now()
	if err := b.c.Create(ctx, cm); err != nil {
		return a, err
	}
	var after load.Metrics
	// Done when the audit counts a failure of the new policy on every
	// Deployment: polled each 250 ms, hot reload included.
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 30*time.Minute, false, func(context.Context) (bool, error) {
		m, err := load.Scrape(g)
		if err != nil {
			return false, nil
		}
		after = m
		return int(m.Sum("deployguard_audit_results", owner)) >= b.created, nil
	})
	if err != nil {
		return a, fmt.Errorf("waiting for the audit to fail every Deployment on the new policy: %w", err)
	}
	a.PolicySeconds = time.Since(created).Seconds()
	a.Failing = int(after.Sum("deployguard_audit_results", owner))
	a.CPUSeconds = after.Sum("process_cpu_seconds_total", nil) - before.Sum("process_cpu_seconds_total", nil)
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("wgpolicyk8s.io/v1alpha2")
	u.SetKind("PolicyReport")
	if err := b.c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "deployguard"}, u); err != nil {
		return a, fmt.Errorf("reading the namespace's PolicyReport: %w", err)
	}
	raw, err := json.Marshal(u.Object)
	if err != nil {
		return a, err
	}
	a.ReportBytes = len(raw)
	results, _, _ := unstructured.NestedSlice(u.Object, "results")
	a.Listed = len(results)
	a.Summary, _, _ = unstructured.NestedMap(u.Object, "summary")
	a.Omitted = u.GetAnnotations()["deployguard.io/omitted-results"]
	return a, nil
}
