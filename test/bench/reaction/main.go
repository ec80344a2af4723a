// Command reaction is `make bench-reaction`: how fast the guard reacts to a
// failed rollout, on the e2e tier's local cluster and guard configuration
// (harness.E2EGuardConfig). It measures two reactions, each over many
// rollbacks at once, both ends seen on one watch:
//
//   - a deadline's: from the Progressing condition turning
//     ProgressDeadlineExceeded to the guard's rollback write (the one that
//     restores the template and sets the rolled-back label);
//   - fail-fast's: from the first pod status of a broken rollout in
//     ImagePullBackOff to the guard's rollback write, which fail-fast's
//     window (15 s) delays on purpose.
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
	"slices"
	"sync"
	"syscall"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/test/bench/load"
	"github.com/deployguard/deployguard/test/harness"
)

// failFastWindow is rollback.failFast.window in harness.E2EGuardConfig.
const failFastWindow = 15 * time.Second

type options struct {
	tools, guard, workDir, out string
	deadlines, failFasts       int
}

// reaction is one kind of reaction over its rollbacks.
type reaction struct {
	What      string          `json:"what"`
	Rollbacks int             `json:"rollbacks"`
	Median    time.Duration   `json:"medianNs"`
	Worst     time.Duration   `json:"worstNs"`
	Best      time.Duration   `json:"bestNs"`
	All       []time.Duration `json:"allNs"`
}

func (r reaction) String() string {
	round := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	return fmt.Sprintf("%s, over %d rollbacks: median %s, worst %s, best %s", r.What, r.Rollbacks, round(r.Median), round(r.Worst), round(r.Best))
}

func main() {
	var o options
	flag.StringVar(&o.tools, "tools", "", "the control plane binaries (make tools)")
	flag.StringVar(&o.guard, "guard", "bin/deployguard", "the deployguard binary")
	flag.StringVar(&o.workDir, "workdir", "bin/bench-reaction", "folder for the cluster and the logs")
	flag.StringVar(&o.out, "out", "bin/bench-reaction.json", "where the results are written as JSON")
	flag.IntVar(&o.deadlines, "deadline-rollbacks", 20, "rollbacks on a progress deadline, measured at once")
	flag.IntVar(&o.failFasts, "failfast-rollbacks", 10, "fail-fast rollbacks, measured at once")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "bench-reaction:", err)
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
	ctrl.SetLogger(zap.New(zap.WriteTo(logFile)))

	fmt.Println("Starting the local cluster and the guard (the e2e tier's settings) …")
	startCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	l, err := harness.StartLocal(startCtx, harness.LocalOptions{
		Tools: o.tools, Guard: o.guard, Name: "dg-bench-reaction", WorkDir: work, Nodes: 2,
		GuardConfig: harness.E2EGuardConfig, Log: logFile, ClientAuth: true,
		CRDs: []string{filepath.Join(harness.RepoRoot(), "config", "crd", "policyreport")},
	})
	cancel()
	if err != nil {
		return fmt.Errorf("%w (log: %s)", err, logFile.Name())
	}
	defer l.Stop()
	cfg, err := l.Cluster.RESTConfig()
	if err != nil {
		return err
	}
	cfg.WarningHandler = rest.NoWarnings{}
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: l.Scheme})
	if err != nil {
		return err
	}
	b := &bench{c: c}

	fmt.Printf("Rolling back %d rollouts on their progress deadline …\n", o.deadlines)
	deadline, err := b.deadlineReaction(ctx, o.deadlines)
	if err != nil {
		return err
	}
	fmt.Println(deadline)
	fmt.Printf("Rolling back %d rollouts by fail-fast …\n", o.failFasts)
	failFast, err := b.failFastReaction(ctx, o.failFasts)
	if err != nil {
		return err
	}
	fmt.Println(failFast)

	out, err := json.MarshalIndent(map[string]any{
		"date": time.Now().UTC().Format(time.RFC3339), "deadline": deadline, "failFast": failFast,
	}, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(o.out, append(out, '\n'), 0o644)
}

type bench struct {
	c client.WithWatch
}

// rolledOut creates n Deployments of one replica in a new namespace and
// waits until the guard has recorded each one's first revision as
// known-good, so that a failed rollout of it has somewhere to go back.
func (b *bench) rolledOut(ctx context.Context, prefix string, n int, opts ...harness.DeploymentOption) (string, error) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"}}
	if err := b.c.Create(ctx, ns); err != nil {
		return "", err
	}
	for i := range n {
		d := harness.Deployment(ns.Name, name(prefix, i), "app:1", append([]harness.DeploymentOption{harness.Replicas(1)}, opts...)...)
		if err := b.c.Create(ctx, d); err != nil {
			return "", err
		}
	}
	for i := range n {
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
			d := &appsv1.Deployment{}
			if err := b.c.Get(ctx, client.ObjectKey{Namespace: ns.Name, Name: name(prefix, i)}, d); err != nil {
				return false, nil
			}
			l, _ := rollout.ReadLedger(d)
			newest := l.Newest()
			return newest != nil && newest.Revision == 1, nil
		})
		if err != nil {
			return "", fmt.Errorf("revision 1 of %s/%s was not marked known-good: %w", ns.Name, name(prefix, i), err)
		}
	}
	return ns.Name, nil
}

func name(prefix string, i int) string { return fmt.Sprintf("%s%02d", prefix, i) }

// update changes a Deployment, retrying on conflicts with the controllers.
func (b *bench) update(ctx context.Context, ns, name string, mutate func(*appsv1.Deployment)) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		d := &appsv1.Deployment{}
		if err := b.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, d); err != nil {
			return err
		}
		mutate(d)
		return b.c.Update(ctx, d)
	})
}

// timings pairs, per Deployment, when its failure was seen with when its
// rollback write was, and is complete once n rollbacks are timed.
type timings struct {
	mu        sync.Mutex
	n         int
	failed    map[string]time.Time
	reactions map[string]time.Duration
	done      chan struct{}
}

func newTimings(n int) *timings {
	return &timings{n: n, failed: map[string]time.Time{}, reactions: map[string]time.Duration{}, done: make(chan struct{})}
}

// failedAt records the first time name's failure was seen.
func (t *timings) failedAt(name string, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, seen := t.failed[name]; !seen {
		t.failed[name] = at
	}
}

// rolledBackAt records name's rollback write, timed from its failure when
// that was seen first.
func (t *timings) rolledBackAt(name string, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	f, ok := t.failed[name]
	if _, seen := t.reactions[name]; seen || !ok || len(t.reactions) == t.n {
		return
	}
	t.reactions[name] = at.Sub(f)
	if len(t.reactions) == t.n {
		close(t.done)
	}
}

// wait returns the reaction of every rollback, or an error when not all of
// them were seen within timeout.
func (t *timings) wait(ctx context.Context, what string, timeout time.Duration) (reaction, error) {
	select {
	case <-t.done:
	case <-time.After(timeout):
	case <-ctx.Done():
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.reactions) < t.n {
		return reaction{}, fmt.Errorf("%s: %d of %d rollbacks seen on the watch within %s", what, len(t.reactions), t.n, timeout)
	}
	r := reaction{What: what, Rollbacks: t.n}
	for _, d := range t.reactions {
		r.All = append(r.All, d)
	}
	slices.Sort(r.All)
	r.Median, r.Worst, r.Best = r.All[len(r.All)/2], r.All[len(r.All)-1], r.All[0]
	return r, nil
}

// rolledBack reports, from a watch of Deployments, every rollback write:
// the guard's rolled-back label set to the failed revision, 2.
func rolledBack(w watch.Interface, t *timings) {
	for ev := range w.ResultChan() {
		d, ok := ev.Object.(*appsv1.Deployment)
		if ok && ev.Type == watch.Modified && d.Labels[vocab.LabelRolledBack] == "2" {
			t.rolledBackAt(d.Name, time.Now())
		}
	}
}

// deadlineReaction breaks n rollouts so that their pods can never be
// scheduled, and times each from its ProgressDeadlineExceeded (4 s after
// the rollout stalls) to its rollback.
func (b *bench) deadlineReaction(ctx context.Context, n int) (reaction, error) {
	ns, err := b.rolledOut(ctx, "deadline", n, harness.ProgressDeadline(4))
	if err != nil {
		return reaction{}, err
	}
	w, err := b.c.Watch(ctx, &appsv1.DeploymentList{}, client.InNamespace(ns))
	if err != nil {
		return reaction{}, err
	}
	defer w.Stop()
	t := newTimings(n)
	go func() {
		for ev := range w.ResultChan() {
			d, ok := ev.Object.(*appsv1.Deployment)
			if !ok || ev.Type != watch.Modified {
				continue
			}
			now := time.Now()
			for _, c := range d.Status.Conditions {
				if c.Type == appsv1.DeploymentProgressing && c.Reason == vocab.ProgressDeadlineExceeded && c.Status == corev1.ConditionFalse {
					t.failedAt(d.Name, now)
				}
			}
			if d.Labels[vocab.LabelRolledBack] == "2" {
				t.rolledBackAt(d.Name, now)
			}
		}
	}()
	for i := range n {
		err := b.update(ctx, ns, name("deadline", i), func(d *appsv1.Deployment) {
			d.Spec.Template.Spec.Containers[0].Image = "app:2"
			d.Spec.Template.Spec.NodeSelector = map[string]string{"deployguard.io/e2e": "no-such-node"}
		})
		if err != nil {
			return reaction{}, err
		}
	}
	return t.wait(ctx, "automatic rollback on a deadline, from the ProgressDeadlineExceeded transition to the rollback write", 5*time.Minute)
}

// failFastReaction rolls n Deployments out to images that do not exist (the
// local cluster's pods of such a tag stay in ImagePullBackOff, as a
// kubelet's would) and times each from the first failing pod status to its
// rollback. The progress deadline is upstream's ten minutes: every rollback
// is fail-fast's.
func (b *bench) failFastReaction(ctx context.Context, n int) (reaction, error) {
	ns, err := b.rolledOut(ctx, "failfast", n, harness.ProgressDeadline(600))
	if err != nil {
		return reaction{}, err
	}
	pods, err := b.c.Watch(ctx, &corev1.PodList{}, client.InNamespace(ns))
	if err != nil {
		return reaction{}, err
	}
	defer pods.Stop()
	deployments, err := b.c.Watch(ctx, &appsv1.DeploymentList{}, client.InNamespace(ns))
	if err != nil {
		return reaction{}, err
	}
	defer deployments.Stop()
	t := newTimings(n)
	go func() {
		for ev := range pods.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			for _, cs := range p.Status.ContainerStatuses {
				if cs.State.Waiting != nil && cs.State.Waiting.Reason == "ImagePullBackOff" {
					t.failedAt(p.Labels["app.kubernetes.io/name"], time.Now())
				}
			}
		}
	}()
	go rolledBack(deployments, t)
	for i := range n {
		err := b.update(ctx, ns, name("failfast", i), func(d *appsv1.Deployment) {
			d.Spec.Template.Spec.Containers[0].Image = fmt.Sprintf("app:no-such-tag-%d", i)
		})
		if err != nil {
			return reaction{}, err
		}
	}
	return t.wait(ctx, fmt.Sprintf("fail-fast rollback, from the first failing pod status to the rollback write (window %s)", failFastWindow), 5*time.Minute)
}
