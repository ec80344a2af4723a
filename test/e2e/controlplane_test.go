package e2e

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/test/harness"
)

// ownCluster gives the test a local cluster of its own, since it stops and
// starts the control plane, and points this package's helpers (which work on
// `local`) at it until the test ends. The e2e tests that share the suite's
// cluster run one after the other, so they never see the swap.
func ownCluster(t *testing.T, name string) (l *harness.Local, logPath string) {
	t.Helper()
	work, logFile := tier.TestWorkDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	l, err := harness.StartLocal(ctx, harness.LocalOptions{
		Tools: tier.Tools, Guard: tier.Guard, Name: fmt.Sprintf("dg-e2e-%s-%d", name, os.Getpid()), WorkDir: work,
		Nodes: 1, GuardConfig: guardConfig, Log: logFile,
	})
	require.NoError(t, err, "starting the cluster (log: %s)", logFile.Name())
	saved := local
	local = l
	t.Cleanup(func() {
		local = saved
		if t.Failed() {
			// Read before the cluster and its logs are deleted.
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			for _, c := range []string{"kube-controller-manager", "kube-scheduler", "kwok-controller"} {
				t.Logf("--- end of the %s log ---\n%s", c, l.Cluster.ComponentLog(ctx, c, 6000))
			}
			if out, err := l.Cluster.Kubectl(ctx, l.Cluster.Kubeconfig, "get", "nodes,pods,replicasets,deployments", "-A", "-o", "wide"); err == nil {
				t.Logf("--- cluster objects ---\n%s", out)
			}
		}
		// The test's work folder (tier.TestWorkDir) prints the end of the
		// cluster and guard log after this.
		l.Stop()
	})
	return l, logFile.Name()
}

// admissionProbe sends a dry-run CREATE of a Deployment through the guard's
// webhooks every interval, and records when each succeeded or failed.
type admissionProbe struct {
	mu       sync.Mutex
	results  []probeResult
	stopping atomic.Bool
	done     chan struct{}
}

type probeResult struct {
	at  time.Time
	err error
}

func startAdmissionProbe(t *testing.T, c client.Client, ns string, every time.Duration) *admissionProbe {
	p := &admissionProbe{done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for i := 0; !p.stopping.Load(); i++ {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := c.Create(ctx, harness.Deployment(ns, fmt.Sprintf("probe-%d", i), "app:1", shortDeadline), client.DryRunAll)
			cancel()
			p.mu.Lock()
			p.results = append(p.results, probeResult{at: time.Now(), err: err})
			p.mu.Unlock()
			time.Sleep(every)
		}
	}()
	t.Cleanup(p.stop)
	return p
}

func (p *admissionProbe) stop() {
	if p.stopping.CompareAndSwap(false, true) {
		<-p.done
	}
}

// since returns the results from t on: the first success, and the failures
// after it.
func (p *admissionProbe) since(t time.Time) (firstOK time.Time, total int, failedAfter []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range p.results {
		if r.at.Before(t) {
			continue
		}
		total++
		switch {
		case r.err == nil && firstOK.IsZero():
			firstOK = r.at
		case r.err != nil && !firstOK.IsZero():
			failedAfter = append(failedAfter, r.err.Error())
		}
	}
	return firstOK, total, failedAfter
}

// afterRestart waits, for up to 3 minutes, until cond holds of the Deployment
// as the API server has it. Right after a control-plane start, reads may fail
// for a moment and the restarted kube-controller-manager waits for its own
// lease (15 s) before it acts: errors are retried, not fatal.
func afterRestart(t *testing.T, c client.Client, ns, name, msg string, cond func(d *appsv1.Deployment) bool) *appsv1.Deployment {
	t.Helper()
	d := &appsv1.Deployment{}
	harness.WaitFor(t, 3*time.Minute, msg, func(ctx context.Context) (bool, string, error) {
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, d); err != nil {
			return false, err.Error(), nil
		}
		return cond(d), describe(d), nil
	})
	return d
}

func completed(d *appsv1.Deployment) bool {
	p := condition(d, appsv1.DeploymentProgressing)
	return d.Status.ObservedGeneration == d.Generation && p != nil && p.Reason == "NewReplicaSetAvailable" &&
		d.Status.UpdatedReplicas == *d.Spec.Replicas && d.Status.AvailableReplicas == *d.Spec.Replicas && d.Status.Replicas == *d.Spec.Replicas
}

// logHas reports whether the guard's log (in the cluster log) holds line.
func logHas(path, line string) bool {
	b, err := os.ReadFile(path)
	return err == nil && strings.Contains(string(b), line)
}

// TestControlPlaneRestartMidRollout stops the whole control plane (etcd,
// kube-apiserver, the controllers) while a rollout is about to fail and
// admissions are under way, keeps it down until the guard has lost its
// leader lease, and starts it again. The guard must recover without a
// restart of its own, serve admissions as soon as the API server is back, and
// roll the failed rollout back exactly once.
func TestControlPlaneRestartMidRollout(t *testing.T) {
	l, logPath := ownCluster(t, "restart")
	ctx := context.Background()
	ns := harness.NewNamespace(t, local.Client)
	require.NoError(t, l.Client.Create(ctx, harness.Deployment(ns, "web", "app:1", shortDeadline)))
	waitAvailable(t, ns, "web", time.Minute)
	waitKnownGood(t, ns, "web", 1)

	probe := startAdmissionProbe(t, l.Client, ns, 100*time.Millisecond)
	require.NoError(t, update(t, ns, "web", breakImage("app:2")))
	stopped := time.Now()
	require.NoError(t, l.Cluster.StopControlPlane(ctx))
	// Down until the guard's leadership term has ended (the lease cannot be
	// renewed for 10 s): the case that used to end the process.
	harness.WaitFor(t, time.Minute, "the guard did not notice it lost the lease", func(context.Context) (bool, string, error) {
		return logHas(logPath, "Leadership term ended; campaigning again"), "", nil
	})
	down := time.Since(stopped)
	require.NoError(t, l.Cluster.StartControlPlane(ctx))
	back := time.Now()

	harness.WaitFor(t, time.Minute, "no admission succeeded after the API server came back", func(context.Context) (bool, string, error) {
		ok, _, _ := probe.since(back)
		return !ok.IsZero(), "", nil
	})
	afterRestart(t, l.Client, ns, "web", "web was not rolled back from revision 2", func(d *appsv1.Deployment) bool {
		return rolledBackRevision(d) == 2
	})
	afterRestart(t, l.Client, ns, "web", "web did not complete on the restored template", completed)
	// The guard records the completed revision as known-good in its ledger
	// on the Deployment's status: the state to hold still from is after
	// that record.
	d := afterRestart(t, l.Client, ns, "web", "the restored revision was not recorded known-good", func(d *appsv1.Deployment) bool {
		return completed(d) && strconv.FormatInt(knownGoodRevision(d), 10) == d.Annotations[vocab.RevisionAnnotation]
	})
	probe.stop()
	firstOK, total, failedAfter := probe.since(back)
	t.Logf("control plane down %s; after it was back: first admission through the guard after %s, %d admissions, %d failed after the first success",
		down.Round(100*time.Millisecond), firstOK.Sub(back).Round(10*time.Millisecond), total, len(failedAfter))

	assert.False(t, l.Guard.Exited(), "the guard recovered without a restart of its own")
	assert.Empty(t, failedAfter, "admissions failed after the guard served again")
	assert.Equal(t, "app:1", d.Spec.Template.Spec.Containers[0].Image, "rolled back to the known-good revision")
	generation := d.Generation
	// Never's condition may run once more after it returns: it must not fail
	// the test from there.
	assert.Never(t, func() bool {
		cur := &appsv1.Deployment{}
		return l.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "web"}, cur) == nil && cur.Generation != generation
	}, 3*time.Second, 100*time.Millisecond, "the Deployment was changed again after the rollback")
	assert.Equal(t, 1, count(harness.GuardEventReasons(ctx, t, local.Client, ns, "web"), vocab.ReasonAutoRollback), "rolled back exactly once")
}
