package faults

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/test/harness"
)

// guardConfig lets a rollout fail within seconds (progress deadline floor 3s).
const guardConfig = `apiVersion: deployguard.io/v1alpha1
kind: GuardConfig
bounds:
  progressDeadlineSeconds: {min: 3, max: 7200}
`

const (
	replicas = 3
	// slots: the first replicas, the one replacing the killed one, and one
	// per replica for the rolling update.
	slots    = 2*replicas + 1
	loadRate = 120 // admission requests per second asked for
	// minLoadRate is what must at least be achieved for the run to count as
	// "under load"; the achieved rate is logged.
	minLoadRate = 90
	deadline    = 4 // progressDeadlineSeconds of the rollout that fails
	leaseName   = "deployguard.deployguard.io"
	// shutdownDelay is the guard's default: /readyz fails this long before
	// the webhook server drains.
	shutdownDelay = "5s"
)

// replica is one guard process in its slot behind HAProxy.
type replica struct {
	slot  slot
	guard *harness.Guard
	gate  *gate
}

// TestReplicasKilledAndReplacedUnderLoad keeps ~100 admission requests/s going
// through kube-apiserver and HAProxy to three guard replicas while the
// reconciler's leader is killed with SIGKILL in the middle of a failing
// rollout, a replacement starts, and then every replica is replaced one by
// one as a rolling update does (new replica ready and taken in by the load
// balancer, then SIGTERM to an old one, which fails /readyz, serves on for
// the shutdown delay, drains and exits).
func TestReplicasKilledAndReplacedUnderLoad(t *testing.T) {
	dir, log := tier.TestWorkDir(t)
	ctx := context.Background()
	startCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()

	e := startEnv(startCtx, t, dir, log, "faults", slots, harness.LoadConfig)
	admin, kubeconfig, lb := e.admin, e.kubeconfig, e.lb

	var (
		mu      sync.Mutex
		running []*replica
		next    int
	)
	// Whatever still runs at the end is killed before the cluster goes.
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, r := range running {
			r.guard.Kill()
		}
	}()
	start := func() *replica {
		t.Helper()
		mu.Lock()
		s := lb.slots[next]
		next++
		mu.Unlock()
		out, err := os.Create(filepath.Join(dir, s.name+".log"))
		require.NoError(t, err)
		t.Cleanup(func() { out.Close() })
		g, err := harness.StartGuard(harness.GuardOptions{
			Binary: tier.Guard, Kubeconfig: kubeconfig, WorkDir: filepath.Join(dir, s.name), Config: guardConfig,
			WebhookPort: s.webhookPort, ProbePort: s.probePort, Output: out, Env: harness.DeployedRuntimeEnv(),
			// The deployed default: the load balancer must see /readyz fail
			// before the replica stops serving.
			ExtraArgs: []string{"--shutdown-delay=" + shutdownDelay},
		})
		require.NoError(t, err)
		r := &replica{slot: s, guard: g, gate: watchGate(ctx, g)}
		mu.Lock()
		running = append(running, r)
		mu.Unlock()
		return r
	}
	// ready waits until the replica is ready and the load balancer sends it
	// traffic, and returns how long each took.
	ready := func(r *replica) (toReady, toUp time.Duration) {
		t.Helper()
		began := time.Now()
		require.NoError(t, r.guard.WaitReady(ctx, time.Minute))
		toReady = time.Since(began)
		up := time.Now()
		require.NoError(t, lb.waitStatus(ctx, r.slot.name, "UP", 30*time.Second))
		return toReady, time.Since(up)
	}
	remove := func(r *replica) {
		mu.Lock()
		defer mu.Unlock()
		for i, x := range running {
			if x == r {
				running = append(running[:i], running[i+1:]...)
				return
			}
		}
	}

	var first []*replica
	for range replicas {
		first = append(first, start())
	}
	for _, r := range first {
		ready(r)
	}
	require.NoError(t, harness.WaitForWebhooks(startCtx, admin, "default", time.Minute))

	// A Deployment the reconciler knows as good, to fail a rollout of later.
	rolloutNS := harness.NewNamespace(t, admin)
	require.NoError(t, admin.Create(ctx, harness.Deployment(rolloutNS, "app", "app:1", harness.ProgressDeadline(deadline))))
	harness.WaitFor(t, 2*time.Minute, "app/1 known-good", func(ctx context.Context) (bool, string, error) {
		d := &appsv1.Deployment{}
		if err := admin.Get(ctx, client.ObjectKey{Namespace: rolloutNS, Name: "app"}, d); err != nil {
			return false, err.Error(), nil
		}
		n := ledgerOn(d).Newest()
		return n != nil && n.Revision == 1, guardState(d), nil
	})

	loadNS := harness.NewNamespace(t, admin)
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	stats, waitLoad := harness.StartLoad(loadCtx, admin, loadNS, loadRate)
	// Every replica is serving its share before anything happens to one.
	harness.WaitFor(t, time.Minute, "load through every replica", func(ctx context.Context) (bool, string, error) {
		for _, r := range first {
			if n, err := webhookRequests(r.guard); err != nil || n < 50 {
				return false, fmt.Sprintf("%s: %d requests (%v)", r.slot.name, n, err), nil
			}
		}
		return true, "", nil
	})

	// 1. The rollout fails while its leader is killed.
	holder := leaseHolder(ctx, t, admin)
	require.NotEmpty(t, holder, "a leader holds the lease")
	leader := leaderOf(t, first)
	require.NoError(t, update(ctx, admin, rolloutNS, "app", func(d *appsv1.Deployment) {
		d.Spec.Template.Spec.Containers[0].Image = "app:2"
		// Never schedulable: the rollout cannot progress.
		d.Spec.Template.Spec.NodeSelector = map[string]string{"deployguard.io/faults": "no-such-node"}
	}))
	updatedAt := time.Now()
	open, err := lb.servers(ctx)
	require.NoError(t, err)
	killAt := time.Now()
	leader.guard.Kill()
	killDone := time.Now()
	remove(leader)
	t.Logf("killed %s (the leader, lease holder %s, %d connections open) with SIGKILL at %s, %s after the bad rollout was written",
		leader.slot.name, holder, open[leader.slot.name].Current, killAt.Format("15:04:05.000"), killAt.Sub(updatedAt).Round(time.Millisecond))
	d := getDeployment(ctx, t, admin, rolloutNS, "app")
	require.Zero(t, ledgerOn(d).RolledBackRevision, "the killed leader had not rolled back yet")
	require.Empty(t, d.Labels[vocab.LabelRolledBack], "the killed leader had not rolled back yet")

	downAfterKill := time.Now()
	require.NoError(t, lb.waitStatus(ctx, leader.slot.name, "DOWN", 10*time.Second))
	t.Logf("HAProxy marked %s down %s after the kill", leader.slot.name, time.Since(downAfterKill).Round(10*time.Millisecond))
	replacement := start()
	toReady, toUp := ready(replacement)
	t.Logf("replacement %s ready %s after its start, taken in by HAProxy %s later", replacement.slot.name, toReady.Round(10*time.Millisecond), toUp.Round(10*time.Millisecond))

	var newHolder string
	harness.WaitFor(t, time.Minute, "a new leader", func(ctx context.Context) (bool, string, error) {
		newHolder = leaseHolder(ctx, t, admin)
		return newHolder != "" && newHolder != holder, newHolder, nil
	})
	t.Logf("new lease holder %s, %s after the kill", newHolder, time.Since(killAt).Round(100*time.Millisecond))
	harness.WaitFor(t, time.Duration(deadline+60)*time.Second, "app rolled back from revision 2", func(ctx context.Context) (bool, string, error) {
		d := getDeployment(ctx, t, admin, rolloutNS, "app")
		return ledgerOn(d).RolledBackRevision == 2 && d.Spec.Template.Spec.Containers[0].Image == "app:1", guardState(d), nil
	})
	t.Logf("rolled back %s after the kill", time.Since(killAt).Round(100*time.Millisecond))
	// The restored template completes as revision 3; its generation is read
	// once the guard has recorded that in its ledger (a status write), when
	// the guard has nothing left to write about the rollback.
	harness.WaitFor(t, time.Minute, "app/3 known-good", func(ctx context.Context) (bool, string, error) {
		d := getDeployment(ctx, t, admin, rolloutNS, "app")
		n := ledgerOn(d).Newest()
		return n != nil && n.Revision == 3, guardState(d), nil
	})
	rolledBack := getDeployment(ctx, t, admin, rolloutNS, "app").Generation

	// 2. A rolling update: each old replica is replaced by a new one.
	mu.Lock()
	old := append([]*replica(nil), running...)
	mu.Unlock()
	for _, o := range old {
		n := start()
		toReady, toUp := ready(n)
		before, err := lb.servers(ctx)
		require.NoError(t, err)
		term := time.Now()
		stopped := make(chan error, 1)
		go func() { stopped <- o.guard.Stop() }()
		openDuring := connectionsWhile(ctx, lb, o.slot.name, term, stopped)
		require.NoError(t, lb.waitStatus(ctx, o.slot.name, "DOWN", 10*time.Second))
		down := time.Since(term)
		require.NoError(t, <-openDuring.exited, "%s exits cleanly after SIGTERM", o.slot.name)
		exit := time.Since(term)
		remove(o)
		t.Logf("rolling: %s ready %s after start, UP in HAProxy %s later; SIGTERM to %s (%d connections open): DOWN in HAProxy after %s, exited after %s; connections open to it each second after SIGTERM: %v",
			n.slot.name, toReady.Round(10*time.Millisecond), toUp.Round(10*time.Millisecond), o.slot.name, before[o.slot.name].Current,
			down.Round(10*time.Millisecond), exit.Round(10*time.Millisecond), openDuring.perSecond())
	}

	stopLoad()
	waitLoad()
	t.Logf("load: %s", stats)

	// What failed, and why: a request in flight at the killed replica, or not.
	var atKill, other []harness.Failure
	for _, f := range stats.Failures() {
		if !f.Sent.After(killDone) && !f.Done.Before(killAt) {
			atKill = append(atKill, f)
		} else {
			other = append(other, f)
		}
	}
	t.Logf("failed requests: %d in flight at the replica killed with SIGKILL, %d otherwise", len(atKill), len(other))
	for _, f := range atKill {
		t.Logf("  in flight at the kill: %s", f)
	}
	assert.Empty(t, other, "no request fails but those in flight at a replica killed with SIGKILL")
	assert.GreaterOrEqual(t, stats.Rate(), float64(minLoadRate), "admission requests per second")

	// HAProxy closes a connection's log line when it ends: the one the
	// guard stopped last may still be open, so this is read for the report.
	if b, err := os.ReadFile(filepath.Join(dir, "haproxy.log")); err == nil {
		ends := connectionEnds(string(b), "webhooks")
		for _, s := range lb.slots[:next] {
			t.Logf("HAProxy connections to %s, by how they ended: %v", s.name, ends[s.name])
		}
	}

	// Readiness gates traffic: no replica was sent a webhook request before
	// its /readyz said ready.
	mu.Lock()
	all := append([]*replica{leader}, old...)
	all = append(all, running...)
	mu.Unlock()
	for _, r := range all {
		g := r.gate.result()
		assert.Zero(t, g.before, "%s was sent webhook requests before it was ready", r.slot.name)
		if !g.firstRequest.IsZero() && !g.readyAt.IsZero() {
			t.Logf("%s: ready %s after start, first webhook request %s after ready", r.slot.name,
				g.readyAt.Sub(g.startedAt).Round(10*time.Millisecond), g.firstRequest.Sub(g.readyAt).Round(10*time.Millisecond))
		}
	}

	// The rollout that failed while its leader was killed was rolled back once.
	var reasons []string
	harness.WaitFor(t, 15*time.Second, "the AutoRollback event", func(ctx context.Context) (bool, string, error) {
		reasons = harness.GuardEventReasons(ctx, t, admin, rolloutNS, "app")
		return count(reasons, vocab.ReasonAutoRollback) >= 1, fmt.Sprint(reasons), nil
	})
	assert.Equal(t, 1, count(reasons, vocab.ReasonAutoRollback), "one rollback: %v", reasons)
	d = getDeployment(ctx, t, admin, rolloutNS, "app")
	assert.Equal(t, rolledBack, d.Generation, "the Deployment was not changed again after its rollback, through every replica replaced")
	assert.Equal(t, int64(2), ledgerOn(d).RolledBackRevision)
	assert.Equal(t, "2", d.Labels[vocab.LabelRolledBack], "the rollback of revision 2 still stands")
}

// gate follows a starting replica until it serves: the webhook requests it
// counted while its /readyz did not say ready (must stay 0), when it became
// ready and when its first webhook request came.
type gate struct {
	mu           sync.Mutex
	startedAt    time.Time
	readyAt      time.Time
	firstRequest time.Time
	before       int
}

func (g *gate) result() gate {
	g.mu.Lock()
	defer g.mu.Unlock()
	return gate{startedAt: g.startedAt, readyAt: g.readyAt, firstRequest: g.firstRequest, before: g.before}
}

// watchGate samples the replica's request counter, then its /readyz, every
// 10ms: a count above zero read before a /readyz that still fails means a
// request reached it before it was ready.
func watchGate(ctx context.Context, g *harness.Guard) *gate {
	gt := &gate{startedAt: time.Now()}
	go func() {
		deadline := time.Now().Add(2 * time.Minute)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for time.Now().Before(deadline) && ctx.Err() == nil && !g.Exited() {
			<-tick.C
			n, err := webhookRequests(g)
			code, _, rerr := g.Get(g.ProbeAddr, "/readyz")
			now := time.Now()
			gt.mu.Lock()
			if err == nil && rerr == nil {
				if code != 200 && gt.readyAt.IsZero() && n > 0 {
					gt.before = n
				}
				if code == 200 && gt.readyAt.IsZero() {
					gt.readyAt = now
				}
				if n > 0 && gt.firstRequest.IsZero() {
					gt.firstRequest = now
				}
			}
			done := !gt.readyAt.IsZero() && !gt.firstRequest.IsZero()
			gt.mu.Unlock()
			if done {
				return
			}
		}
	}()
	return gt
}

// webhookRequests is the webhook requests the replica has answered, from
// controller-runtime's counter.
func webhookRequests(g *harness.Guard) (int, error) {
	code, body, err := g.Get(g.Metrics, "/metrics")
	if err != nil {
		return 0, err
	}
	if code != 200 {
		return 0, fmt.Errorf("metrics: status %d", code)
	}
	n := 0
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, "controller_runtime_webhook_requests_total{") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("%q: %w", line, err)
		}
		n += int(v)
	}
	return n, nil
}

// leaderOf is the replica whose leader election status is 1; the Lease names
// the holder by host name and a random id, the same host for every replica.
func leaderOf(t *testing.T, rs []*replica) *replica {
	t.Helper()
	var found *replica
	harness.WaitFor(t, 30*time.Second, "the leader among the replicas", func(context.Context) (bool, string, error) {
		var leaders []string
		found = nil
		for _, r := range rs {
			_, body, err := r.guard.Get(r.guard.Metrics, "/metrics")
			if err != nil {
				continue
			}
			if strings.Contains(body, `leader_election_master_status{name="`+leaseName+`"} 1`) {
				found = r
				leaders = append(leaders, r.slot.name)
			}
		}
		return len(leaders) == 1, fmt.Sprint(leaders), nil
	})
	return found
}

func leaseHolder(ctx context.Context, t *testing.T, c client.Client) string {
	t.Helper()
	l := &coordinationv1.Lease{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: harness.GuardNamespace, Name: leaseName}, l); err != nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

func scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	return s
}

func update(ctx context.Context, c client.Client, ns, name string, mutate func(*appsv1.Deployment)) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		d := &appsv1.Deployment{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, d); err != nil {
			return err
		}
		mutate(d)
		return c.Update(ctx, d)
	})
}

// ledgerOn is the guard's ledger on the Deployment's status (empty when it
// has none).
func ledgerOn(d *appsv1.Deployment) rollout.Ledger {
	l, _ := rollout.ReadLedger(d)
	return l
}

// guardState describes what the guard recorded on the Deployment, for a
// failure's message.
func guardState(d *appsv1.Deployment) string {
	return fmt.Sprintf("generation %d, ledger %+v, labels %v, annotations %v", d.Generation, ledgerOn(d), d.Labels, d.Annotations)
}

func getDeployment(ctx context.Context, t *testing.T, c client.Client, ns, name string) *appsv1.Deployment {
	t.Helper()
	d := &appsv1.Deployment{}
	require.NoError(t, c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, d))
	return d
}

func count(xs []string, x string) int {
	n := 0
	for _, y := range xs {
		if y == x {
			n++
		}
	}
	return n
}

// openConnections is what HAProxy counted open to a stopping replica, sampled
// every 20ms from its SIGTERM until it exited.
type openConnections struct {
	exited  chan error // the replica's exit, passed on
	mu      sync.Mutex
	samples map[int]int // whole seconds after SIGTERM → last count seen in it
}

func connectionsWhile(ctx context.Context, lb *haproxy, server string, since time.Time, stopped <-chan error) *openConnections {
	o := &openConnections{exited: make(chan error, 1), samples: map[int]int{}}
	go func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case err := <-stopped:
				o.exited <- err
				return
			case <-tick.C:
			}
			st, err := lb.servers(ctx)
			if err != nil {
				continue
			}
			o.mu.Lock()
			o.samples[int(time.Since(since)/time.Second)] = st[server].Current
			o.mu.Unlock()
		}
	}()
	return o
}

// perSecond lists the count at the end of each second after SIGTERM.
func (o *openConnections) perSecond() []int {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []int
	for i := 0; ; i++ {
		n, ok := o.samples[i]
		if !ok {
			return out
		}
		out = append(out, n)
	}
}
