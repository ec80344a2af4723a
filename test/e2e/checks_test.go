package e2e

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/analysis"
	"github.com/deployguard/deployguard/reconciler/analysis/checks"
	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/test/harness"
)

// The metric checks' scenarios of issue 55 on the kwok tier. Prometheus is
// the stand-in of test/tools/promql (Prometheus's own PromQL engine over a
// TSDB the tests feed), at the URL in the suite's guard config; the proof
// with a real Prometheus scraping real pods is the node tier's.

// checkInterval and the limits below make a 30% error rate fail a revision
// within interval × (failureLimit + 1) of its first Ready pod.
const checkInterval = 2 * time.Second

// errorRate is the kind of check the docs port from an Argo Rollouts
// AnalysisTemplate: the new pods' 5xx share over 30s. No traffic (no series)
// is neither condition: Inconclusive, never a rollback.
func errorRate(dryRun bool, bake time.Duration) checks.Spec {
	return checks.Spec{
		BakeWindow: &metav1.Duration{Duration: bake},
		Metrics: []analysis.Metric{{
			Name: "error-rate",
			Query: `sum(rate(http_requests_total{namespace="{{.Namespace}}",pod_template_hash="{{.PodTemplateHash}}",code=~"5.."}[30s]))` +
				` / sum(rate(http_requests_total{namespace="{{.Namespace}}",pod_template_hash="{{.PodTemplateHash}}"}[30s]))`,
			SuccessCondition: "len(result) > 0 && result[0] <= 0.05",
			FailureCondition: "len(result) > 0 && result[0] > 0.05",
			Interval:         metav1.Duration{Duration: checkInterval},
			InitialDelay:     metav1.Duration{Duration: checkInterval},
			FailureLimit:     ptr[int32](1),
			DryRun:           dryRun,
		}},
	}
}

// checkedNamespace makes a namespace and a ClusterDeploymentCheck of spec
// that selects it alone (by a label of the test's own), deleted with the test.
func checkedNamespace(t *testing.T, spec checks.Spec) string {
	t.Helper()
	key := dnsLabelOf(t.Name())
	ns := harness.NewNamespace(t, local.Client, harness.NamespaceLabels(map[string]string{"deployguard.io/e2e-check": key}))
	c := &checks.ClusterDeploymentCheck{
		ObjectMeta: metav1.ObjectMeta{Name: ns},
		Spec: checks.ClusterSpec{
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"deployguard.io/e2e-check": key}},
			Spec:              spec,
		},
	}
	require.NoError(t, local.Client.Create(context.Background(), c))
	t.Cleanup(func() { _ = local.Client.Delete(context.Background(), c) })
	return ns
}

func dnsLabelOf(s string) string {
	s = strings.ToLower(s)
	var b strings.Builder
	for _, r := range s {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('-')
		}
	}
	out := strings.Trim(b.String(), "-")
	if len(out) > 63 {
		out = strings.Trim(out[len(out)-63:], "-")
	}
	return out
}

// traffic feeds the stand-in Prometheus with the request counters a
// scrape of the pods of one revision would give: 10 requests a second, a
// share of them 5xx, with 30s of history, then one scrape a second until
// stopped or the test ends.
type traffic struct {
	mu      sync.Mutex
	share   float64
	ok, bad float64
	// latency is every request's duration; buckets counts them per le of
	// http_request_duration_seconds.
	latency time.Duration
	buckets map[string]float64
	stop    chan struct{}
	once    sync.Once
}

func feed(t *testing.T, ns, hash string, share float64) *traffic {
	t.Helper()
	tr := &traffic{share: share, stop: make(chan struct{})}
	start := time.Now().Add(-30 * time.Second)
	for at := start; at.Before(time.Now()); at = at.Add(5 * time.Second) {
		promStub.Load(t, tr.scrape(ns, hash, 5), at)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-tr.stop:
				return
			case <-tick.C:
				promStub.Load(t, tr.scrape(ns, hash, 1), time.Now())
			}
		}
	}()
	t.Cleanup(func() { tr.Stop(); <-done })
	return tr
}

// scrape advances the counters by secs seconds of traffic and returns them
// in the text format.
func (tr *traffic) scrape(ns, hash string, secs float64) string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.bad += 10 * secs * tr.share
	tr.ok += 10 * secs * (1 - tr.share)
	out := fmt.Sprintf("http_requests_total{namespace=%q,pod_template_hash=%q,code=\"200\"} %g\n"+
		"http_requests_total{namespace=%q,pod_template_hash=%q,code=\"500\"} %g\n", ns, hash, tr.ok, ns, hash, tr.bad)
	if tr.buckets == nil {
		tr.buckets = map[string]float64{}
	}
	for _, le := range latencyBuckets {
		bound, _ := strconv.ParseFloat(le, 64)
		if le == "+Inf" || tr.latency.Seconds() <= bound {
			tr.buckets[le] += 10 * secs
		}
		out += fmt.Sprintf("http_request_duration_seconds_bucket{namespace=%q,pod_template_hash=%q,le=%q} %g\n", ns, hash, le, tr.buckets[le])
	}
	return out
}

// latencyBuckets are the histogram's upper bounds, as a client library's
// defaults give them.
var latencyBuckets = []string{"0.05", "0.1", "0.25", "0.5", "1", "+Inf"}

// SetLatency changes every request's duration from now on.
func (tr *traffic) SetLatency(d time.Duration) { tr.mu.Lock(); tr.latency = d; tr.mu.Unlock() }

// Set changes the share of 5xx from now on.
func (tr *traffic) Set(share float64) { tr.mu.Lock(); tr.share = share; tr.mu.Unlock() }

// Stop ends the traffic (no more scrapes).
func (tr *traffic) Stop() { tr.once.Do(func() { close(tr.stop) }) }

// newHash waits for the ReplicaSet of the Deployment's revision and returns
// its pod-template-hash.
func newHash(t *testing.T, ns, name string, revision int) string {
	t.Helper()
	var hash string
	harness.WaitFor(t, 30*time.Second, fmt.Sprintf("no ReplicaSet of revision %d of %s", revision, name), func(ctx context.Context) (bool, string, error) {
		var list appsv1.ReplicaSetList
		if err := local.Client.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return false, "", err
		}
		for _, rs := range list.Items {
			if owner := metav1.GetControllerOf(&rs); owner != nil && owner.Name == name && rs.Annotations[vocab.RevisionAnnotation] == fmt.Sprint(revision) {
				hash = rs.Labels[appsv1.DefaultDeploymentUniqueLabelKey]
				return hash != "", "", nil
			}
		}
		return false, fmt.Sprintf("%d ReplicaSets", len(list.Items)), nil
	})
	return hash
}

// checkedRolloutOnce creates d, feeds its first revision healthy traffic and
// waits until that revision is known-good (after its bake window).
func checkedRolloutOnce(t *testing.T, d *appsv1.Deployment) *traffic {
	t.Helper()
	require.NoError(t, local.Client.Create(context.Background(), d))
	tr := feed(t, d.Namespace, newHash(t, d.Namespace, d.Name, 1), 0)
	waitAvailable(t, d.Namespace, d.Name, time.Minute)
	waitKnownGood(t, d.Namespace, d.Name, 1)
	return tr
}

// slowRollout makes the next rollout take about 40s (each new pod counts
// as available 20s after it is Ready), so that measurements fall inside it.
func slowRollout(image string) func(*appsv1.Deployment) {
	return func(d *appsv1.Deployment) {
		d.Spec.Template.Spec.Containers[0].Image = image
		d.Spec.MinReadySeconds = 20
		d.Spec.Strategy = appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType, RollingUpdate: &appsv1.RollingUpdateDeployment{
			MaxSurge: ptr(intstr.FromInt32(1)), MaxUnavailable: ptr(intstr.FromInt32(0))}}
	}
}

func checkLedger(d *appsv1.Deployment) *rollout.CheckRun {
	l, _ := rollout.ReadLedger(d)
	return l.Checks
}

// A release that serves 30% 5xx while Ready is rolled back during its
// rollout, within interval × (failureLimit + 1) of its first measurement plus
// a scrape; the Event, the rollback-status and `deployguard status` name the
// check, its query, the value and the condition, and `deployguard rollout
// status` fails naming the check.
func TestMetricCheckRollsBackAReleaseServingErrors(t *testing.T) {
	t.Parallel()
	ns := checkedNamespace(t, errorRate(false, 4*time.Second))
	checkedRolloutOnce(t, harness.Deployment(ns, "web", "app:1", slowDeadline))

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	statusOut := make(chan string, 1)
	require.NoError(t, update(t, ns, "web", slowRollout("app:2")))
	go func() {
		out, err := guard(ctx, t, "rollout", "status", "deploy/web", "-n", ns, "--timeout=90s")
		if err == nil {
			out = "succeeded: " + out
		}
		statusOut <- out
	}()
	feed(t, ns, newHash(t, ns, "web", 2), 0.3)

	harness.WaitFor(t, time.Minute, "revision 2 was not rolled back", func(ctx context.Context) (bool, string, error) {
		d := get(ctx, t, ns, "web")
		return rolledBackRevision(d) == 2, describe(d), nil
	})
	rolledBack := time.Now()
	d := waitAvailable(t, ns, "web", time.Minute)
	assert.Equal(t, "app:1", d.Spec.Template.Spec.Containers[0].Image)
	run := checkLedger(d)
	require.NotNil(t, run)
	first, _ := run.FirstFailedTime()
	started, _ := time.Parse(time.RFC3339, run.Started)
	t.Logf("first Ready new pod %s, first failed measurement %s, check failed %s, rollback seen by the test %s (%s after the first failed measurement)",
		run.Started, run.FirstFailed, run.Failed, rolledBack.UTC().Format(time.RFC3339Nano), rolledBack.Sub(first).Round(100*time.Millisecond))
	// The first measurement is initialDelay (one scrape here) after the
	// first Ready pod, at the second's resolution of the ledger's times.
	assert.LessOrEqual(t, first.Sub(started), checkInterval+2*time.Second, "the first measurement is one initialDelay after the first Ready pod")

	msg := guardEvent(t, ns, "web", vocab.ReasonCheckFailed)
	for _, want := range []string{"ClusterDeploymentCheck/" + ns + "/error-rate", "failed (2) > failureLimit (1)", `pod_template_hash="`, `failureCondition "len(result) > 0 && result[0] > 0.05"`, "returned [0."} {
		assert.Contains(t, msg, want)
	}
	rb := guardEvent(t, ns, "web", vocab.ReasonAutoRollback)
	assert.Contains(t, rb, "Rolled back from revision 2")
	assert.Contains(t, rb, "metric check ClusterDeploymentCheck/"+ns+"/error-rate failed")
	assert.Contains(t, d.Annotations[vocab.AnnotationRollbackStatus], "returned [0.")

	out := <-statusOut
	assert.NotContains(t, out, "succeeded:", "deployguard rollout status must fail")
	assert.Contains(t, out, "metric check ClusterDeploymentCheck/"+ns+"/error-rate failed", out)

	st, _ := guard(ctx, t, "status", ns+"/web")
	assert.Contains(t, st, "Metric checks of revision 2")
	assert.Contains(t, st, "error-rate: Failed")
	assert.Contains(t, st, "metric-check")
}

// A slow release (its p99 latency, from the histogram, above the
// condition) is rolled back; the same check passes the fast one before it.
func TestMetricCheckRollsBackASlowRelease(t *testing.T) {
	t.Parallel()
	spec := errorRate(false, 4*time.Second)
	m := &spec.Metrics[0]
	m.Name = "p99-latency"
	m.Query = `histogram_quantile(0.99, sum by (le) (rate(http_request_duration_seconds_bucket{namespace="{{.Namespace}}",pod_template_hash="{{.PodTemplateHash}}"}[30s])))`
	m.SuccessCondition = "len(result) > 0 && result[0] <= 0.25"
	m.FailureCondition = "len(result) > 0 && result[0] > 0.25"
	ns := checkedNamespace(t, spec)
	require.NoError(t, local.Client.Create(context.Background(), harness.Deployment(ns, "web", "app:1", slowDeadline)))
	fast := feed(t, ns, newHash(t, ns, "web", 1), 0)
	fast.SetLatency(40 * time.Millisecond)
	waitKnownGood(t, ns, "web", 1)

	require.NoError(t, update(t, ns, "web", slowRollout("app:2")))
	slow := feed(t, ns, newHash(t, ns, "web", 2), 0)
	slow.SetLatency(400 * time.Millisecond)
	harness.WaitFor(t, time.Minute, "the slow revision 2 was not rolled back", func(ctx context.Context) (bool, string, error) {
		d := get(ctx, t, ns, "web")
		return rolledBackRevision(d) == 2, describe(d), nil
	})
	msg := guardEvent(t, ns, "web", vocab.ReasonCheckFailed)
	assert.Contains(t, msg, "ClusterDeploymentCheck/"+ns+"/p99-latency")
	assert.Contains(t, msg, "histogram_quantile(0.99")
	assert.Contains(t, msg, `failureCondition "len(result) > 0 && result[0] > 0.25"`)
	assert.Equal(t, "app:1", waitAvailable(t, ns, "web", time.Minute).Spec.Template.Spec.Containers[0].Image)
}

// A check that compares the new pods with the known-good revision's
// ({{ .StablePodTemplateHash }}, a baseline): a first revision has none, so
// the check is Inconclusive and the revision becomes known-good; a revision
// as noisy as its baseline (12% 5xx against 10%, which a fixed 5% threshold
// would fail) passes; one 20 points worse than its baseline is rolled back.
func TestMetricCheckComparesWithTheKnownGoodRevision(t *testing.T) {
	t.Parallel()
	share := func(hash, window string) string {
		return `sum(rate(http_requests_total{namespace="{{.Namespace}}",pod_template_hash="` + hash + `",code=~"5.."}[` + window + `]))` +
			` / sum(rate(http_requests_total{namespace="{{.Namespace}}",pod_template_hash="` + hash + `"}[` + window + `]))`
	}
	spec := errorRate(false, 4*time.Second)
	m := &spec.Metrics[0]
	m.Name = "error-rate-vs-baseline"
	m.Query = "(" + share("{{.PodTemplateHash}}", "30s") + ") - on() (" + share("{{.StablePodTemplateHash}}", "5m") + ")"
	ns := checkedNamespace(t, spec)
	require.NoError(t, local.Client.Create(context.Background(), harness.Deployment(ns, "web", "app:1", slowDeadline)))
	feed(t, ns, newHash(t, ns, "web", 1), 0.1)
	msg := guardEventWithin(t, ns, "web", vocab.ReasonCheckInconclusive, time.Minute)
	assert.Contains(t, msg, "there is none")
	waitKnownGood(t, ns, "web", 1)

	require.NoError(t, update(t, ns, "web", func(d *appsv1.Deployment) { d.Spec.Template.Spec.Containers[0].Image = "app:2" }))
	baseline := newHash(t, ns, "web", 2)
	feed(t, ns, baseline, 0.12)
	waitKnownGood(t, ns, "web", 2)
	assert.Equal(t, int64(0), rolledBackRevision(get(context.Background(), t, ns, "web")), "as noisy as its baseline")

	require.NoError(t, update(t, ns, "web", func(d *appsv1.Deployment) { d.Spec.Template.Spec.Containers[0].Image = "app:3" }))
	feed(t, ns, newHash(t, ns, "web", 3), 0.32)
	harness.WaitFor(t, time.Minute, "revision 3 was not rolled back", func(ctx context.Context) (bool, string, error) {
		d := get(ctx, t, ns, "web")
		return rolledBackRevision(d) == 3, describe(d), nil
	})
	msg = guardEvent(t, ns, "web", vocab.ReasonCheckFailed)
	assert.Contains(t, msg, `pod_template_hash="`+baseline+`"`, "the baseline is revision 2's pods")
	assert.Equal(t, "app:2", waitAvailable(t, ns, "web", time.Minute).Spec.Template.Spec.Containers[0].Image)
}

// A rollout that completes and degrades inside its bake window is rolled
// back after completion; one that degrades after the window is not (it is
// known-good by then, and no longer measured).
func TestMetricCheckBakeWindow(t *testing.T) {
	t.Parallel()
	t.Run("degrades inside the window", func(t *testing.T) {
		t.Parallel()
		ns := checkedNamespace(t, errorRate(false, 30*time.Second))
		checkedRolloutOnce(t, harness.Deployment(ns, "web", "app:1", slowDeadline))
		require.NoError(t, update(t, ns, "web", func(d *appsv1.Deployment) { d.Spec.Template.Spec.Containers[0].Image = "app:2" }))
		tr := feed(t, ns, newHash(t, ns, "web", 2), 0)
		waitAvailable(t, ns, "web", time.Minute)
		harness.WaitFor(t, 30*time.Second, "the bake window did not start", func(ctx context.Context) (bool, string, error) {
			d := get(ctx, t, ns, "web")
			run := checkLedger(d)
			return run != nil && run.Revision == 2 && run.BakeUntil != "", describe(d), nil
		})
		d := get(context.Background(), t, ns, "web")
		assert.Equal(t, int64(1), knownGoodRevision(d), "a completed revision is not known-good while it bakes")
		tr.Set(0.3)
		harness.WaitFor(t, time.Minute, "revision 2 was not rolled back inside its bake window", func(ctx context.Context) (bool, string, error) {
			d := get(ctx, t, ns, "web")
			return rolledBackRevision(d) == 2, describe(d), nil
		})
		assert.Equal(t, "app:1", waitAvailable(t, ns, "web", time.Minute).Spec.Template.Spec.Containers[0].Image)
	})
	t.Run("degrades after the window", func(t *testing.T) {
		t.Parallel()
		ns := checkedNamespace(t, errorRate(false, 4*time.Second))
		checkedRolloutOnce(t, harness.Deployment(ns, "web", "app:1", slowDeadline))
		require.NoError(t, update(t, ns, "web", func(d *appsv1.Deployment) { d.Spec.Template.Spec.Containers[0].Image = "app:2" }))
		tr := feed(t, ns, newHash(t, ns, "web", 2), 0)
		waitAvailable(t, ns, "web", time.Minute)
		waitKnownGood(t, ns, "web", 2)
		tr.Set(0.3)
		// Known-good ends the checks' watch over the revision: a later
		// degradation is an incident for people, not a rollback.
		d := get(context.Background(), t, ns, "web")
		assert.Equal(t, int64(0), rolledBackRevision(d))
		assert.Equal(t, "app:2", d.Spec.Template.Spec.Containers[0].Image)
		run := checkLedger(d)
		require.NotNil(t, run)
		assert.Empty(t, run.Failed)
	})
}

// No traffic (the query returns nothing) is Inconclusive: said in an Event,
// never a rollback; the revision completes and becomes known-good. A check in
// dry run that finds 30% errors says so and rolls nothing back. A first
// revision that fails its check (no known-good revision) fails loudly and
// rolls nothing back.
func TestMetricCheckOutcomesThatNeverRollBack(t *testing.T) {
	t.Parallel()
	t.Run("no traffic", func(t *testing.T) {
		t.Parallel()
		ns := checkedNamespace(t, errorRate(false, 4*time.Second))
		checkedRolloutOnce(t, harness.Deployment(ns, "web", "app:1", slowDeadline))
		require.NoError(t, update(t, ns, "web", func(d *appsv1.Deployment) { d.Spec.Template.Spec.Containers[0].Image = "app:2" }))
		msg := guardEventWithin(t, ns, "web", vocab.ReasonCheckInconclusive, time.Minute)
		assert.Contains(t, msg, "inconclusive (1) > inconclusiveLimit (0)")
		assert.Contains(t, msg, "returned []")
		waitKnownGood(t, ns, "web", 2)
		assert.Equal(t, int64(0), rolledBackRevision(get(context.Background(), t, ns, "web")))
	})
	t.Run("dry run", func(t *testing.T) {
		t.Parallel()
		// A bake window that outlasts failureLimit + 1 measurements.
		ns := checkedNamespace(t, errorRate(true, 20*time.Second))
		checkedRolloutOnce(t, harness.Deployment(ns, "web", "app:1", slowDeadline))
		require.NoError(t, update(t, ns, "web", func(d *appsv1.Deployment) { d.Spec.Template.Spec.Containers[0].Image = "app:2" }))
		feed(t, ns, newHash(t, ns, "web", 2), 0.3)
		msg := guardEvent(t, ns, "web", vocab.ReasonCheckFailed)
		assert.Contains(t, msg, "Dry run: reported only, nothing is rolled back.")
		waitKnownGood(t, ns, "web", 2)
		d := get(context.Background(), t, ns, "web")
		assert.Equal(t, int64(0), rolledBackRevision(d))
		assert.Equal(t, "app:2", d.Spec.Template.Spec.Containers[0].Image)
	})
	t.Run("first revision", func(t *testing.T) {
		t.Parallel()
		ns := checkedNamespace(t, errorRate(false, 8*time.Second))
		require.NoError(t, local.Client.Create(context.Background(), harness.Deployment(ns, "web", "app:1", slowDeadline)))
		feed(t, ns, newHash(t, ns, "web", 1), 0.3)
		msg := guardEvent(t, ns, "web", vocab.ReasonNoKnownGoodRevision)
		assert.Contains(t, msg, "metric check ClusterDeploymentCheck/"+ns+"/error-rate failed")
		assert.Contains(t, msg, "no known-good revision")
		// Past its bake window (the guard looks again at the window's end),
		// it is still not known-good, and still runs.
		run := checkLedger(get(context.Background(), t, ns, "web"))
		require.NotNil(t, run)
		require.NotEmpty(t, run.Failed)
		until, ok := run.BakeUntilTime()
		require.True(t, ok, "the rollout completed: its bake window is set")
		harness.WaitFor(t, 30*time.Second, "a revision a check failed became known-good after its bake window", func(ctx context.Context) (bool, string, error) {
			d := get(ctx, t, ns, "web")
			return time.Now().After(until.Add(3*time.Second)) && knownGoodRevision(d) == 0, describe(d), nil
		})
		d := get(context.Background(), t, ns, "web")
		assert.Equal(t, "app:1", d.Spec.Template.Spec.Containers[0].Image)
		assert.Equal(t, int64(0), knownGoodRevision(d))
	})
}

// A tenant's DeploymentCheck reads only its own namespace's series: its
// query, written with no namespace at all, is scoped to it, so another
// namespace's errors neither fail its revision nor appear in its Events; and
// one that names another namespace is refused when it is written.
func TestTenantCheckReadsOnlyItsNamespace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	other := harness.NewNamespace(t, local.Client)
	feed(t, other, "other-hash", 1) // every request of the other namespace fails

	ns := harness.NewNamespace(t, local.Client)
	spec := errorRate(false, 4*time.Second)
	spec.Metrics[0].Query = `sum(rate(http_requests_total{code=~"5.."}[30s])) / sum(rate(http_requests_total[30s]))`
	own := &checks.DeploymentCheck{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "errors"}, Spec: spec}
	require.NoError(t, local.Client.Create(ctx, own))

	spying := own.DeepCopy()
	spying.Name = "spy"
	spying.Spec.Metrics[0].Query = fmt.Sprintf(`sum(rate(http_requests_total{namespace=%q}[30s]))`, other)
	err := local.Client.Create(ctx, spying)
	require.Error(t, err, "a DeploymentCheck naming another namespace must be refused")
	assert.True(t, apierrors.IsInvalid(err), "%v", err)
	assert.Contains(t, err.Error(), "spec.metrics[0].query")

	checkedRolloutOnce(t, harness.Deployment(ns, "web", "app:1", slowDeadline))
	require.NoError(t, update(t, ns, "web", func(d *appsv1.Deployment) { d.Spec.Template.Spec.Containers[0].Image = "app:2" }))
	feed(t, ns, newHash(t, ns, "web", 2), 0)
	waitKnownGood(t, ns, "web", 2)
	d := get(ctx, t, ns, "web")
	assert.Equal(t, int64(0), rolledBackRevision(d))
	var list eventsv1.EventList
	require.NoError(t, local.Client.List(ctx, &list, client.InNamespace(ns)))
	for _, e := range list.Items {
		assert.NotContains(t, e.Note, other, "an Event of %s names %s", ns, other)
	}
}

// Prometheus down during a rollout: every measurement is an Error, said in
// an Event with why; nothing is rolled back, the rollout completes, and past
// consecutiveErrorLimit the revision is said to be unchecked (its bake
// window outlasts five errors at the interval). Not parallel: the stand-in
// fails every query while it is down.
func TestMetricCheckPrometheusDown(t *testing.T) {
	ns := checkedNamespace(t, errorRate(false, 20*time.Second))
	checkedRolloutOnce(t, harness.Deployment(ns, "web", "app:1", slowDeadline))
	promStub.SetFailing(t, true)
	t.Cleanup(func() { promStub.SetFailing(t, false) })
	require.NoError(t, update(t, ns, "web", func(d *appsv1.Deployment) { d.Spec.Template.Spec.Containers[0].Image = "app:2" }))
	feed(t, ns, newHash(t, ns, "web", 2), 0.3)
	msg := guardEvent(t, ns, "web", vocab.ReasonCheckError)
	assert.Contains(t, msg, "could not measure revision 2")
	assert.Contains(t, msg, "503")
	waitAvailable(t, ns, "web", time.Minute)
	harness.WaitFor(t, time.Minute, "the revision was not said to be unchecked", func(ctx context.Context) (bool, string, error) {
		var list eventsv1.EventList
		if err := local.Client.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return false, "", err
		}
		for _, e := range list.Items {
			if e.Reason == vocab.ReasonCheckError && strings.Contains(e.Note, "is unchecked by") {
				return true, "", nil
			}
		}
		return false, "", nil
	})
	waitKnownGood(t, ns, "web", 2)
	d := get(context.Background(), t, ns, "web")
	assert.Equal(t, int64(0), rolledBackRevision(d))
	assert.Equal(t, "app:2", d.Spec.Template.Spec.Containers[0].Image)
}
