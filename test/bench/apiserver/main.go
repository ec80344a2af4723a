// Command apiserver is `make bench-apiserver`: the same dry-run CREATE load
// through a real kube-apiserver on the local cluster, without an admission
// guard, with a ValidatingAdmissionPolicy of four CEL rules (the bar to
// beat), and with deployguard's default install, in turns over several
// rounds of one run (medians reported, each round kept); then, with the
// guard, a Deployment its policies warn about, without and with 1,000
// PolicyExceptions in the cluster (their lookup must not grow with them). It reports
// requests/s, latency and the CPU each request costs kube-apiserver and the
// guard, read from /proc, and leaves CPU profiles of both under load in the
// work folder (apiserver-PHASE.pprof, guard-cpu.pprof).
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
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/deployguard/deployguard/test/bench/load"
	"github.com/deployguard/deployguard/test/harness"
	"github.com/deployguard/deployguard/webhook/exception"
)

type options struct {
	tools, guard, workDir, out string
	clients                    int
	warmup, duration           time.Duration
	rounds                     int
	pprof                      bool
	webhooks                   string
	exceptions                 int
	native                     bool
	guardEnv                   envFlag
}

// envFlag collects -guard-env KEY=VALUE, repeatable.
type envFlag []string

func (e *envFlag) String() string { return strings.Join(*e, " ") }

func (e *envFlag) Set(v string) error {
	if !strings.Contains(v, "=") {
		return fmt.Errorf("want KEY=VALUE, got %q", v)
	}
	*e = append(*e, v)
	return nil
}

// phase is one configuration's measurement.
type phase struct {
	Name string      `json:"name"`
	Load load.Result `json:"load"`
	// CPU per request of kube-apiserver and of the guard (0 when absent).
	APIServerCPUPerRequest time.Duration `json:"apiserverCpuPerRequestNs"`
	GuardCPUPerRequest     time.Duration `json:"guardCpuPerRequestNs,omitempty"`
	GuardRSS               int64         `json:"guardRssBytes,omitempty"`
}

func main() {
	var o options
	flag.StringVar(&o.tools, "tools", "", "the control plane binaries (make tools)")
	flag.StringVar(&o.guard, "guard", "bin/deployguard", "the deployguard binary")
	flag.StringVar(&o.workDir, "workdir", "bin/bench-apiserver", "folder for the cluster and the logs")
	flag.StringVar(&o.out, "out", "bin/bench-apiserver.json", "where the results are written as JSON")
	flag.IntVar(&o.clients, "clients", 4, "concurrent clients")
	flag.DurationVar(&o.warmup, "warmup", 3*time.Second, "load before each measurement, not counted")
	flag.DurationVar(&o.duration, "duration", 10*time.Second, "measured load per configuration and round")
	flag.IntVar(&o.rounds, "rounds", 3, "rounds of every configuration in turn; the tables give the medians")
	flag.StringVar(&o.webhooks, "webhooks", "", "webhook configurations to install (default: config/webhook/manifests.yaml; an earlier version's, to compare)")
	flag.IntVar(&o.exceptions, "exceptions", 1000, "PolicyExceptions in the cluster for the last phase (0: no exception phases)")
	flag.BoolVar(&o.native, "native", true, "install config/native with the guard, as the default install does (false: the webhooks alone, as before the native policies)")
	flag.Var(&o.guardEnv, "guard-env", "KEY=VALUE for the guard's environment, after the deployed runtime settings (repeatable; e.g. GOMAXPROCS=1)")
	flag.BoolVar(&o.pprof, "pprof", true, "take a CPU profile of the guard under load (a guard built before --pprof-bind-address existed needs false)")
	flag.Parse()
	// The harness logs through controller-runtime; the bench reports only
	// its table.
	ctrllog.SetLogger(logr.Discard())
	// client-go logs each request a load's end cancels, as an error, which
	// klog also writes to stderr whatever its output.
	klog.SetLogger(logr.Discard())
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "bench-apiserver:", err)
		os.Exit(1)
	}
}

func run(o options) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if o.rounds < 1 {
		return fmt.Errorf("-rounds must be at least 1")
	}
	tools, work, logFile, err := load.Prepare(o.tools, o.workDir)
	if err != nil {
		return err
	}
	defer logFile.Close()
	o.tools = tools

	fmt.Println("Starting the local cluster …")
	cluster, err := harness.StartCluster(ctx, o.tools, "dg-bench-apiserver", filepath.Join(work, "cluster"), 1, logFile)
	if err != nil {
		return err
	}
	defer cluster.Stop()
	cfg, err := cluster.RESTConfig()
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = 10000, 10000
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(exception.AddToScheme(scheme))
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	for _, cf := range configs {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: cf.namespace, Labels: cf.labels}}); err != nil {
			return err
		}
	}
	apiserver, err := load.FindProcess("kube-apiserver", cluster.WorkDir)
	if err != nil {
		return err
	}
	template := load.Deployment("", "bench", 2, 3, 30)
	if b, err := json.Marshal(template); err == nil {
		fmt.Printf("Load: dry-run CREATE of a %.1f KB Deployment, then image-only UPDATEs of a stored one; %d clients; "+
			"%d rounds, each configuration in turn, %s per load (after %s of warm-up)\n\n",
			float64(len(b))/1024, o.clients, o.rounds, o.duration, o.warmup)
	}
	creating := func(template *appsv1.Deployment, namespace string) func(ctx context.Context, w, i int) error {
		return func(ctx context.Context, w, i int) error {
			d := template.DeepCopy()
			d.Namespace = namespace
			d.Name = fmt.Sprintf("bench-%d-%d", w, i)
			return c.Create(ctx, d, client.DryRunAll)
		}
	}
	// The second load: dry-run UPDATEs of one stored Deployment that change
	// only an image, the write a deploy tool makes most. Paused, so that
	// the Deployment controller leaves it alone; read again before each
	// measurement, after whatever the guard wrote to it. Its own labels:
	// the CREATEs must not overlap it.
	for _, cf := range configs {
		stored := load.Deployment(cf.namespace, "bench-update", 2, 3, 30)
		stored.Spec.Paused = true
		if err := c.Create(ctx, stored); err != nil {
			return err
		}
	}
	updating := func(namespace string) (func(ctx context.Context, w, i int) error, error) {
		cur := &appsv1.Deployment{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "bench-update"}, cur); err != nil {
			return nil, err
		}
		return func(ctx context.Context, w, i int) error {
			d := cur.DeepCopy()
			d.Spec.Template.Spec.Containers[0].Image = fmt.Sprintf("registry.example.com/bench/c0:1.%d.%d", w, i)
			return c.Update(ctx, d, client.DryRunAll)
		}, nil
	}
	// measure runs one load for d and reads what it cost, with a profile of
	// kube-apiserver over it when profile is set.
	measure := func(name string, guardPid int, profile bool, d time.Duration, do func(ctx context.Context, w, i int) error) (phase, error) {
		load.Run(ctx, o.clients, 0, o.warmup, do)
		a0, err := load.CPU(apiserver)
		if err != nil {
			return phase{}, err
		}
		var g0 time.Duration
		if guardPid != 0 {
			if g0, err = load.CPU(guardPid); err != nil {
				return phase{}, err
			}
		}
		var profiled <-chan error
		if profile {
			profiled = profileAPIServer(o, cfg, work, name, d)
		} else {
			none := make(chan error, 1)
			none <- nil
			profiled = none
		}
		r := load.Run(ctx, o.clients, 0, d, do)
		if err := <-profiled; err != nil {
			fmt.Fprintln(logFile, "no CPU profile of kube-apiserver:", err)
		}
		a1, err := load.CPU(apiserver)
		if err != nil {
			return phase{}, err
		}
		p := phase{Name: name, Load: r}
		if r.Requests > 0 {
			p.APIServerCPUPerRequest = (a1 - a0) / time.Duration(r.Requests)
		}
		if guardPid != 0 {
			g1, err := load.CPU(guardPid)
			if err != nil {
				return phase{}, err
			}
			p.GuardCPUPerRequest = (g1 - g0) / time.Duration(max(r.Requests, 1))
			p.GuardRSS, _ = load.RSS(guardPid)
		}
		fmt.Printf("  %-62s %7.0f req/s, p99 %s, %d failed\n", name, r.PerSec, load.Millis(r.P99), r.Failed)
		return p, ctx.Err()
	}

	// Installed once, each matching one namespace: the policy the bench's
	// VAP namespace only, the guard every namespace but the two labelled
	// deployguard.io/guard=disabled.
	if err := installPolicy(ctx, c); err != nil {
		return err
	}
	if o.exceptions > 0 {
		// Before the guard starts: it indexes exceptions only when the API
		// is served at its start.
		dir := filepath.Join(harness.RepoRoot(), "config", "crd", "exceptions")
		if _, err := cluster.Kubectl(ctx, cluster.Kubeconfig, "apply", "-k", dir); err != nil {
			return err
		}
		if _, err := cluster.Kubectl(ctx, cluster.Kubeconfig, "wait", "--for=condition=Established", "crd/policyexceptions.deployguard.io", "--timeout=1m"); err != nil {
			return err
		}
	}
	pprofPort, err := harness.FreePort()
	if err != nil {
		return err
	}
	var guardArgs []string
	if o.pprof {
		guardArgs = []string{"--pprof-bind-address", fmt.Sprintf("127.0.0.1:%d", pprofPort)}
	}
	g, err := startGuard(ctx, o, cluster, c, logFile, guardArgs...)
	if err != nil {
		return err
	}
	defer g.Stop()
	pidOf := func(cf config) int {
		if cf.guarded {
			return g.Pid
		}
		return 0
	}
	nameOf := func(cf config) string {
		if cf.guarded {
			return guardPhase(o)
		}
		return cf.name
	}

	// The rounds: in each, every configuration in turn, the first one
	// rotated from round to round so that none always follows another.
	creates := make([][]phase, len(configs))
	updates := make([][]phase, len(configs))
	for round := range o.rounds {
		fmt.Printf("Round %d of %d\n", round+1, o.rounds)
		for k := range configs {
			i := (round + k) % len(configs)
			p, err := measure(nameOf(configs[i]), pidOf(configs[i]), false, o.duration, creating(template, configs[i].namespace))
			if err != nil {
				return err
			}
			creates[i] = append(creates[i], p)
		}
		for k := range configs {
			i := (round + k) % len(configs)
			update, err := updating(configs[i].namespace)
			if err != nil {
				return err
			}
			p, err := measure(nameOf(configs[i])+" (image-only UPDATE)", pidOf(configs[i]), false, o.duration, update)
			if err != nil {
				return err
			}
			updates[i] = append(updates[i], p)
		}
	}

	// Profiles, in a pass of their own: a profiler costs CPU, and a round
	// that carried one would not be measured as the others.
	if o.pprof {
		fmt.Println("Profiling (not counted)")
		for _, cf := range configs {
			if _, err := measure(nameOf(cf), pidOf(cf), true, o.duration, creating(template, cf.namespace)); err != nil {
				return err
			}
		}
		guard := configs[len(configs)-1]
		update, err := updating(guard.namespace)
		if err != nil {
			return err
		}
		if _, err := measure(nameOf(guard)+" (image-only UPDATE)", pidOf(guard), true, o.duration, update); err != nil {
			return err
		}
		profiled := make(chan error, 1)
		go func() {
			profiled <- load.SaveURL(fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/profile?seconds=%d", pprofPort, max(int(o.duration.Seconds())-1, 1)),
				filepath.Join(work, "guard-cpu.pprof"))
		}()
		load.Run(ctx, o.clients, 0, o.duration, creating(template, guard.namespace))
		if err := <-profiled; err != nil {
			fmt.Println("  (no CPU profile of the guard:", err, ")")
		} else {
			fmt.Printf("  CPU profile of the guard under load: %s\n", filepath.Join(work, "guard-cpu.pprof"))
		}
	}

	phases := make([]phase, 0, len(configs)+2)
	for _, ps := range creates {
		phases = append(phases, median(ps))
	}
	if o.exceptions > 0 {
		// A finding to except: the images policy warns about :latest, so each
		// request looks its Deployment's exceptions up. The two are measured
		// once each, for as long as a configuration's rounds together.
		latest := template.DeepCopy()
		latest.Spec.Template.Spec.Containers[0].Image = "registry.example.com/bench/c0:latest"
		guarded := configs[len(configs)-1].namespace
		long := o.duration * time.Duration(o.rounds)
		p, err := measure("deployguard, a policy finding, no exceptions", g.Pid, false, long, creating(latest, guarded))
		if err != nil {
			return err
		}
		phases = append(phases, p)
		fmt.Printf("  creating %d PolicyExceptions …\n", o.exceptions)
		if err := createExceptions(ctx, c, g, o.exceptions, guarded); err != nil {
			return err
		}
		p, err = measure(fmt.Sprintf("deployguard, a policy finding, %d exceptions", o.exceptions), g.Pid, false, long, creating(latest, guarded))
		if err != nil {
			return err
		}
		phases = append(phases, p)
	}
	medianUpdates := make([]phase, 0, len(configs))
	for _, ps := range updates {
		medianUpdates = append(medianUpdates, median(ps))
	}

	fmt.Printf("\nMedians of %d rounds; the rounds one by one are in %s.\n", o.rounds, o.out)
	printTable(os.Stdout, phases, creates)
	printSpread(os.Stdout, "CREATE", creates)
	printUpdates(os.Stdout, medianUpdates, updates)
	printSpread(os.Stdout, "image-only UPDATE", updates)
	b, err := json.MarshalIndent(map[string]any{
		"date": time.Now().UTC().Format(time.RFC3339), "clients": o.clients, "rounds": o.rounds,
		"phases": phases, "updates": medianUpdates,
		"createRounds": creates, "updateRounds": updates,
	}, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(o.out, b, 0o644)
}

// config is one admission setup under measurement, told apart by the
// namespace its requests go to. The bench's policy and the guard are
// installed once and each matches its own namespace, so the three are
// measured in turns in every round: this machine drifts over minutes
// (requests/s without a guard moved by 10% between two runs), and a
// configuration measured minutes after its baseline carried that drift.
// The namespace without a guard is labelled deployguard.io/guard=disabled,
// which the guard's webhooks and native bindings skip by their
// namespaceSelector, evaluated on the namespace's labels before any object
// is looked at.
type config struct {
	name, namespace string
	labels          map[string]string
	guarded         bool
}

// policyLabel marks the namespace the bench's ValidatingAdmissionPolicy is
// bound to.
const policyLabel = "bench.deployguard.io/four-rules"

var configs = []config{
	{name: "no admission guard", namespace: "bench-none", labels: map[string]string{"deployguard.io/guard": "disabled"}},
	{name: "a ValidatingAdmissionPolicy with 4 CEL rules", namespace: "bench-vap", labels: map[string]string{"deployguard.io/guard": "disabled", policyLabel: "true"}},
	{name: "", namespace: "bench", guarded: true},
}

// median is the phase of a configuration's rounds: each figure the median
// of the rounds' (for an even count, the lower of the two middle ones).
func median(ps []phase) phase {
	pick := func(f func(phase) float64) float64 {
		v := make([]float64, len(ps))
		for i, p := range ps {
			v[i] = f(p)
		}
		sort.Float64s(v)
		return v[(len(v)-1)/2]
	}
	m := phase{Name: ps[0].Name}
	m.Load.PerSec = pick(func(p phase) float64 { return p.Load.PerSec })
	m.Load.P50 = time.Duration(pick(func(p phase) float64 { return float64(p.Load.P50) }))
	m.Load.P99 = time.Duration(pick(func(p phase) float64 { return float64(p.Load.P99) }))
	m.APIServerCPUPerRequest = time.Duration(pick(func(p phase) float64 { return float64(p.APIServerCPUPerRequest) }))
	m.GuardCPUPerRequest = time.Duration(pick(func(p phase) float64 { return float64(p.GuardCPUPerRequest) }))
	m.GuardRSS = int64(pick(func(p phase) float64 { return float64(p.GuardRSS) }))
	for _, p := range ps {
		m.Load.Requests += p.Load.Requests
		m.Load.Failed += p.Load.Failed
		m.Load.Elapsed += p.Load.Elapsed
		if m.Load.FirstError == "" {
			m.Load.FirstError = p.Load.FirstError
		}
	}
	return m
}

// medianRatio is the median, over the rounds, of configuration k's
// requests/s against no guard's in the same round.
func medianRatio(rounds [][]phase, k int) float64 {
	none, with := rounds[0], rounds[k]
	r := make([]float64, len(with))
	for i := range with {
		r[i] = with[i].Load.PerSec / max(none[i].Load.PerSec, 1)
	}
	sort.Float64s(r)
	return r[(len(r)-1)/2]
}

// printSpread gives, for each round, the guard's throughput against the
// no-guard's of the same round, and the CPU figures: what the medians hide.
func printSpread(w io.Writer, kind string, rounds [][]phase) {
	none, guard := rounds[0], rounds[len(rounds)-1]
	fmt.Fprintf(w, "\nEach round, %s: the guard's requests/s against no guard's in the same round; guard CPU; kube-apiserver CPU added:\n", kind)
	for i := range guard {
		fmt.Fprintf(w, "  round %d: %.0f/%.0f (%.0f%%), %s, +%s\n", i+1, guard[i].Load.PerSec, none[i].Load.PerSec,
			100*guard[i].Load.PerSec/max(none[i].Load.PerSec, 1), load.Millis(guard[i].GuardCPUPerRequest),
			load.Millis(guard[i].APIServerCPUPerRequest-none[i].APIServerCPUPerRequest))
	}
}

func printTable(w io.Writer, phases []phase, rounds [][]phase) {
	printRows(w, phases)
	none, guard := phases[0], phases[2]
	if none.Load.PerSec > 0 {
		fmt.Fprintf(w, "\nWith the guard: %.0f%% of the requests/s without it (the median of the rounds' own ratios); %s of kube-apiserver CPU added per request (the native policies and the webhook calls).\n",
			100*medianRatio(rounds, len(rounds)-1), load.Millis(guard.APIServerCPUPerRequest-none.APIServerCPUPerRequest))
	}
	if len(phases) == 5 && phases[3].Load.PerSec > 0 {
		without, with := phases[3], phases[4]
		fmt.Fprintf(w, "With the exceptions: %.0f%% of the requests/s without them; guard CPU per request %s → %s.\n",
			100*with.Load.PerSec/without.Load.PerSec, load.Millis(without.GuardCPUPerRequest), load.Millis(with.GuardCPUPerRequest))
	}
}

func printRows(w io.Writer, phases []phase) {
	fmt.Fprintln(w, "\n| | requests/s | p50 | p99 | guard CPU per request | kube-apiserver CPU per request | failed |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|")
	for _, p := range phases {
		guard := "—"
		if p.GuardCPUPerRequest > 0 {
			guard = load.Millis(p.GuardCPUPerRequest)
		}
		fmt.Fprintf(w, "| %s | %.0f | %s | %s | %s | %s | %d |\n", p.Name, p.Load.PerSec, load.Millis(p.Load.P50), load.Millis(p.Load.P99),
			guard, load.Millis(p.APIServerCPUPerRequest), p.Load.Failed)
	}
}

// printUpdates is the image-only UPDATE load's table, and how much of the
// no-guard throughput each configuration keeps there.
func printUpdates(w io.Writer, updates []phase, rounds [][]phase) {
	if len(updates) != 3 {
		return
	}
	fmt.Fprintln(w, "\nImage-only UPDATEs (dry run) of one stored Deployment:")
	printRows(w, updates)
	none, vap, guard := updates[0], updates[1], updates[2]
	if none.Load.PerSec > 0 {
		fmt.Fprintf(w, "\nOn image-only UPDATEs: the ValidatingAdmissionPolicy keeps %.0f%% of the requests/s without a guard, deployguard %.0f%%; kube-apiserver CPU per request +%s and +%s.\n",
			100*medianRatio(rounds, 1), 100*medianRatio(rounds, 2),
			load.Millis(vap.APIServerCPUPerRequest-none.APIServerCPUPerRequest), load.Millis(guard.APIServerCPUPerRequest-none.APIServerCPUPerRequest))
	}
}

// createExceptions creates n PolicyExceptions through the guard's webhook,
// spread as a large cluster would have them: most cover other namespaces,
// one in ten covers other Deployments of the load's namespace by name, and
// ten select by labels there (matching none of the load's). It returns once
// the guard counts them all.
func createExceptions(ctx context.Context, c client.Client, g *harness.Guard, n int, namespace string) error {
	expires := metav1.NewTime(time.Now().Add(30 * 24 * time.Hour)) // outside the 7-day warning: active
	for i := range n {
		m := exception.Match{Namespace: fmt.Sprintf("team-%d", i), Names: []string{fmt.Sprintf("app-%d", i)}}
		switch {
		case i < 10:
			m = exception.Match{Namespace: namespace, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": fmt.Sprintf("legacy-%d", i)}}}
		case i%10 == 0:
			m = exception.Match{Namespace: namespace, Names: []string{fmt.Sprintf("legacy-%d", i)}}
		}
		pe := &exception.PolicyException{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bench-%d", i), Namespace: harness.GuardNamespace},
			Spec: exception.Spec{Match: m, Policies: []string{"images"}, ExpiresAt: expires,
				Owner: "bench", Reason: "make bench-apiserver"},
		}
		if err := c.Create(ctx, pe); err != nil {
			return fmt.Errorf("creating PolicyException %d: %w", i, err)
		}
	}
	want := fmt.Sprintf(`deployguard_policy_exceptions{state="active"} %d`, n)
	return wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		_, body, err := g.Get(g.Metrics, "/metrics")
		return err == nil && strings.Contains(body, want), nil
	})
}

// installPolicy installs a ValidatingAdmissionPolicy with four CEL rules like
// the guard's built-in policies, bound to the namespace labelled policyLabel
// only, and returns once it is in force there.
func installPolicy(ctx context.Context, c client.Client) error {
	fail := admissionregistrationv1.Fail
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "bench-four-rules"},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: &fail,
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{"apps"}, APIVersions: []string{"v1"}, Resources: []string{"deployments"}},
				},
			}}},
			Validations: []admissionregistrationv1.Validation{
				{Expression: "object.spec.template.spec.containers.all(c, !c.image.endsWith(':latest') && c.image.contains(':'))", Message: "images need a version tag"},
				{Expression: "object.spec.template.spec.containers.all(c, has(c.resources.requests) && 'cpu' in c.resources.requests && 'memory' in c.resources.requests)", Message: "containers need cpu and memory requests"},
				{Expression: "object.spec.template.spec.containers.all(c, has(c.readinessProbe))", Message: "containers need a readiness probe"},
				{Expression: "!has(object.spec.template.spec.hostNetwork) || !object.spec.template.spec.hostNetwork", Message: "no host network"},
			},
		},
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "bench-four-rules"},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName: policy.Name, ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
			MatchResources: &admissionregistrationv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{policyLabel: "true"},
			}},
		},
	}
	for _, obj := range []client.Object{policy, binding} {
		if err := c.Create(ctx, obj); err != nil {
			return err
		}
	}
	var namespace string
	for _, cf := range configs {
		if cf.labels[policyLabel] == "true" {
			namespace = cf.namespace
		}
	}
	marker := load.Deployment(namespace, "marker", 1, 1, 0)
	marker.Spec.Template.Spec.HostNetwork = true
	refused := func(ctx context.Context) (bool, error) {
		err := c.Create(ctx, marker.DeepCopy(), client.DryRunAll)
		return err != nil && strings.Contains(err.Error(), "no host network"), nil
	}
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, refused); err != nil {
		return fmt.Errorf("the ValidatingAdmissionPolicy did not take effect: %w", err)
	}
	return nil
}

// startGuard runs the guard as `make run` does (its service account, the
// deployed webhook configurations, the deployed Go runtime settings) and
// returns once the API server calls it.
func startGuard(ctx context.Context, o options, cluster *harness.Cluster, c client.Client, log io.Writer, args ...string) (*harness.Guard, error) {
	kubeconfig := filepath.Join(filepath.Dir(cluster.WorkDir), "guard.kubeconfig")
	if err := cluster.GuardKubeconfig(ctx, c, kubeconfig); err != nil {
		return nil, err
	}
	port, err := harness.FreePort()
	if err != nil {
		return nil, err
	}
	manifests := o.webhooks
	if manifests == "" {
		manifests = harness.WebhookManifests()
	}
	if err := harness.InstallWebhooksFrom(ctx, c, manifests, fmt.Sprintf("https://127.0.0.1:%d", port), nil); err != nil {
		return nil, err
	}
	if o.native {
		if _, err := cluster.Kubectl(ctx, cluster.Kubeconfig, "apply", "-k", harness.NativeDir()); err != nil {
			return nil, err
		}
	}
	g, err := harness.StartGuard(harness.GuardOptions{
		Binary: o.guard, Kubeconfig: kubeconfig, WorkDir: filepath.Join(filepath.Dir(cluster.WorkDir), "guard"),
		WebhookPort: port, Env: append(harness.DeployedRuntimeEnv(), o.guardEnv...), Output: log, ExtraArgs: args,
	})
	if err != nil {
		return nil, err
	}
	if err := g.WaitReady(ctx, time.Minute); err != nil {
		g.Stop()
		return nil, err
	}
	if err := harness.WaitForWebhooks(ctx, c, "default", time.Minute); err != nil {
		g.Stop()
		return nil, err
	}
	if o.native {
		if err := harness.WaitForNativePolicies(ctx, c, "default", time.Minute); err != nil {
			g.Stop()
			return nil, err
		}
	}
	return g, nil
}

// profileAPIServer takes a CPU profile of kube-apiserver over the measured
// load that is about to start, into the work folder, named for the phase: it
// shows where the API server spends what each configuration adds.
func profileAPIServer(o options, cfg *rest.Config, work, phase string, d time.Duration) <-chan error {
	done := make(chan error, 1)
	if !o.pprof {
		done <- nil
		return done
	}
	go func() {
		hc, err := rest.HTTPClientFor(cfg)
		if err != nil {
			done <- err
			return
		}
		hc.Timeout = d + time.Minute
		slug := strings.Join(strings.FieldsFunc(strings.ToLower(phase), func(r rune) bool {
			return (r < 'a' || r > 'z') && (r < '0' || r > '9')
		}), "-")
		url := fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", strings.TrimSuffix(cfg.Host, "/"), max(int(d.Seconds())-1, 1))
		done <- load.SaveURLWith(hc, url, filepath.Join(work, "apiserver-"+slug+".pprof"))
	}()
	return done
}

// guardPhase names the guard's measurement by what is installed.
func guardPhase(o options) string {
	if o.native {
		return "deployguard, the default install (native policies, webhooks)"
	}
	return "deployguard, both webhooks"
}
