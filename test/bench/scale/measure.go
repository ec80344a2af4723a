package main

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/test/bench/load"
)

// step is what was measured with the cluster at one size.
type step struct {
	Deployments int `json:"deployments"`
	ReplicaSets int `json:"replicaSets"`
	// In the guard, from deployguard_admission_duration_seconds; mutating
	// CREATE is the creates without a selector alone (no other reaches it).
	ValidatingCreate quantiles `json:"validatingCreate"`
	ValidatingUpdate quantiles `json:"validatingUpdate"`
	MutatingCreate   quantiles `json:"mutatingCreate"`
	MutatingUpdate   quantiles `json:"mutatingUpdate"`
	// Through kube-apiserver, dry runs, one at a time; Repair: CREATEs
	// without a selector.
	EndToEndCreate quantiles `json:"endToEndCreate"`
	EndToEndRepair quantiles `json:"endToEndCreateWithoutSelector"`
	EndToEndUpdate quantiles `json:"endToEndUpdate"`
	Failed         int       `json:"failedAdmissions"`
	Memory         memory    `json:"memory"`
	FillSeconds    float64   `json:"fillSeconds"`
}

type quantiles struct {
	P50 time.Duration `json:"p50Ns"`
	P99 time.Duration `json:"p99Ns"`
	// N is how many were observed: 0 where a webhook was not called.
	N int `json:"n"`
}

// memory is the guard's and the control plane's at one moment.
type memory struct {
	GuardRSS  int64 `json:"guardRssBytes"`
	GuardHeap int64 `json:"guardHeapInuseBytes"`
	// GuardLiveHeap is the heap in use right after a full collection: what
	// the guard needs to keep, whatever GOGC lets garbage grow to.
	GuardLiveHeap int64 `json:"guardLiveHeapBytes"`
	APIServerRSS  int64 `json:"kubeApiserverRssBytes"`
	EtcdRSS       int64 `json:"etcdRssBytes"`
	// EtcdDB is etcd's database size, which its quota bounds.
	EtcdDB int64 `json:"etcdDbBytes"`
}

func (b *bench) measureAt(ctx context.Context, n int) (step, error) {
	fmt.Printf("Filling %d namespace(s) to %d Deployments × %d revisions …\n", b.o.namespaces, n, b.o.revisions)
	took, err := b.fill(ctx, n)
	if err != nil {
		return step{}, err
	}
	if err := b.settle(ctx); err != nil {
		return step{}, err
	}
	s := step{Deployments: n, FillSeconds: took.Seconds()}
	if s.ReplicaSets, err = b.count(ctx, "apps/v1", "ReplicaSetList"); err != nil {
		return step{}, err
	}
	if err := b.probeAdmission(ctx, &s); err != nil {
		return step{}, err
	}
	s.Memory = b.memory(ctx, fmt.Sprint(n))
	fmt.Printf("  %d Deployments, %d ReplicaSets, filled in %.0fs: validating CREATE p99 %s in the guard, %s end to end; guard RSS %d MiB, live heap %d MiB\n",
		n, s.ReplicaSets, s.FillSeconds, load.Millis(s.ValidatingCreate.P99), load.Millis(s.EndToEndCreate.P99), s.Memory.GuardRSS>>20, s.Memory.GuardLiveHeap>>20)
	return s, nil
}

// probeAdmission sends the size's probes, one at a time: dry-run CREATEs,
// UPDATEs spread over the cluster, then CREATEs without a selector, and reads
// their latency in the guard and end to end.
func (b *bench) probeAdmission(ctx context.Context, s *step) error {
	n := s.Deployments
	before, err := load.Scrape(b.l.Guard)
	if err != nil {
		return err
	}
	ns := b.namespace(0)
	template := load.Deployment(ns, "probe", 0, b.o.containers, b.o.envVars)
	creates, failedC, errC := load.Latencies(ctx, b.o.probe, func(ctx context.Context, i int) error {
		d := template.DeepCopy()
		d.Name = fmt.Sprintf("probe-%d-%d", n, i)
		return b.c.Create(ctx, d, client.DryRunAll)
	})
	updates, failedU, errU := load.Latencies(ctx, b.o.probe, func(ctx context.Context, i int) error {
		patch := []byte(fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"bench.deployguard.io/probe":"%d"}}}}}`, i))
		k := b.key(i * n / b.o.probe)
		return b.c.Patch(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: k.Namespace, Name: k.Name}},
			client.RawPatch(types.MergePatchType, patch), client.DryRunAll)
	})
	after, err := load.Scrape(b.l.Guard)
	if err != nil {
		return err
	}
	// An ordinary Deployment reaches no mutating webhook (its entries'
	// match conditions and object selector skip it); one without a selector
	// does, and the guard repairs it from the pod labels, its overlap index
	// consulted.
	repairs, failedR, errR := load.Latencies(ctx, b.o.probe, func(ctx context.Context, i int) error {
		d := template.DeepCopy()
		d.Name = fmt.Sprintf("probe-repair-%d-%d", n, i)
		d.Spec.Selector = nil
		return b.c.Create(ctx, d, client.DryRunAll)
	})
	repaired, err := load.Scrape(b.l.Guard)
	if err != nil {
		return err
	}
	for _, e := range []string{errC, errR, errU} {
		if e != "" {
			fmt.Println("  a probe admission failed:", e)
		}
	}
	s.Failed = failedC + failedR + failedU
	s.EndToEndCreate = quantiles{load.Quantile(creates, .5), load.Quantile(creates, .99), len(creates)}
	s.EndToEndRepair = quantiles{load.Quantile(repairs, .5), load.Quantile(repairs, .99), len(repairs)}
	s.EndToEndUpdate = quantiles{load.Quantile(updates, .5), load.Quantile(updates, .99), len(updates)}
	// Between two scrapes: the ordinary CREATEs and UPDATEs, then the
	// CREATEs without a selector, apart.
	in := func(from, to load.Metrics, webhook, op string) quantiles {
		l := map[string]string{"webhook": webhook, "operation": op}
		h := to.Histogram("deployguard_admission_duration_seconds", l).Minus(from.Histogram("deployguard_admission_duration_seconds", l))
		return quantiles{h.Quantile(.5), h.Quantile(.99), int(h.Count)}
	}
	s.ValidatingCreate, s.ValidatingUpdate = in(before, after, "validating", "CREATE"), in(before, after, "validating", "UPDATE")
	s.MutatingCreate, s.MutatingUpdate = in(after, repaired, "mutating", "CREATE"), in(before, after, "mutating", "UPDATE")
	return nil
}

// settle waits until the guard's reconciler has nothing queued.
func (b *bench) settle(ctx context.Context) error {
	return wait.PollUntilContextTimeout(ctx, time.Second, 30*time.Minute, false, func(ctx context.Context) (bool, error) {
		m, err := load.Scrape(b.l.Guard)
		if err != nil {
			return false, nil
		}
		return m.Sum("workqueue_depth", map[string]string{"name": "deployguard-rollout"}) == 0, nil
	})
}

// memory reads the guard's RSS and heap in use, then forces a collection
// (the heap profile does) and reads the heap in use again: the live heap. The
// profile is kept, for `go tool pprof`. kube-apiserver's and etcd's RSS are
// read beside it (0 when their process is not found), and etcd's database
// size.
func (b *bench) memory(ctx context.Context, label string) memory {
	var m memory
	m.EtcdDB, _ = etcdDBBytes(ctx, b.cfg)
	m.GuardRSS, _ = load.RSS(b.l.Guard.Pid)
	if s, err := load.Scrape(b.l.Guard); err == nil {
		m.GuardHeap = int64(s.Sum("go_memstats_heap_inuse_bytes", nil))
	}
	for _, p := range []struct {
		name string
		rss  *int64
	}{{"kube-apiserver", &m.APIServerRSS}, {"etcd", &m.EtcdRSS}} {
		if pid, err := load.FindProcess(p.name, b.l.Cluster.WorkDir); err == nil {
			*p.rss, _ = load.RSS(pid)
		}
	}
	if b.pprof == "" {
		return m
	}
	if err := load.SaveURL(fmt.Sprintf("http://%s/debug/pprof/heap?gc=1", b.pprof), filepath.Join(b.work, "guard-heap-"+label+".pprof")); err == nil {
		if s, err := load.Scrape(b.l.Guard); err == nil {
			m.GuardLiveHeap = int64(s.Sum("go_memstats_heap_inuse_bytes", nil))
		}
	}
	return m
}

// peaks samples the guard every half second until stopped: its highest RSS,
// heap in use and rollout queue depth meanwhile.
type peaks struct {
	mu                    sync.Mutex
	rss, heap, queueDepth int64
	stop, done            chan struct{}
}

func (b *bench) watchPeaks() *peaks {
	p := &peaks{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		for {
			p.sample(b)
			select {
			case <-p.stop:
				return
			case <-t.C:
			}
		}
	}()
	return p
}

func (p *peaks) sample(b *bench) {
	rss, _ := load.RSS(b.l.Guard.Pid)
	var heap, depth int64
	if m, err := load.Scrape(b.l.Guard); err == nil {
		heap = int64(m.Sum("go_memstats_heap_inuse_bytes", nil))
		depth = int64(m.Sum("workqueue_depth", map[string]string{"name": "deployguard-rollout"}))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rss, p.heap, p.queueDepth = max(p.rss, rss), max(p.heap, heap), max(p.queueDepth, depth)
}

// end stops the sampling and returns the peaks.
func (p *peaks) end() (rss, heap, queueDepth int64) {
	close(p.stop)
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rss, p.heap, p.queueDepth
}
