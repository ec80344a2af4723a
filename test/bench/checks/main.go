// Command checks is `make bench-checks`: what metric checks cost the guard
// at 1,000 Deployments (10 namespaces, one replica each, on kwok nodes), on
// the e2e tier's cluster and settings with the stand-in Prometheus of
// test/tools/promql. In one run it measures:
//
//   - the guard's memory (RSS, heap in use, live heap after a forced GC)
//     with the Deployments and no check, then with one ClusterDeploymentCheck
//     (one metric, interval 10s) selecting them all and every one of them
//     rolled out to a new revision and inside its bake window;
//   - queries per rollout (deployguard_check_measurements_total over the
//     rollouts measured, and each ledger's count), beside what the interval
//     alone would give and what the queries-per-second bound allows;
//   - the bound's effect: deployguard_check_measurements_delayed_total during
//     the bump, and the query rate the stand-in saw (a counting proxy in
//     front of it);
//   - the reaction on 20 revisions fed 30% 5xx: from each one's first failed
//     measurement (the ledger's checks.firstFailed) to its rollback
//     (RolledBackRevision seen on a watch), while the other 980 are measured.
//
// It reports figures; the e2e tier asserts the behaviour.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/deployguard/deployguard/reconciler/analysis/checks"
	"github.com/deployguard/deployguard/test/bench/load"
	"github.com/deployguard/deployguard/test/harness"
)

type options struct {
	tools, guard, workDir, out string
	deployments, namespaces    int
	nodes                      int
	failing                    int
	interval, bake             time.Duration
	guardArgs                  string
	// qps is checks.prometheus.qps.
	qps int
}

func main() {
	var o options
	flag.StringVar(&o.tools, "tools", "", "the control plane binaries (make tools)")
	flag.StringVar(&o.guard, "guard", "bin/deployguard", "the deployguard binary")
	flag.StringVar(&o.workDir, "workdir", "bin/bench-checks", "folder for the cluster and the logs")
	flag.StringVar(&o.out, "out", "bin/bench-checks.json", "where the results are written as JSON")
	flag.IntVar(&o.deployments, "deployments", 1000, "Deployments under the check")
	flag.IntVar(&o.namespaces, "namespaces", 10, "namespaces they are spread over")
	// kwok's nodes hold 110 pods each: the Deployments' pods and a surge
	// pod each during the bump must fit.
	flag.IntVar(&o.nodes, "nodes", 22, "kwok nodes (110 pods each; the bump needs 2 pods per Deployment)")
	flag.IntVar(&o.failing, "failing", 20, "of them, new revisions fed 30% 5xx (rolled back)")
	flag.DurationVar(&o.interval, "interval", 10*time.Second, "the metric's interval")
	flag.DurationVar(&o.bake, "bake", 4*time.Minute, "the check's bake window: longer than the bump takes to complete, so that every revision is measured at once")
	flag.StringVar(&o.guardArgs, "guard-args", "", "extra `deployguard serve` flags, space-separated (e.g. --kube-api-qps=5 --kube-api-burst=10, client-go's defaults)")
	flag.IntVar(&o.qps, "qps", 20, "checks.prometheus.qps, the guard's bound on Prometheus queries per second (20: its default)")
	flag.Parse()
	if o.deployments%o.namespaces != 0 || o.failing > o.deployments || o.qps <= 0 {
		fmt.Fprintln(os.Stderr, "bench-checks: -deployments must be a multiple of -namespaces, -failing at most -deployments, and -qps positive")
		os.Exit(2)
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "bench-checks:", err)
		os.Exit(1)
	}
}

func run(o options) error {
	began := time.Now()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	tools, work, logFile, err := load.Prepare(o.tools, o.workDir)
	if err != nil {
		return err
	}
	defer logFile.Close()
	o.tools = tools
	ctrl.SetLogger(zap.New(zap.WriteTo(logFile)))

	// The stand-in is started before the cluster: its URL (through the
	// counting proxy) is in the guard's config, as in the e2e tier.
	stub, err := harness.LaunchPromStub(ctx, filepath.Join(work, "promql.log"))
	if err != nil {
		return err
	}
	defer func() { _ = stub.Stop() }()
	counter, err := startQueryCounter(stub.URL())
	if err != nil {
		return err
	}
	defer counter.close()

	pprofPort, err := harness.FreePort()
	if err != nil {
		return err
	}
	pprofAddr := fmt.Sprintf("127.0.0.1:%d", pprofPort)
	fmt.Printf("Starting the stand-in Prometheus, the local cluster and the guard (the e2e tier's settings, checks.prometheus.qps %d) …\n", o.qps)
	checksConfig := harness.E2EGuardConfig + fmt.Sprintf("checks:\n  prometheus: {url: %q, qps: %d}\n", counter.url, o.qps)
	startCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	// The controllers' client rate limits (20 requests/s) would make 1,000
	// rollouts take many minutes, as in bench-scale; the guard's own client
	// is not changed.
	l, err := harness.StartLocal(startCtx, harness.LocalOptions{
		Tools: o.tools, Guard: o.guard, Name: "dg-bench-checks", WorkDir: work, Nodes: o.nodes, Log: logFile, ClientAuth: true,
		GuardConfig: checksConfig,
		GuardArgs:   append([]string{"--pprof-bind-address", pprofAddr}, strings.Fields(o.guardArgs)...),
		ClusterArgs: []string{"--disable-qps-limits"},
		CRDs:        []string{filepath.Join(harness.RepoRoot(), "config", "crd", "policyreport"), filepath.Join(harness.RepoRoot(), "config", "crd", "checks")},
	})
	cancel()
	if err != nil {
		return fmt.Errorf("%w (log: %s)", err, logFile.Name())
	}
	defer l.Stop()
	if err := checks.AddToScheme(l.Scheme); err != nil {
		return err
	}
	cfg, err := l.Cluster.RESTConfig()
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = 2000, 2000
	cfg.WarningHandler = rest.NoWarnings{}
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: l.Scheme})
	if err != nil {
		return err
	}
	b := &bench{o: o, c: c, l: l, pprof: pprofAddr, work: work, stub: stub.URL(), counter: counter}
	res, err := b.measure(ctx)
	if err != nil {
		return fmt.Errorf("%w (log: %s)", err, logFile.Name())
	}
	res.Seconds = time.Since(began).Seconds()
	printResults(os.Stdout, o, res)
	out, err := json.MarshalIndent(map[string]any{"date": time.Now().UTC().Format(time.RFC3339), "results": res}, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(o.out, append(out, '\n'), 0o644)
}
