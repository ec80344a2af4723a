// Command scale is `make bench-scale`: it fills a local cluster with
// Deployments (realistic templates, several revisions each) spread over
// namespaces, through the guard's real webhooks and reconciler, and in one
// run reports what the guard costs at that size:
//
//   - at each size: the admission latency of CREATE and UPDATE (in the guard,
//     from its own histogram, and end to end through kube-apiserver), the
//     guard's RSS and heap in use, and its live heap after a forced
//     collection; the control plane's RSS beside it;
//   - at the largest size: the time a restarted guard takes to be ready, to
//     serve the webhooks, to reconcile every Deployment once and to finish the
//     audit's start-up pass; one audit pass after a policy change, its time,
//     CPU and memory;
//   - the reaction to failed rollouts with every other Deployment in the
//     cache: one alone, then a cluster-wide image bump of many Deployments
//     with a tenth of them failing (fail-fast on pods that cannot pull);
//   - the snapshot, record and report objects the guard keeps.
//
// The files: fill.go fills the cluster, measure.go measures a size and the
// guard's memory, restart.go the restart and the audit, react.go the
// rollbacks, report.go prints the table. README.md says how to run it and
// holds the figures.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/deployguard/deployguard/test/bench/load"
	"github.com/deployguard/deployguard/test/harness"
)

type options struct {
	tools, guard, workDir, out string
	sizes                      []int
	namespaces                 int
	revisions, clients, probe  int
	// live is how many Deployments with a replica roll out for real (the
	// image bump); a tenth of them fail.
	live                int
	containers, envVars int
	memoryLimitMiB      int
	pprof               bool
	webhooks            string
}

// largest is the size the cluster is filled to.
func (o options) largest() int { return o.sizes[len(o.sizes)-1] }

func main() {
	var o options
	deployments := flag.Int("deployments", 50000, "Deployments the cluster is filled to, where everything is measured")
	sizes := flag.String("sizes", "1000", "smaller sizes to measure admission and memory at on the way, in Deployments, increasing (those not below -deployments are left out)")
	flag.StringVar(&o.tools, "tools", "", "the control plane binaries (make tools)")
	flag.StringVar(&o.guard, "guard", "bin/deployguard", "the deployguard binary")
	flag.StringVar(&o.workDir, "workdir", "bin/bench-scale", "folder for the cluster and the logs")
	flag.StringVar(&o.out, "out", "bin/bench-scale.json", "where the results are written as JSON")
	flag.IntVar(&o.namespaces, "namespaces", 500, "namespaces the Deployments are spread over (1: the namespace scale alone)")
	flag.IntVar(&o.revisions, "revisions", 3, "revisions (ReplicaSets) of every Deployment")
	flag.IntVar(&o.clients, "clients", 8, "concurrent clients filling the cluster")
	flag.IntVar(&o.probe, "probe", 200, "admissions of each kind measured at each size")
	flag.IntVar(&o.live, "live", 0, "Deployments with a replica rolled out at once by the image bump, a tenth of them to an image that cannot be pulled (0: one per 100 Deployments, at least 10)")
	flag.IntVar(&o.containers, "containers", 2, "containers per pod template")
	flag.IntVar(&o.envVars, "env", 30, "env vars per container")
	flag.IntVar(&o.memoryLimitMiB, "memory-limit", 0, "the guard's memory limit in MiB (DEPLOYGUARD_MEMORY_LIMIT; 0: test/README's advice, the deployed 256 up to 1,000 Deployments, 768 up to 10,000, 3584 above)")
	flag.StringVar(&o.webhooks, "webhooks", "", "webhook configurations to install (default: config/webhook/manifests.yaml; an earlier version's, to compare)")
	flag.BoolVar(&o.pprof, "pprof", true, "serve the guard's pprof and measure its live heap (a guard built before --pprof-bind-address existed needs false)")
	flag.Parse()
	for _, s := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 || (len(o.sizes) > 0 && n <= o.sizes[len(o.sizes)-1]) {
			fmt.Fprintf(os.Stderr, "bench-scale: -sizes: want increasing positive numbers, got %q\n", *sizes)
			os.Exit(2)
		}
		if n < *deployments {
			o.sizes = append(o.sizes, n)
		}
	}
	if *deployments < 1 {
		fmt.Fprintln(os.Stderr, "bench-scale: -deployments: want at least 1")
		os.Exit(2)
	}
	o.sizes = append(o.sizes, *deployments)
	if o.namespaces < 1 {
		fmt.Fprintln(os.Stderr, "bench-scale: -namespaces: want at least 1")
		os.Exit(2)
	}
	if o.live == 0 {
		o.live = max(10, o.largest()/100)
	}
	if o.memoryLimitMiB == 0 {
		o.memoryLimitMiB = defaultMemoryLimitMiB(o.largest())
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "bench-scale:", err)
		os.Exit(1)
	}
}

// defaultMemoryLimitMiB is the limit test/README's "Memory to give the guard"
// gives for n Deployments: the deployed default up to 1,000, 768Mi up to
// 10,000, 3.5Gi beyond.
func defaultMemoryLimitMiB(n int) int {
	switch {
	case n <= 1000:
		return 256
	case n <= 10000:
		return 768
	}
	return 3584
}

// nodesFor is how many kwok nodes the live Deployments need: they hold 110
// pods each, and a rollout's surge gives a Deployment of one replica two
// pods for a moment.
func nodesFor(live int) int {
	return max(2, (2*(live+1)+109)/110)
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
	// The harness's clients log the API server's warnings; to the log file.
	ctrl.SetLogger(zap.New(zap.WriteTo(logFile)))
	began := time.Now()

	fmt.Printf("Starting the local cluster and the guard (default configuration, deployed Go runtime settings, memory limit %d MiB) …\n", o.memoryLimitMiB)
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
	// The controllers' client rate limits (20 requests/s by default) would
	// make filling the cluster take hours; the guard's own client is not
	// changed.
	l, err := harness.StartLocal(ctx, harness.LocalOptions{Tools: o.tools, Guard: o.guard, Name: "dg-bench-scale", WorkDir: work, Nodes: nodesFor(o.live), Log: logFile,
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
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: l.Scheme})
	if err != nil {
		return err
	}
	b := &bench{o: o, c: c, cfg: cfg, l: l, pprof: pprofAddr, work: work}
	if o.memoryLimitMiB != 256 {
		// StartLocal gives the guard the deployed 256Mi; start it again
		// with the limit for this size before anything is measured.
		if err := b.restartGuard(ctx); err != nil {
			return err
		}
	}
	for i := range o.namespaces {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: b.namespace(i)}}); err != nil {
			return err
		}
	}
	r := result{Date: time.Now().UTC().Format(time.RFC3339), Namespaces: o.namespaces, Revisions: o.revisions, Containers: o.containers,
		EnvVars: o.envVars, MemoryLimitMiB: o.memoryLimitMiB}
	if err := b.settle(ctx); err != nil {
		return err
	}
	r.Empty = b.memory(ctx, "empty")
	for _, n := range o.sizes {
		s, err := b.measureAt(ctx, n)
		if err != nil {
			return err
		}
		r.Steps = append(r.Steps, s)
	}
	if r.Restart, err = b.restart(ctx); err != nil {
		return err
	}
	if r.Audit, err = b.auditPass(ctx); err != nil {
		return err
	}
	if r.Single, r.Bump, err = b.reactions(ctx); err != nil {
		return err
	}
	if r.Kept, err = b.kept(ctx); err != nil {
		return err
	}
	r.Seconds = time.Since(began).Seconds()
	printReport(os.Stdout, r)
	out, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(o.out, append(out, '\n'), 0o644)
}

type bench struct {
	o       options
	c       client.WithWatch
	cfg     *rest.Config // the admin's
	l       *harness.Local
	pprof   string // the guard's pprof address
	work    string
	created int
}
