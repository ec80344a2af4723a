package install

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/test/harness"
)

// query is what test/tools/promql reports for one rule or panel expression.
type query struct {
	Source    string `json:"source"`
	Expr      string `json:"expr"`
	Selectors []struct {
		Metric string   `json:"metric"`
		Labels []string `json:"labels"`
	} `json:"selectors"`
}

// external are the metrics the alerts read that neither the guard nor
// kube-apiserver exports, with where they come from.
var external = map[string]string{
	"up": "Prometheus's own, per scrape target",
	"kube_deployment_status_replicas_available": "kube-state-metrics",
}

// targetLabels are added by Prometheus (the Prometheus Operator's relabelling
// of a ServiceMonitor's targets), not by the exporter.
var targetLabels = map[string]bool{"job": true, "instance": true, "namespace": true, "pod": true, "service": true, "endpoint": true, "container": true}

// promqlQueries checks config/monitoring's rules and dashboard with
// Prometheus's own rule loader and PromQL parser (test/tools/promql, a module
// of its own) and returns every expression with the metrics it selects.
func promqlQueries(t *testing.T) []query {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "promql")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Dir = filepath.Join(harness.RepoRoot(), "test", "tools", "promql")
	build.Env = append(os.Environ(), "GOWORK=off")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "building test/tools/promql: %s", out)
	mon := filepath.Join(harness.RepoRoot(), "config", "monitoring")
	var stderr bytes.Buffer
	cmd := exec.Command(bin, "-rules", filepath.Join(mon, "prometheusrule.yaml"), "-dashboards", filepath.Join(mon, "dashboard.json"))
	cmd.Stderr = &stderr
	out, err = cmd.Output()
	require.NoError(t, err, "the rules and the dashboard must load in Prometheus:\n%s", stderr.String())
	var qs []query
	require.NoError(t, json.Unmarshal(out, &qs))
	require.NotEmpty(t, qs)
	return qs
}

// Every metric the dashboard and the alerts query, with every label they
// match on, is exported by a guard that has run for real (or by
// kube-apiserver, for the calls it makes to the guard): a renamed metric or
// label fails here, not silently on a platform team's dashboard.
func TestDashboardAndAlertsQueryRealMetrics(t *testing.T) {
	queries := promqlQueries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	exercise(ctx, t)

	var last []string
	var scrapeErr error
	start := time.Now()
	// Everything shows within about 10s (fail-fast's window); the margin is
	// for a loaded machine.
	err := wait.PollUntilContextTimeout(ctx, time.Second, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		fams, err := scrape(ctx)
		if err != nil {
			scrapeErr = err
			return false, nil
		}
		last = missing(queries, fams)
		return len(last) == 0, nil
	})
	require.NoError(t, err, "queried but not exported:\n%s\n(last scrape error: %v)", strings.Join(last, "\n"), scrapeErr)
	t.Logf("%d expressions, every metric found %s after the workload started", len(queries), time.Since(start).Round(time.Second))
}

// exercise makes the guard do what the dashboard shows: admit, patch and
// refuse Deployments, evaluate policies, refuse a policy that does not
// compile, mark a revision known-good, decide on a failing rollout (fail-fast,
// window 10s), and run a cleanup step.
func exercise(ctx context.Context, t *testing.T) {
	t.Helper()
	c := local.Client
	ns := harness.NewNamespace(t, c)

	// A policy that does not compile: deployguard_policy_load_errors_total.
	require.NoError(t, ignoreExists(c.Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "broken-policy", Namespace: harness.GuardNamespace, Labels: map[string]string{vocab.LabelPolicy: "true"}},
		Data:       map[string]string{"broken.rego": "package deployguard.broken\n\ndeny contains msg if {\n"},
	})))

	// Completes (known-good), then fails to pull its new image (fail-fast).
	web := harness.Deployment(ns, "web", "app:1", harness.Replicas(1))
	require.NoError(t, c.Create(ctx, web))
	waitFor(ctx, t, "web's first rollout to complete", func(d *appsv1.Deployment) bool {
		for _, cond := range d.Status.Conditions {
			if cond.Type == appsv1.DeploymentProgressing && cond.Reason == vocab.NewReplicaSetAvailable && d.Status.ObservedGeneration == d.Generation {
				return true
			}
		}
		return false
	}, web)
	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(web), web))
	web.Spec.Template.Spec.Containers[0].Image = "app:no-such-tag"
	require.NoError(t, c.Update(ctx, web))

	// Refused by the native policy, in kube-apiserver: every replica down
	// at once.
	allDown := harness.Deployment(ns, "all-down", "app:1", harness.Replicas(1))
	allDown.Spec.Replicas = ptr(int32(4))
	allDown.Spec.Strategy = appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType,
		RollingUpdate: &appsv1.RollingUpdateDeployment{MaxUnavailable: ptr(intstr.FromString("100%"))}}
	require.Error(t, c.Create(ctx, allDown), "maxUnavailable 100% is refused")

	// Refused by the validating webhook: its pods would be web's too.
	twin := harness.Deployment(ns, "web-twin", "app:1", harness.Replicas(1))
	twin.Spec.Selector = web.Spec.Selector.DeepCopy()
	twin.Spec.Template.Labels = map[string]string{"app.kubernetes.io/name": "web"}
	require.Error(t, c.Create(ctx, twin), "an overlapping selector is refused")

	// Patched by the mutating webhook: the selector repaired.
	noSelector := harness.Deployment(ns, "no-selector", "app:1", harness.Replicas(1))
	noSelector.Spec.Selector = nil
	require.NoError(t, c.Create(ctx, noSelector))

	// A cleanup step: the record of a deleted Deployment.
	recorded := harness.Deployment(ns, "recorded", "app:1", harness.Replicas(1))
	recorded.Annotations = map[string]string{vocab.AnnotationCleanup: "record"}
	require.NoError(t, c.Create(ctx, recorded))
	require.NoError(t, c.Delete(ctx, recorded))
}

func waitFor(ctx context.Context, t *testing.T, what string, cond func(*appsv1.Deployment) bool, d *appsv1.Deployment) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		if err := local.Client.Get(ctx, client.ObjectKeyFromObject(d), d); err != nil {
			return false, nil
		}
		return cond(d), nil
	})
	require.NoError(t, err, "waiting for %s: %+v", what, d.Status)
}

func ignoreExists(err error) error {
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

func ptr[T any](v T) *T { return &v }

// scrape reads the guard's /metrics, as Prometheus does (over TLS, with the
// token of a ServiceAccount bound to deployguard-metrics-reader), and
// kube-apiserver's.
func scrape(ctx context.Context) (map[string]*dto.MetricFamily, error) {
	code, guard, err := local.Guard.Scrape()
	if err != nil {
		return nil, fmt.Errorf("the guard's /metrics: %w", err)
	}
	if code != 200 {
		return nil, fmt.Errorf("the guard's /metrics: HTTP %d", code)
	}
	apiserver, err := local.Cluster.Kubectl(ctx, local.Cluster.Kubeconfig, "get", "--raw", "/metrics")
	if err != nil {
		return nil, err
	}
	fams := map[string]*dto.MetricFamily{}
	for _, text := range []string{guard, apiserver} {
		p := expfmt.NewTextParser(model.UTF8Validation)
		f, err := p.TextToMetricFamilies(strings.NewReader(text))
		if err != nil {
			return nil, err
		}
		for k, v := range f {
			if have, ok := fams[k]; ok {
				have.Metric = append(have.Metric, v.Metric...)
				continue
			}
			fams[k] = v
		}
	}
	return fams, nil
}

// missing lists, for every expression, the selected metrics that no family
// exports and the matched labels no series of it carries. A histogram's
// _bucket, _sum and _count are its family's; le is a bucket's label.
// Metrics in external and the labels Prometheus adds to targets are not
// looked for.
func missing(queries []query, fams map[string]*dto.MetricFamily) []string {
	seen := map[string]bool{}
	for _, q := range queries {
		for _, s := range q.Selectors {
			if _, ok := external[s.Metric]; ok {
				continue
			}
			fam, extra := family(fams, s.Metric)
			if fam == nil {
				seen[fmt.Sprintf("%s: metric %s is not exported", q.Source, s.Metric)] = true
				continue
			}
			have := map[string]bool{}
			for _, l := range extra {
				have[l] = true
			}
			for _, m := range fam.Metric {
				for _, lp := range m.Label {
					have[lp.GetName()] = true
				}
			}
			for _, l := range s.Labels {
				if !have[l] && !targetLabels[l] {
					seen[fmt.Sprintf("%s: metric %s has no label %s", q.Source, s.Metric, l)] = true
				}
			}
		}
	}
	out := make([]string, 0, len(seen))
	for m := range seen {
		out = append(out, m)
	}
	sort.Strings(out)
	return out
}

// family finds the family a selected name belongs to, and the labels the
// exposition adds to that name (le on a bucket).
func family(fams map[string]*dto.MetricFamily, name string) (*dto.MetricFamily, []string) {
	if f, ok := fams[name]; ok {
		return f, nil
	}
	for suffix, extra := range map[string][]string{"_bucket": {"le"}, "_sum": nil, "_count": nil} {
		base, ok := strings.CutSuffix(name, suffix)
		if !ok {
			continue
		}
		f := fams[base]
		if f == nil {
			continue
		}
		switch f.GetType() {
		case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
			return f, extra
		case dto.MetricType_SUMMARY:
			if suffix != "_bucket" {
				return f, nil
			}
		}
	}
	return nil, nil
}

func TestMissing(t *testing.T) {
	label := func(n string) *dto.LabelPair { return &dto.LabelPair{Name: &n, Value: ptr("x")} }
	counter, histogram := dto.MetricType_COUNTER, dto.MetricType_HISTOGRAM
	fams := map[string]*dto.MetricFamily{
		"requests_total":   {Type: &counter, Metric: []*dto.Metric{{Label: []*dto.LabelPair{label("result")}}}},
		"duration_seconds": {Type: &histogram, Metric: []*dto.Metric{{Label: []*dto.LabelPair{label("webhook")}}}},
	}
	sel := func(metric string, labels ...string) query {
		q := query{Source: "s"}
		q.Selectors = append(q.Selectors, struct {
			Metric string   `json:"metric"`
			Labels []string `json:"labels"`
		}{metric, labels})
		return q
	}
	for _, tc := range []struct {
		name  string
		query query
		want  []string
	}{
		{"an exported counter and its label", sel("requests_total", "result"), nil},
		{"a renamed metric", sel("request_total"), []string{"s: metric request_total is not exported"}},
		{"a label it does not carry", sel("requests_total", "reason"), []string{"s: metric requests_total has no label reason"}},
		{"a histogram's buckets, with le", sel("duration_seconds_bucket", "le", "webhook"), nil},
		{"a histogram's count", sel("duration_seconds_count"), nil},
		{"a counter has no buckets", sel("requests_total_bucket"), []string{"s: metric requests_total_bucket is not exported"}},
		{"labels Prometheus adds to targets", sel("requests_total", "job", "pod"), nil},
		{"a metric of kube-state-metrics", sel("kube_deployment_status_replicas_available", "deployment"), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := missing([]query{tc.query}, fams)
			if tc.want == nil {
				assert.Empty(t, got)
				return
			}
			assert.Equal(t, tc.want, got)
		})
	}
}
