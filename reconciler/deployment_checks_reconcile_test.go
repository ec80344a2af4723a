package reconciler

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/deployguard/deployguard/reconciler/analysis"
	"github.com/deployguard/deployguard/reconciler/analysis/checks"
	"github.com/deployguard/deployguard/reconciler/vocab"
)

// recordingProm answers every query with a healthy error rate and keeps
// the queries it was sent.
type recordingProm struct{ queries []string }

func (p *recordingProm) Query(_ context.Context, q string, _ time.Time) (analysis.Value, error) {
	p.queries = append(p.queries, q)
	return analysis.Vector([]float64{0.01}), nil
}

func (p *recordingProm) Reserve(string) time.Duration { return 0 }

// checksEnv is a reconciler with metric checks on a fake API server
// holding d's namespace, d, its ReplicaSets and the checks.
type checksEnv struct {
	r        *DeploymentReconciler
	c        client.Client
	prom     *recordingProm
	recorder *events.FakeRecorder
	clock    *clocktesting.FakeClock
}

func newChecksEnv(t *testing.T, objs ...client.Object) *checksEnv {
	t.Helper()
	scheme := runtime.NewScheme()
	require.NoError(t, clientgoscheme.AddToScheme(scheme))
	require.NoError(t, checks.AddToScheme(scheme))
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(append(objs, ns)...).
		WithStatusSubresource(&appsv1.Deployment{}).Build()
	metrics, err := NewMetrics(prometheus.NewRegistry())
	require.NoError(t, err)
	e := &checksEnv{c: c, prom: &recordingProm{}, recorder: events.NewFakeRecorder(100), clock: clocktesting.NewFakeClock(t0.Add(time.Hour))}
	e.r = &DeploymentReconciler{Client: c, APIReader: c, Recorder: e.recorder, Clock: e.clock, Metrics: metrics,
		Options: testOptions(), Checks: &MetricChecks{Prometheus: e.prom}}
	return e
}

// pass runs the checks' phase once on the stored d and its ReplicaSets.
func (e *checksEnv) pass(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	d := &appsv1.Deployment{}
	require.NoError(t, e.c.Get(ctx, types.NamespacedName{Namespace: "shop", Name: "web"}, d))
	var list appsv1.ReplicaSetList
	require.NoError(t, e.c.List(ctx, &list, client.InNamespace("shop")))
	rss := make([]*appsv1.ReplicaSet, len(list.Items))
	for i := range list.Items {
		rss[i] = &list.Items[i]
	}
	_, _, err := e.r.reconcileChecks(ctx, d, rss)
	require.NoError(t, err)
}

// events drains the Events recorded so far.
func (e *checksEnv) events() []string {
	var out []string
	for {
		select {
		case ev := <-e.recorder.Events:
			out = append(out, ev)
		default:
			return out
		}
	}
}

// withReason keeps the Events of one reason.
func withReason(evs []string, reason string) []string {
	var out []string
	for _, ev := range evs {
		if strings.Contains(ev, " "+reason+" ") {
			out = append(out, ev)
		}
	}
	return out
}

// readyReplicaSet is revision 3 of d with a Ready pod: due for measuring.
func readyReplicaSet(d *appsv1.Deployment, mods ...func(*appsv1.ReplicaSet)) *appsv1.ReplicaSet {
	rs := replicaSet(d, 3, "web:v3", mods...)
	rs.Spec.Replicas = d.Spec.Replicas
	rs.Status = appsv1.ReplicaSetStatus{Replicas: 3, ReadyReplicas: 1}
	return rs
}

func errorRateCheck(name string, gen int64, cond string) *checks.ClusterDeploymentCheck {
	return &checks.ClusterDeploymentCheck{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name), Generation: gen},
		Spec: checks.ClusterSpec{Spec: checks.Spec{Metrics: []analysis.Metric{{
			Name: "error-rate", Query: `sum(rate(http_requests_total{pod_template_hash="{{ .PodTemplateHash }}"}[2m]))`,
			FailureCondition: cond, Interval: metav1.Duration{Duration: time.Minute},
		}}}},
	}
}

// TestInvalidCheckIsToldOnce: a check that selects a Deployment but cannot
// be measured is told in one MetricCheckInvalid Event per generation of the
// check and revision, not on every pass; a new generation that is still
// invalid is told again, and so is one past the Event's hour.
func TestInvalidCheckIsToldOnce(t *testing.T) {
	for _, tc := range []struct {
		name string
		// alongside is a valid check that also selects the Deployment (nil: none).
		alongside *checks.ClusterDeploymentCheck
	}{
		{name: "no valid check selects the Deployment"},
		{name: "a valid check measures it meanwhile", alongside: errorRateCheck("valid", 1, "result[0] > 0.05")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := deployment()
			objs := []client.Object{d, readyReplicaSet(d), errorRateCheck("broken", 1, "result[0] >")}
			if tc.alongside != nil {
				objs = append(objs, tc.alongside)
			}
			e := newChecksEnv(t, objs...)
			for range 5 {
				e.pass(t)
				e.clock.Step(30 * time.Second)
			}
			assert.Equal(t, tc.alongside != nil, len(e.prom.queries) > 0, "the valid check is measured")
			told := withReason(e.events(), vocab.ReasonCheckInvalid)
			require.Len(t, told, 1, "five passes, one Event")
			assert.Contains(t, told[0], "ClusterDeploymentCheck broken (generation 1) selects this Deployment but is not measured: spec.metrics[0].failureCondition")

			// Edited, and still invalid: a new generation is news.
			broken := &checks.ClusterDeploymentCheck{}
			require.NoError(t, e.c.Get(context.Background(), types.NamespacedName{Name: "broken"}, broken))
			broken.Generation = 2
			require.NoError(t, e.c.Update(context.Background(), broken))
			e.pass(t)
			e.pass(t)
			told = withReason(e.events(), vocab.ReasonCheckInvalid)
			require.Len(t, told, 1)
			assert.Contains(t, told[0], "(generation 2)")

			// Unseen for longer than the Event lives: told afresh.
			e.clock.Step(forgetToldAfter + time.Second)
			e.pass(t)
			assert.Len(t, withReason(e.events(), vocab.ReasonCheckInvalid), 1)
		})
	}
}

// TestInvalidToldIsBounded: a problem is told once per forgetToldAfter (the
// Event's life), however often it is seen; the memo keeps at most maxTold
// problems told within that time, and past it tells nothing new rather than
// evict one (which would then be told on every pass).
func TestInvalidToldIsBounded(t *testing.T) {
	var told invalidTold
	key := func(i int) toldKey { return toldKey{check: "c", generation: int64(i), replicaSet: "rs"} }
	for i := range maxTold {
		require.True(t, told.first(key(i), t0.Add(time.Duration(i)*time.Millisecond)))
	}
	now := t0.Add(time.Minute)
	assert.False(t, told.first(key(maxTold), now), "full: not told")
	assert.False(t, told.first(key(0), now), "told a minute ago")
	assert.Equal(t, maxTold, len(told.seen))

	later := t0.Add(forgetToldAfter + 5*time.Second)
	assert.True(t, told.first(key(0), later), "its Event expired: told again, though seen all along")
	assert.True(t, told.first(key(maxTold), later), "room again")
	assert.Equal(t, 2, len(told.seen), "problems told over an hour ago are forgotten")
}

func TestRevisionHash(t *testing.T) {
	d := deployment()
	for _, tc := range []struct {
		name, rsName, label string
		want                string
		wantErr             string
	}{
		{name: "the name's suffix, as the Deployment controller names it", rsName: "web-5d8f9c7b6", label: "5d8f9c7b6", want: "5d8f9c7b6"},
		{name: "a label relabelled to another revision's hash", rsName: "web-5d8f9c7b6", label: "7c9b8f6d5",
			wantErr: `ReplicaSet web-5d8f9c7b6 is labelled pod-template-hash="7c9b8f6d5", not its name's "5d8f9c7b6"`},
		{name: "a label removed", rsName: "web-5d8f9c7b6",
			wantErr: `ReplicaSet web-5d8f9c7b6 is labelled pod-template-hash="", not its name's "5d8f9c7b6"`},
		{name: "a name not of the Deployment's", rsName: "api-5d8f9c7b6", label: "5d8f9c7b6",
			wantErr: "ReplicaSet api-5d8f9c7b6 is not named web-<pod-template-hash>"},
		{name: "a name of another Deployment that starts with this one's", rsName: "web-canary-5d8f9c7b6", label: "canary-5d8f9c7b6",
			wantErr: "ReplicaSet web-canary-5d8f9c7b6 is not named web-<pod-template-hash>"},
		{name: "the Deployment's name and a dash alone", rsName: "web-", label: "",
			wantErr: "ReplicaSet web- is not named web-<pod-template-hash>"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: tc.rsName, Labels: map[string]string{}}}
			if tc.label != "" {
				rs.Labels[appsv1.DefaultDeploymentUniqueLabelKey] = tc.label
			}
			got, err := revisionHash(d, rs)
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				assert.Empty(t, got)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

// TestRelabelledRevisionIsNotMeasured: a new ReplicaSet whose
// pod-template-hash label was changed to another revision's is never
// measured with it: no query goes to Prometheus, the measurement is an
// Error that says why, and nothing rolls back.
func TestRelabelledRevisionIsNotMeasured(t *testing.T) {
	for _, tc := range []struct {
		name        string
		label       string
		wantQueries []string
		wantError   string
	}{
		{name: "the label as the controller set it: measured with the name's hash", label: "h3",
			wantQueries: []string{`sum(rate(http_requests_total{pod_template_hash="h3"}[2m]))`}},
		{name: "relabelled to another revision's hash: not measured", label: "h2",
			wantError: `could not measure revision 3: ReplicaSet web-h3 is labelled pod-template-hash="h2", not its name's "h3"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := deployment()
			rs := readyReplicaSet(d, func(rs *appsv1.ReplicaSet) { rs.Labels[appsv1.DefaultDeploymentUniqueLabelKey] = tc.label })
			e := newChecksEnv(t, d, rs, errorRateCheck("errors", 1, "result[0] > 0.05"))
			e.pass(t)
			assert.Equal(t, tc.wantQueries, e.prom.queries)
			errs := withReason(e.events(), vocab.ReasonCheckError)
			if tc.wantError == "" {
				assert.Empty(t, errs)
				return
			}
			require.Len(t, errs, 1)
			assert.Contains(t, errs[0], tc.wantError)
			assert.Empty(t, withReason(errs, vocab.ReasonCheckFailed))
		})
	}
}
