package node

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/analysis"
	"github.com/deployguard/deployguard/reconciler/analysis/checks"
	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/test/harness"
)

// The metric checks of issue 55 proved on the real node: a real Prometheus
// (built by test/tools/build-node.sh) discovers the test app's pods through
// the API server, scrapes their /metrics, and the guard, installed by helm,
// queries it to measure each new revision. The kwok tier's
// test/e2e/checks_test.go holds the same scenarios on a stand-in fed by
// the test.

// Each metric is measured every checkInterval; two Failed measurements
// (failureLimit 1) fail a revision. scrapeInterval is Prometheus's.
const (
	checkInterval  = 2 * time.Second
	failureLimit   = 1
	scrapeInterval = 2 * time.Second
	// checkBake keeps measuring a revision this long after its rollout
	// completes: a real Prometheus sees a new pod's first samples some
	// seconds after it is Ready (discovery, then two scrapes for a rate).
	checkBake = 30 * time.Second
	// A new pod has no samples for its first seconds: Prometheus's
	// discovery passes new targets on every 5s, and a rate needs two
	// scrapes. The first measurement waits that long (initialDelay);
	// a measurement before the data is Inconclusive, and past
	// inconclusiveLimit (Argo's rule) the metric stops measuring the
	// revision for good, so a small tolerance covers a slow discovery.
	checkInitialDelay      = 5*time.Second + 2*scrapeInterval + time.Second
	checkInconclusiveLimit = 2
)

// checkLabel selects the namespaces of this file's check.
const checkLabel = "deployguard.io/node-check"

// revisionScope is the selector of one revision's series, as the
// Prometheus config below labels them.
const revisionScope = `namespace="{{.Namespace}}",pod_template_hash="{{.PodTemplateHash}}"`

// errorRateMetric is the docs' check: the new pods' share of 5xx over 30s.
func errorRateMetric() analysis.Metric {
	return analysis.Metric{
		Name: "error-rate",
		Query: `sum(rate(http_requests_total{` + revisionScope + `,code=~"5.."}[30s]))` +
			` / sum(rate(http_requests_total{` + revisionScope + `}[30s]))`,
		SuccessCondition:  "len(result) > 0 && result[0] <= 0.05",
		FailureCondition:  "len(result) > 0 && result[0] > 0.05",
		Interval:          metav1.Duration{Duration: checkInterval},
		InitialDelay:      metav1.Duration{Duration: checkInitialDelay},
		FailureLimit:      ptr.To[int32](failureLimit),
		InconclusiveLimit: ptr.To[int32](checkInconclusiveLimit),
	}
}

// latencyMetric fails a revision whose p99 over 30s is above 250ms (the
// app's histogram has a bucket there).
func latencyMetric() analysis.Metric {
	return analysis.Metric{
		Name:              "p99-latency",
		Query:             `histogram_quantile(0.99, sum by (le) (rate(http_request_duration_seconds_bucket{` + revisionScope + `}[30s])))`,
		SuccessCondition:  "len(result) > 0 && result[0] <= 0.25",
		FailureCondition:  "len(result) > 0 && result[0] > 0.25",
		Interval:          metav1.Duration{Duration: checkInterval},
		InitialDelay:      metav1.Duration{Duration: checkInitialDelay},
		FailureLimit:      ptr.To[int32](failureLimit),
		InconclusiveLimit: ptr.To[int32](checkInconclusiveLimit),
	}
}

// longBake is the bake window of the check under which a release degrades
// inside it: long enough that the degradation (20s after the pod starts),
// Prometheus's rate window and two Failed measurements all fit before it ends.
const longBake = 60 * time.Second

// The metric checks' scenarios on a real Prometheus, which discovers the
// test app's pods through the API server and scrapes them, with the app's
// traffic sent through its Service. In parallel: a release serving 30% 5xx
// and one answering in 300ms are rolled back; one that degrades inside its
// bake window is rolled back after completing, one that degrades after it
// is not; no traffic is inconclusive and a dry run reports, neither rolls
// back; a tenant's query reads only its own namespace. Then Prometheus is
// stopped during a rollout. One Prometheus and one helm upgrade for all.
func TestMetricCheckOnARealPrometheus(t *testing.T) {
	ctx := context.Background()
	key := fmt.Sprint(os.Getpid())
	// Each namespace runs under the ClusterDeploymentCheck named by its
	// label's value.
	checked := func(check string) string {
		return harness.NewNamespace(t, cl, harness.NamespaceLabels(map[string]string{checkLabel: key + "-" + check}))
	}
	nsErrors, nsSlow, nsAfter, nsQuiet, nsDown := checked("main"), checked("main"), checked("main"), checked("main"), checked("main")
	nsInside, nsDry := checked("long-bake"), checked("dry-run")
	// The tenant's namespace runs under its own DeploymentCheck only; the
	// other serves errors that the tenant's query must not read.
	nsTenant, nsOther := harness.NewNamespace(t, cl), harness.NewNamespace(t, cl)

	prom := startPrometheus(t, []string{nsErrors, nsSlow, nsAfter, nsQuiet, nsDown, nsInside, nsDry, nsTenant, nsOther})
	pointGuardAt(ctx, t, prom.URL)

	cc := checksClient(t)
	dryErrorRate := errorRateMetric()
	dryErrorRate.DryRun = true
	for _, c := range []struct {
		name    string
		bake    time.Duration
		metrics []analysis.Metric
	}{
		{name: "main", bake: checkBake, metrics: []analysis.Metric{errorRateMetric(), latencyMetric()}},
		{name: "long-bake", bake: longBake, metrics: []analysis.Metric{errorRateMetric()}},
		{name: "dry-run", bake: checkBake, metrics: []analysis.Metric{dryErrorRate}},
	} {
		check := &checks.ClusterDeploymentCheck{
			ObjectMeta: metav1.ObjectMeta{Name: "node-" + key + "-" + c.name},
			Spec: checks.ClusterSpec{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{checkLabel: key + "-" + c.name}},
				Spec:              checks.Spec{BakeWindow: &metav1.Duration{Duration: c.bake}, Metrics: c.metrics},
			},
		}
		require.NoError(t, cc.Create(ctx, check))
		t.Cleanup(func() { _ = cc.Delete(context.Background(), check) })
	}
	mainKey := "ClusterDeploymentCheck/node-" + key + "-main/"

	t.Run("rollouts", func(t *testing.T) {
		t.Run("serves 30% 5xx", func(t *testing.T) {
			t.Parallel()
			rolledBackByCheck(ctx, t, nsErrors, "errors", mainKey+"error-rate")
		})
		t.Run("answers in 300ms", func(t *testing.T) {
			t.Parallel()
			rolledBackByCheck(ctx, t, nsSlow, "latency", mainKey+"p99-latency")
		})
		t.Run("degrades inside the bake window", func(t *testing.T) {
			t.Parallel()
			degradesInsideTheBakeWindow(ctx, t, nsInside)
		})
		t.Run("degrades after the bake window", func(t *testing.T) {
			t.Parallel()
			degradesAfterTheBakeWindow(ctx, t, prom, nsAfter)
		})
		t.Run("no traffic", func(t *testing.T) {
			t.Parallel()
			noTrafficIsInconclusive(ctx, t, nsQuiet)
		})
		t.Run("dry run", func(t *testing.T) {
			t.Parallel()
			dryRunReportsOnly(ctx, t, nsDry)
		})
		t.Run("a tenant's query", func(t *testing.T) {
			t.Parallel()
			tenantQueryReadsOnlyItsNamespace(ctx, t, cc, nsTenant, nsOther)
		})
		t.Run("known-good before Prometheus stops", func(t *testing.T) {
			t.Parallel()
			deployGood(ctx, t, nsDown, "web", oneAtATime)
		})
	})
	if n, err := prom.QueriesServed(); err == nil {
		t.Logf("Prometheus served %g instant queries (/api/v1/query) before it was stopped", n)
	}
	if t.Failed() {
		return
	}
	t.Run("Prometheus stopped during a rollout", func(t *testing.T) {
		prometheusStoppedDuringARollout(ctx, t, prom, nsDown)
	})
}

// waitNote waits for a guard's Event of reason about ns/web whose note
// holds every one of parts, and returns that note.
func waitNote(t *testing.T, ns, reason string, parts ...string) string {
	t.Helper()
	var found string
	harness.WaitFor(t, 2*time.Minute, fmt.Sprintf("no %s Event saying %q", reason, parts), func(ctx context.Context) (bool, string, error) {
		notes := guardNotes(ctx, t, ns, "web", reason)
	next:
		for _, n := range notes {
			for _, p := range parts {
				if !strings.Contains(n, p) {
					continue next
				}
			}
			found = n
			return true, "", nil
		}
		return false, fmt.Sprint(notes), nil
	})
	t.Logf("%s: %s", reason, found)
	return found
}

// newHealthyRevision rolls ns/name out to a healthy revision 2 of the same
// image, as `kubectl set env` does. Not the v2 tag: a pull of it here would
// leave it on the node, and TestRegistryOutageIsWaitedOut, later in the
// tier, needs a pull of v2 to meet its stopped registry.
func newHealthyRevision(ctx context.Context, t *testing.T, ns, name string) {
	t.Helper()
	r := kubectl(ctx, "set", "env", "-n", ns, "deploy/"+name, "APP_VERSION=v1-revision-2")
	require.Zero(t, r.Code, r.String())
}

// webService makes the Service of the app ns/web and returns its ClusterIP.
func webService(ctx context.Context, t *testing.T, ns string) string {
	t.Helper()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
		Spec: corev1.ServiceSpec{
			Selector: app(ns, "web", "v1").Spec.Selector.MatchLabels,
			Ports:    []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}},
		},
	}
	require.NoError(t, cl.Create(ctx, svc))
	return svc.Spec.ClusterIP
}

// serving deploys the app at v1 behind a Service with traffic sent through
// its ClusterIP, as kube-proxy routes it from the node (this test's network
// namespace), and waits until v1 is known-good.
func serving(ctx context.Context, t *testing.T, ns string, opts ...harness.DeploymentOption) *traffic {
	t.Helper()
	load := sendLoad(t, "http://"+webService(ctx, t, ns)+"/")
	start := time.Now()
	deployGood(ctx, t, ns, "web", opts...)
	t.Logf("v1 known-good (after its bake) in %s; load so far %s", time.Since(start).Round(time.Second), load)
	return load
}

// oneAtATime is a rollout of one new pod at a time: the old ones keep serving.
func oneAtATime(d *appsv1.Deployment) {
	d.Spec.Strategy = appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType, RollingUpdate: &appsv1.RollingUpdateDeployment{
		MaxSurge: ptr.To(intstr.FromInt32(1)), MaxUnavailable: ptr.To(intstr.FromInt32(0))}}
}

// degradeAfter sets the app's APP_DEGRADE_AFTER (the degrades tag's
// environment; the other tags ignore it).
func degradeAfter(after time.Duration) harness.DeploymentOption {
	return func(d *appsv1.Deployment) {
		c := &d.Spec.Template.Spec.Containers[0]
		c.Env = append(c.Env, corev1.EnvVar{Name: "APP_DEGRADE_AFTER", Value: after.String()})
	}
}

// rolledBackByCheck deploys the app at v1 with traffic, updates it to tag,
// and asserts the guard rolls revision 2 back for the metric key, in time.
func rolledBackByCheck(ctx context.Context, t *testing.T, ns, tag, key string) {
	load := serving(ctx, t, ns, oneAtATime)
	updated := time.Now()
	setImage(ctx, t, ns, "web", tag)
	var seen time.Time
	final := waitDeployment(t, ns, "web", "revision 2 was not rolled back by its metric check", 3*time.Minute, func(l rollout.Ledger, _ *appsv1.Deployment) bool {
		if l.RolledBackRevision == 2 && seen.IsZero() {
			seen = time.Now()
		}
		return !seen.IsZero()
	})
	run := checkRun(final)
	require.NotNil(t, run, "the ledger keeps the checks' run of revision 2")
	t.Logf("ledger checks of revision %d: started (first Ready new pod) %s, first failed measurement %s, failed %s; rollback seen %s; evidence: %s",
		run.Revision, run.Started, run.FirstFailed, run.Failed, seen.UTC().Format(time.RFC3339), run.Evidence)
	for _, m := range run.Metrics {
		t.Logf("metric %s: %+v phase %q %s", m.Key, m.Counts, m.Phase, m.Message)
		if m.Key != key {
			assert.NotEqual(t, analysis.PhaseFailed, m.Phase, "%s judges what the release did not break", m.Key)
		}
	}
	rb := rolledBack(ctx, t, ns, "web", 2*time.Minute)
	t.Logf("AutoRollback: %s", rb)
	assert.Contains(t, rb, "metric check "+key+" failed")

	first, err := time.Parse(time.RFC3339, run.FirstFailed)
	require.NoError(t, err, "ledger checks.firstFailed")
	started, err := time.Parse(time.RFC3339, run.Started)
	require.NoError(t, err, "ledger checks.started")
	// The second Failed measurement comes interval after the first; then
	// the rollback phase acts at once. A scrape, the ledger's second
	// resolution and this poll are the slack.
	bound := checkInterval*(failureLimit+1) + scrapeInterval + 3*time.Second
	// From the first Ready new pod: initialDelay (discovery and two
	// scrapes), at most inconclusiveLimit measurements before the data,
	// then the two Failed measurements, and the same slack.
	fromReady := checkInitialDelay + checkInterval*(checkInconclusiveLimit+failureLimit+1) + scrapeInterval + 3*time.Second
	t.Logf("update to rollback %s; first Ready new pod to first failed measurement %s (Prometheus's discovery and scrapes); first failed measurement to rollback %s (bound %s); first Ready new pod to rollback %s (bound %s)",
		seen.Sub(updated).Round(time.Second), first.Sub(started), seen.Sub(first).Round(time.Second), bound, seen.Sub(started).Round(time.Second), fromReady)
	assert.LessOrEqual(t, seen.Sub(first), bound, "first failed measurement to rollback")
	assert.LessOrEqual(t, seen.Sub(started), fromReady, "first Ready new pod to rollback")

	notes := guardNotes(ctx, t, ns, "web", vocab.ReasonCheckFailed)
	require.NotEmpty(t, notes, "a %s Event", vocab.ReasonCheckFailed)
	t.Logf("%s: %s", vocab.ReasonCheckFailed, notes[0])
	assert.Contains(t, notes[0], key)
	assert.Contains(t, notes[0], fmt.Sprintf("failed (2) > failureLimit (%d)", failureLimit))
	t.Logf("load through the Service: %s", load)
}

// A release that completes, then serves 30% 5xx 20s after its pods start,
// inside its 60s bake window: not known-good while it bakes, and rolled back
// after completing.
func degradesInsideTheBakeWindow(ctx context.Context, t *testing.T, ns string) {
	serving(ctx, t, ns, oneAtATime, degradeAfter(20*time.Second))
	setImage(ctx, t, ns, "web", "degrades")
	baking := waitDeployment(t, ns, "web", "revision 2 did not complete", 2*time.Minute, func(l rollout.Ledger, d *appsv1.Deployment) bool {
		run := checkRun(d)
		return l.RolledBackRevision == 2 || (run != nil && run.Revision == 2 && run.BakeUntil != "")
	})
	l, _ := rollout.ReadLedger(baking)
	require.Zero(t, l.RolledBackRevision, "rolled back before its rollout completed: %s", describe(ctx, baking))
	require.Equal(t, int64(1), l.Newest().Revision, "a completed revision is not known-good while it bakes")
	final := waitDeployment(t, ns, "web", "revision 2 was not rolled back inside its bake window", 2*time.Minute, func(l rollout.Ledger, _ *appsv1.Deployment) bool {
		return l.RolledBackRevision == 2
	})
	run := checkRun(final)
	require.NotNil(t, run)
	until, ok := run.BakeUntilTime()
	require.True(t, ok, "the rollout completed before it failed: its bake window is set")
	first, err := time.Parse(time.RFC3339, run.FirstFailed)
	require.NoError(t, err, "ledger checks.firstFailed")
	completion := until.Add(-longBake)
	t.Logf("completed %s, first failed measurement %s (%s into the bake window), bake window until %s; evidence: %s",
		completion.Format(time.RFC3339), run.FirstFailed, first.Sub(completion), run.BakeUntil, run.Evidence)
	assert.False(t, first.Before(completion), "the first failed measurement is after the rollout completed")
	assert.True(t, first.Before(until), "the first failed measurement is inside the bake window")
	rb := rolledBack(ctx, t, ns, "web", 2*time.Minute)
	assert.Contains(t, rb, "error-rate failed")
}

// A release that completes and degrades 60s after its pods start, after
// its 30s bake window: known-good by then, no longer measured, never
// rolled back. Watched for as long as two Failed measurements would take
// once Prometheus itself shows the errors.
func degradesAfterTheBakeWindow(ctx context.Context, t *testing.T, prom *harness.Prometheus, ns string) {
	serving(ctx, t, ns, oneAtATime, degradeAfter(time.Minute))
	setImage(ctx, t, ns, "web", "degrades")
	waitDeployment(t, ns, "web", "revision 2 was not recorded known-good after its bake window", 3*time.Minute, func(l rollout.Ledger, d *appsv1.Deployment) bool {
		n := l.Newest()
		return l.RolledBackRevision == 0 && n != nil && n.Revision == 2 && completed(d)
	})
	rate := fmt.Sprintf(`sum(rate(http_requests_total{namespace=%q,code=~"5.."}[30s])) / sum(rate(http_requests_total{namespace=%q}[30s]))`, ns, ns)
	var degraded time.Time
	harness.WaitFor(t, 2*time.Minute, "Prometheus never saw the release degrade", func(ctx context.Context) (bool, string, error) {
		v, err := prom.Scalar(ctx, rate)
		if err != nil {
			return false, err.Error(), nil
		}
		degraded = time.Now()
		return v > 0.05, fmt.Sprintf("error rate %g", v), nil
	})
	watch := checkInterval*(failureLimit+1) + scrapeInterval + 5*time.Second
	t.Logf("Prometheus shows the errors at %s; watched for %s more", degraded.UTC().Format(time.RFC3339), watch)
	notRolledBackUntil(ctx, t, ns, "web", degraded.Add(watch), "after its bake window")
	d, err := get(ctx, ns, "web")
	require.NoError(t, err)
	assert.Equal(t, harness.Registry+"/testapp:degrades", d.Spec.Template.Spec.Containers[0].Image)
	assert.Empty(t, checkRun(d).Failed, "no check failed the revision")
}

// No traffic: the queries read 0/0 (NaN), neither condition holds, so each
// measurement is Inconclusive; past inconclusiveLimit an Event says so,
// nothing is rolled back, and the revision is known-good after its bake.
func noTrafficIsInconclusive(ctx context.Context, t *testing.T, ns string) {
	deployGood(ctx, t, ns, "web", oneAtATime)
	newHealthyRevision(ctx, t, ns, "web")
	note := waitNote(t, ns, vocab.ReasonCheckInconclusive, "Revision 2 ")
	assert.Contains(t, note, fmt.Sprintf("inconclusiveLimit (%d)", checkInconclusiveLimit))
	completesWithoutRollback(ctx, t, ns, "web", "with no traffic")
}

// A check in dry run that reads 30% errors says so in an Event and rolls
// nothing back: the revision is known-good after its bake window.
func dryRunReportsOnly(ctx context.Context, t *testing.T, ns string) {
	serving(ctx, t, ns, oneAtATime)
	setImage(ctx, t, ns, "web", "errors")
	note := waitNote(t, ns, vocab.ReasonCheckFailed, "Revision 2 ")
	assert.Contains(t, note, "Dry run: reported only, nothing is rolled back.")
	completesWithoutRollback(ctx, t, ns, "web", "under a dry run")
	d, err := get(ctx, ns, "web")
	require.NoError(t, err)
	assert.Equal(t, harness.Registry+"/testapp:errors", d.Spec.Template.Spec.Containers[0].Image)
}

// A tenant's DeploymentCheck, written with no namespace, is scoped to its
// own namespace by the guard: another namespace serving 30% errors neither
// fails its revision nor appears in its Events. One that names the other
// namespace is refused when it is written.
func tenantQueryReadsOnlyItsNamespace(ctx context.Context, t *testing.T, cc client.Client, ns, other string) {
	// The other namespace's errors, through its own Service.
	require.NoError(t, cl.Create(ctx, app(other, "web", "errors")))
	sendLoad(t, "http://"+webService(ctx, t, other)+"/")

	m := errorRateMetric()
	m.Query = `sum(rate(http_requests_total{code=~"5.."}[30s])) / sum(rate(http_requests_total[30s]))`
	own := &checks.DeploymentCheck{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "errors"},
		Spec: checks.Spec{BakeWindow: &metav1.Duration{Duration: checkBake}, Metrics: []analysis.Metric{m}}}
	require.NoError(t, cc.Create(ctx, own))
	spy := own.DeepCopy()
	spy.Name = "spy"
	spy.Spec.Metrics[0].Query = fmt.Sprintf(`sum(rate(http_requests_total{namespace=%q,code=~"5.."}[30s]))`, other)
	err := cc.Create(ctx, spy)
	require.Error(t, err, "a DeploymentCheck naming another namespace must be refused")
	t.Logf("refused: %v", err)
	assert.Contains(t, err.Error(), "spec.metrics[0].query")

	serving(ctx, t, ns, oneAtATime)
	newHealthyRevision(ctx, t, ns, "web")
	completesWithoutRollback(ctx, t, ns, "web", "under the tenant's check")
	d, err := get(ctx, ns, "web")
	require.NoError(t, err)
	run := checkRun(d)
	require.NotNil(t, run, "the tenant's check measured revision 2")
	for _, mr := range run.Metrics {
		t.Logf("metric %s: %+v phase %q last %q", mr.Key, mr.Counts, mr.Phase, mr.Value)
		assert.NotEqual(t, analysis.PhaseFailed, mr.Phase)
	}
	var list eventsv1.EventList
	require.NoError(t, cl.List(ctx, &list, client.InNamespace(ns)))
	for _, e := range list.Items {
		assert.NotContains(t, e.Note, other, "an Event of %s names %s", ns, other)
	}
}

// Prometheus stopped right after an update to a release serving 30% 5xx,
// before its first measurement (initialDelay): every measurement is an
// Error, said in an Event with why; past consecutiveErrorLimit the revision
// is said to be unchecked; nothing is rolled back and the rollout
// completes. The guard never guesses from a missing measurement.
func prometheusStoppedDuringARollout(ctx context.Context, t *testing.T, prom *harness.Prometheus, ns string) {
	sendLoad(t, "http://"+webService(ctx, t, ns)+"/")
	setImage(ctx, t, ns, "web", "errors")
	if err := prom.Stop(); err != nil {
		t.Logf("stopping Prometheus: %v", err)
	}
	note := waitNote(t, ns, vocab.ReasonCheckError, "could not measure revision 2")
	assert.Contains(t, note, "connection refused")
	waitNote(t, ns, vocab.ReasonCheckError, "Revision 2 ", "is unchecked by")
	completesWithoutRollback(ctx, t, ns, "web", "while Prometheus was stopped")
}

// checksClient writes the checks' kinds, which the tier's client does not
// know.
func checksClient(t *testing.T) client.Client {
	t.Helper()
	s := runtime.NewScheme()
	require.NoError(t, checks.AddToScheme(s))
	cfg, err := node.RESTConfig()
	require.NoError(t, err)
	c, err := client.New(cfg, client.Options{Scheme: s})
	require.NoError(t, err)
	return c
}

func checkRun(d *appsv1.Deployment) *rollout.CheckRun {
	if d == nil {
		return nil
	}
	l, _ := rollout.ReadLedger(d)
	return l.Checks
}

// traffic is a stream of requests to one URL, 20 a second, each on a new
// connection so that kube-proxy spreads them over the Service's pods.
type traffic struct {
	ok, failed, errs atomic.Int64
}

func (l *traffic) String() string {
	return fmt.Sprintf("%d 2xx, %d 5xx, %d errors", l.ok.Load(), l.failed.Load(), l.errs.Load())
}

func sendLoad(t *testing.T, url string) *traffic {
	l := &traffic{}
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			// Not one after the other: a slow release must not slow the
			// load down.
			wg.Go(func() {
				resp, err := c.Get(url)
				if err != nil {
					l.errs.Add(1)
					return
				}
				resp.Body.Close()
				if resp.StatusCode >= 500 {
					l.failed.Add(1)
				} else {
					l.ok.Add(1)
				}
			})
		}
	})
	t.Cleanup(func() { close(stop); wg.Wait() })
	return l
}

// startPrometheus runs a real Prometheus on NodeIP (pods reach it there, as
// they reach the API server), discovering the pods of namespaces through the
// API server with the tier's admin kubeconfig (harness.PrometheusConfig),
// scraping every scrapeInterval; stopped when the test ends.
func startPrometheus(t *testing.T, namespaces []string) *harness.Prometheus {
	t.Helper()
	p, err := harness.StartPrometheus(context.Background(), harness.PrometheusOptions{
		NodeTools: node.NodeTools, Kubeconfig: node.Kubeconfig, Dir: t.TempDir(), Host: harness.NodeIP,
		Namespaces: namespaces, ScrapeInterval: scrapeInterval,
	})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = p.Stop()
		if t.Failed() {
			t.Logf("--- end of Prometheus's log ---\n%s", harness.TailFile(p.Log, 3000))
		}
	})
	return p
}

// pointGuardAt sets the installed guard's checks.prometheus.url by `helm
// upgrade --reuse-values`, and unsets it when the test ends.
func pointGuardAt(ctx context.Context, t *testing.T, url string) {
	t.Helper()
	set := func(ctx context.Context, url string) result {
		return helm(ctx, "upgrade", release, chartDir(), "-n", harness.GuardNamespace, "--reuse-values",
			"--set", "config.checks.prometheus.url="+url, "--wait", "--timeout", "4m")
	}
	start := time.Now()
	r := set(ctx, url)
	require.Zero(t, r.Code, "helm upgrade: %s", r)
	waitNewLeader(t)
	t.Logf("the guard pointed at %s by helm upgrade, its new replicas leading, in %s", url, time.Since(start).Round(time.Second))
	t.Cleanup(func() {
		r := set(context.Background(), "")
		assert.Zero(t, r.Code, "helm upgrade back to no Prometheus: %s", r)
		waitNewLeader(t)
	})
}

// guardLease is the guard's leader election lock.
var guardLease = client.ObjectKey{Namespace: harness.GuardNamespace, Name: "deployguard.deployguard.io"}

// waitNewLeader waits until the guard's old replicas are gone and one of
// its new ones holds the lease. helm's --wait ends when the new replicas are
// Ready, but the old leader, with the old config, acts until it lets the
// lease go: a first run saw it record two revisions known-good unmeasured
// 10s after helm returned.
func waitNewLeader(t *testing.T) {
	t.Helper()
	harness.WaitFor(t, 2*time.Minute, "the guard's new replicas never took the lead", func(ctx context.Context) (bool, string, error) {
		var pods corev1.PodList
		if err := cl.List(ctx, &pods, client.InNamespace(harness.GuardNamespace), client.MatchingLabels{"app.kubernetes.io/name": "deployguard"}); err != nil {
			return false, err.Error(), nil
		}
		hashes := map[string]bool{}
		var names []string
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil {
				return false, p.Name + " is terminating", nil
			}
			hashes[p.Labels[appsv1.DefaultDeploymentUniqueLabelKey]] = true
			names = append(names, p.Name)
		}
		if len(hashes) != 1 {
			return false, fmt.Sprintf("pods of %d templates: %v", len(hashes), names), nil
		}
		var lease coordinationv1.Lease
		if err := cl.Get(ctx, guardLease, &lease); err != nil {
			return false, err.Error(), nil
		}
		holder := ptr.Deref(lease.Spec.HolderIdentity, "")
		for _, n := range names {
			if strings.HasPrefix(holder, n+"_") {
				return true, "", nil
			}
		}
		return false, fmt.Sprintf("lease held by %q, pods %v", holder, names), nil
	})
}
