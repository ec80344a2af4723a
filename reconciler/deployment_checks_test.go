package reconciler

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"

	"github.com/deployguard/deployguard/reconciler/analysis"
	"github.com/deployguard/deployguard/reconciler/analysis/checks"
	"github.com/deployguard/deployguard/reconciler/analysis/promscope"
	"github.com/deployguard/deployguard/reconciler/rollout"
)

// testMetric compiles a platform metric for the tests.
func testMetric(t *testing.T, m analysis.Metric) checks.Metric {
	t.Helper()
	c, errs := analysis.Compile(m, field.NewPath("m"))
	require.Empty(t, errs)
	q, err := promscope.ParseUnscoped(m.Query)
	require.NoError(t, err)
	return checks.Metric{Kind: checks.ClusterKind, Name: "errors", Check: c, Query: q}
}

func TestPlanChecks(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	every30 := testMetric(t, analysis.Metric{Name: "rate", Query: "up", FailureCondition: "result[0] > 0.05", Interval: metav1.Duration{Duration: 30 * time.Second}})
	delayed := testMetric(t, analysis.Metric{Name: "delayed", Query: "up", FailureCondition: "result[0] > 0.05", Interval: metav1.Duration{Duration: 30 * time.Second}, InitialDelay: metav1.Duration{Duration: 30 * time.Second}})
	once := testMetric(t, analysis.Metric{Name: "once", Query: "up", SuccessCondition: "result[0] < 1"})
	at := func(d time.Duration) string { return formatTime(t0.Add(d)) }
	run := func(mut func(*rollout.CheckRun)) *rollout.CheckRun {
		r := &rollout.CheckRun{ReplicaSet: "web-2", Revision: 2, Started: at(0)}
		if mut != nil {
			mut(r)
		}
		return r
	}
	tests := []struct {
		name      string
		in        CheckInput
		wantRun   bool
		wantDue   []int
		wantAgain time.Duration
		wantBaked bool
		wantBake  string
	}{
		{name: "no checks select it: nothing", in: CheckInput{Metrics: nil, Ready: true}},
		{name: "no new pod Ready yet: nothing to measure", in: CheckInput{Metrics: []checks.Metric{every30}, NewRS: "web-2", Revision: 2}},
		{name: "first Ready pod: the run starts and every metric is due", in: CheckInput{Metrics: []checks.Metric{every30, once}, NewRS: "web-2", Revision: 2, Ready: true, Now: t0},
			wantRun: true, wantDue: []int{0, 1}, wantAgain: 10 * time.Second},
		{name: "initialDelay: the first measurement waits for it", in: CheckInput{Run: run(nil), Metrics: []checks.Metric{delayed}, NewRS: "web-2", Revision: 2, Ready: true, Now: t0.Add(10 * time.Second)},
			wantRun: true, wantAgain: 20 * time.Second},
		{name: "initialDelay passed: due", in: CheckInput{Run: run(nil), Metrics: []checks.Metric{delayed}, NewRS: "web-2", Revision: 2, Ready: true, Now: t0.Add(30 * time.Second)},
			wantRun: true, wantDue: []int{0}, wantAgain: 30 * time.Second},
		{name: "measured 10s ago: due in 20s", in: CheckInput{Run: run(func(r *rollout.CheckRun) {
			r.Metrics = []rollout.MetricRun{{Key: every30.Key(), Counts: analysis.Counts{Count: 1, Successful: 1}, Last: at(0)}}
		}), Metrics: []checks.Metric{every30}, NewRS: "web-2", Revision: 2, Ready: true, Now: t0.Add(10 * time.Second)},
			wantRun: true, wantAgain: 20 * time.Second},
		{name: "a metric without interval measured once is done", in: CheckInput{Run: run(func(r *rollout.CheckRun) {
			r.Metrics = []rollout.MetricRun{{Key: once.Key(), Counts: analysis.Counts{Count: 1, Successful: 1}, Last: at(0)}}
		}), Metrics: []checks.Metric{once}, NewRS: "web-2", Revision: 2, Ready: true, Now: t0.Add(time.Minute)},
			wantRun: true},
		{name: "a metric without interval is measured again 10s after an Error", in: CheckInput{Run: run(func(r *rollout.CheckRun) {
			r.Metrics = []rollout.MetricRun{{Key: once.Key(), Counts: analysis.Counts{Error: 1, ConsecutiveError: 1}, Last: at(0)}}
		}), Metrics: []checks.Metric{once}, NewRS: "web-2", Revision: 2, Ready: true, Now: t0.Add(10 * time.Second)},
			wantRun: true, wantDue: []int{0}, wantAgain: 10 * time.Second},
		{name: "completion starts the bake window", in: CheckInput{Run: run(nil), Metrics: []checks.Metric{every30}, NewRS: "web-2", Revision: 2,
			Ready: true, Complete: true, Now: t0.Add(time.Minute), Bake: 5 * time.Minute},
			wantRun: true, wantDue: []int{0}, wantAgain: 30 * time.Second, wantBake: at(6 * time.Minute)},
		{name: "bake window passed: baked, nothing measured", in: CheckInput{Run: run(func(r *rollout.CheckRun) { r.BakeUntil = at(5 * time.Minute) }),
			Metrics: []checks.Metric{every30}, NewRS: "web-2", Revision: 2, Ready: true, Complete: true, Now: t0.Add(5 * time.Minute)},
			wantRun: true, wantBaked: true, wantBake: at(5 * time.Minute)},
		{name: "bake window passed on a Failed latest measurement: measured on until it fails or recovers", in: CheckInput{Run: run(func(r *rollout.CheckRun) {
			r.BakeUntil = at(5 * time.Minute)
			r.Metrics = []rollout.MetricRun{{Key: every30.Key(), Counts: analysis.Counts{Count: 3, Successful: 2, Failed: 1}, Last: at(4*time.Minute + 50*time.Second), LastPhase: analysis.PhaseFailed}}
		}), Metrics: []checks.Metric{every30}, NewRS: "web-2", Revision: 2, Ready: true, Complete: true, Now: t0.Add(5*time.Minute + 20*time.Second)},
			wantRun: true, wantDue: []int{0}, wantAgain: 30 * time.Second, wantBake: at(5 * time.Minute)},
		{name: "bake window passed after a recovery: baked", in: CheckInput{Run: run(func(r *rollout.CheckRun) {
			r.BakeUntil = at(5 * time.Minute)
			r.Metrics = []rollout.MetricRun{{Key: every30.Key(), Counts: analysis.Counts{Count: 4, Successful: 3, Failed: 1}, Last: at(5*time.Minute + 20*time.Second), LastPhase: analysis.PhaseSuccessful}}
		}), Metrics: []checks.Metric{every30}, NewRS: "web-2", Revision: 2, Ready: true, Complete: true, Now: t0.Add(5*time.Minute + 21*time.Second)},
			wantRun: true, wantBaked: true, wantBake: at(5 * time.Minute)},
		{name: "the bake window's end wakes it", in: CheckInput{Run: run(func(r *rollout.CheckRun) {
			r.BakeUntil = at(40 * time.Second)
			r.Metrics = []rollout.MetricRun{{Key: every30.Key(), Counts: analysis.Counts{Count: 1, Successful: 1}, Last: at(25 * time.Second)}}
		}), Metrics: []checks.Metric{every30}, NewRS: "web-2", Revision: 2, Ready: true, Complete: true, Now: t0.Add(30 * time.Second)},
			wantRun: true, wantAgain: 10 * time.Second, wantBake: at(40 * time.Second)},
		{name: "a failed run measures nothing more", in: CheckInput{Run: run(func(r *rollout.CheckRun) { r.Failed = at(0) }),
			Metrics: []checks.Metric{every30}, NewRS: "web-2", Revision: 2, Ready: true, Now: t0.Add(time.Minute)},
			wantRun: true},
		{name: "a run of another revision is replaced", in: CheckInput{Run: &rollout.CheckRun{ReplicaSet: "web-1", Revision: 1, Failed: at(0)},
			Metrics: []checks.Metric{every30}, NewRS: "web-2", Revision: 2, Ready: true, Now: t0},
			wantRun: true, wantDue: []int{0}, wantAgain: 30 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := PlanChecks(tt.in)
			assert.Equal(t, tt.wantRun, got.Run != nil, "run")
			assert.Equal(t, tt.wantDue, got.Due, "due")
			assert.Equal(t, tt.wantAgain, got.Again, "again")
			assert.Equal(t, tt.wantBaked, got.Baked, "baked")
			if got.Run != nil {
				assert.Equal(t, tt.in.NewRS, got.Run.ReplicaSet)
				assert.Equal(t, tt.wantBake, got.Run.BakeUntil, "bakeUntil")
			}
		})
	}
}

func TestRecordMeasurement(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	m := testMetric(t, analysis.Metric{Name: "rate", Query: "up", FailureCondition: "result[0] > 0.05",
		Interval: metav1.Duration{Duration: 30 * time.Second}, FailureLimit: ptr.To[int32](1)})
	dry := testMetric(t, analysis.Metric{Name: "dry", Query: "up", FailureCondition: "result[0] > 0.05", DryRun: true})

	run := &rollout.CheckRun{ReplicaSet: "web-2", Revision: 2}
	failed := Measured{Phase: analysis.PhaseFailed, Value: "[0.3]", Query: `sum(rate(x{namespace="a"}[1m]))`}
	assert.Nil(t, RecordMeasurement(run, m, failed, t0), "one failure is within failureLimit 1")
	assert.Equal(t, formatTime(t0), run.FirstFailed)
	assert.Empty(t, run.Failed)
	assert.Nil(t, RecordMeasurement(run, m, Measured{Phase: analysis.PhaseError, Value: "unreachable"}, t0.Add(30*time.Second)), "an error counts apart")
	v := RecordMeasurement(run, m, failed, t0.Add(time.Minute))
	require.NotNil(t, v)
	assert.Equal(t, analysis.PhaseFailed, v.Phase)
	assert.Equal(t, formatTime(t0.Add(time.Minute)), run.Failed)
	assert.Equal(t, formatTime(t0), run.FirstFailed, "the reaction counts from the first failed measurement")
	assert.Contains(t, run.Evidence, "ClusterDeploymentCheck/errors/rate")
	assert.Contains(t, run.Evidence, `returned [0.3]`)
	assert.Contains(t, run.Evidence, `failureCondition "result[0] > 0.05"`)
	assert.Contains(t, run.Evidence, "failed (2) > failureLimit (1)")
	assert.Equal(t, analysis.Counts{Count: 2, Failed: 2, Error: 1}, run.Metric(m.Key()).Counts)

	dryRun := &rollout.CheckRun{ReplicaSet: "web-2", Revision: 2}
	v = RecordMeasurement(dryRun, dry, failed, t0)
	require.NotNil(t, v)
	assert.Equal(t, analysis.PhaseFailed, v.Phase)
	assert.Empty(t, dryRun.Failed, "a dry-run check never fails the run")
	assert.Empty(t, dryRun.FirstFailed)
}

func TestBakeWindowIsTheLongest(t *testing.T) {
	c := &MetricChecks{}
	a := checks.Metric{}
	b := checks.Metric{BakeWindow: &metav1.Duration{Duration: 20 * time.Minute}}
	z := checks.Metric{BakeWindow: &metav1.Duration{}}
	assert.Equal(t, DefaultBakeWindow, c.bakeWindow([]checks.Metric{a, z}))
	assert.Equal(t, 20*time.Minute, c.bakeWindow([]checks.Metric{a, b}))
	assert.Equal(t, time.Duration(0), c.bakeWindow([]checks.Metric{z}))
}

func TestStableHash(t *testing.T) {
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "web"}}
	newRS := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "web-new5", UID: "new"}}
	entry := func(name string, uid types.UID) rollout.KnownGoodEntry {
		return rollout.KnownGoodEntry{ReplicaSet: name, UID: uid}
	}
	for _, tc := range []struct {
		name  string
		known []rollout.KnownGoodEntry
		want  string
	}{
		{name: "no known-good revision: no baseline"},
		{name: "the newest known-good revision", known: []rollout.KnownGoodEntry{entry("web-old1", "1"), entry("web-old2", "2")}, want: "old2"},
		{name: "the new revision itself is skipped (known-good once, rolled out again)", known: []rollout.KnownGoodEntry{entry("web-old1", "1"), entry("web-new5", "new")}, want: "old1"},
		{name: "a name not of the Deployment's form: no baseline rather than a guess", known: []rollout.KnownGoodEntry{entry("other-old1", "1")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, stableHash(d, rollout.Ledger{KnownGood: tc.known}, newRS))
		})
	}
}

// A query comparing with the known-good revision, for a revision that has
// none, is Inconclusive (never a rollback) and sends nothing to Prometheus.
func TestMeasureWithoutBaselineIsInconclusive(t *testing.T) {
	m := testMetric(t, analysis.Metric{
		Name:             "errors-vs-baseline",
		Query:            `sum(rate(http_requests_total{pod_template_hash="{{ .PodTemplateHash }}"}[1m])) - sum(rate(http_requests_total{pod_template_hash="{{ .StablePodTemplateHash }}"}[1m]))`,
		SuccessCondition: "result[0] <= 0.01",
	})
	r := &DeploymentReconciler{} // no Prometheus: a query sent would panic
	got := r.measure(context.Background(), m, promscope.Vars{Namespace: "team-a", Name: "web", PodTemplateHash: "new5"}, time.Now())
	assert.Equal(t, analysis.PhaseInconclusive, got.Phase)
	assert.Contains(t, got.Value, "there is none")
}

// The check reaction metric counts only rollbacks a check's failure caused:
// not a deadline or fail-fast that overtook a check still measuring.
func TestCheckFailedFirst(t *testing.T) {
	first := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "web"}}
	rollout.SetLedger(&d.Status, rollout.Ledger{Checks: &rollout.CheckRun{
		ReplicaSet: "web-2", Revision: 2, Evidence: "metric check x failed", FirstFailed: first.Format(time.RFC3339),
	}}, first)
	newRS := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "web-2"}}
	decided := func(msg string, rev int64) Decision {
		return Decision{NewRS: newRS, FailedRevision: rev, Deadline: &appsv1.DeploymentCondition{Message: msg}}
	}
	for _, tc := range []struct {
		name string
		dec  Decision
		want bool
	}{
		{name: "the check's failure", dec: decided(DeclaredFailureMessage("web-2", "metric check x failed"), 2), want: true},
		{name: "upstream's deadline", dec: decided(`ReplicaSet "web-2" has timed out progressing.`, 2)},
		{name: "fail-fast's declaration", dec: decided(DeclaredFailureMessage("web-2", "2/2 new pods CrashLoopBackOff"), 2)},
		{name: "another revision", dec: decided(DeclaredFailureMessage("web-2", "metric check x failed"), 3)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			at, ok := checkFailedFirst(d, tc.dec)
			assert.Equal(t, tc.want, ok)
			if tc.want {
				assert.Equal(t, first, at)
			}
		})
	}
}
