package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/test/harness"
	"github.com/deployguard/deployguard/webhook/audit"
	"github.com/deployguard/deployguard/webhook/review"
)

// auditPolicy asks for a team label, in the test's namespace only so that the
// suite's other tests are not judged by it.
func auditPolicy(ns, mode string) string {
	return fmt.Sprintf(`# METADATA
# custom:
#   mode: %s
#   severity: high
#   category: Ownership
package deployguard.auditteam

import rego.v1

deny contains {"msg": "every Deployment needs a team label", "field": "metadata.labels.team"} if {
	input.object.metadata.namespace == %q
	not input.object.metadata.labels.team
}
`, mode, ns)
}

// startAudit runs an audit on its own cache, as the leader's term would.
func startAudit(t *testing.T, format string, log logr.Logger) (*audit.Runner, *prometheus.Registry) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c, err := cache.New(cfg, cache.Options{Scheme: scheme})
	require.NoError(t, err)
	cl, err := client.New(cfg, client.Options{Scheme: scheme, Cache: &client.CacheOptions{Reader: c}})
	require.NoError(t, err)
	// The overlap index on the audit's cache, as serve feeds the webhook's
	// from the cache the leader's terms share.
	overlaps := review.NewOverlapIndex(nil)
	inf, err := c.GetInformer(ctx, &appsv1.Deployment{})
	require.NoError(t, err)
	require.NoError(t, overlaps.Feed(inf))
	reg := prometheus.NewRegistry()
	m, err := audit.NewMetrics(reg)
	require.NoError(t, err)
	r := &audit.Runner{
		Client: cl, Cache: c, Metrics: m, Log: log,
		Evaluator: &audit.Evaluator{Options: guardConfig().WebhookOptions(guardUser), Engine: engine, Overlaps: overlaps, Exceptions: exceptions},
		Status:    &audit.Status{},
		Options: audit.Options{Period: time.Hour, Rate: 1000, Format: format,
			IgnoredNamespaces: []string{"kube-system", harness.GuardNamespace}},
	}
	var wg sync.WaitGroup
	var runErr atomic.Value
	wg.Add(2)
	go func() { defer wg.Done(); _ = c.Start(ctx) }()
	go func() {
		defer wg.Done()
		if err := r.Start(ctx); err != nil {
			runErr.Store(err)
		}
	}()
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		assert.Nil(t, runErr.Load(), "the audit stopped with an error")
	})
	return r, reg
}

// passes counts finished audit passes.
func passes(t *testing.T, reg *prometheus.Registry) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	var n uint64
	for _, mf := range mfs {
		if mf.GetName() == "deployguard_audit_pass_duration_seconds" {
			for _, m := range mf.GetMetric() {
				n += m.GetHistogram().GetSampleCount()
			}
		}
	}
	return n
}

func report(ctx context.Context, ns string) (*unstructured.Unstructured, error) {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("wgpolicyk8s.io/v1alpha2")
	u.SetKind("PolicyReport")
	return u, k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: audit.ReportName}, u)
}

// waitForReport waits until ns's report meets cond and returns it; on time-out
// it fails with msg and the last report read.
func waitForReport(t *testing.T, ns, msg string, cond func(audit.Stored) bool) audit.Stored {
	t.Helper()
	var last atomic.Pointer[audit.Stored]
	if !assert.Eventually(t, func() bool {
		u, err := report(context.Background(), ns)
		if err != nil {
			return false
		}
		st := audit.Parse(u)
		last.Store(&st)
		return cond(st)
	}, 3*waitShort, tick) {
		require.FailNow(t, msg, "last report: %+v", last.Load())
	}
	return *last.Load()
}

// failing lists the names of the Deployments the policy fails in the report.
func failing(s audit.Stored, policy string) []string {
	var names []string
	for _, r := range s.Results {
		if r.Policy == policy && r.Result.Result == audit.ResultFail {
			names = append(names, r.Resource.Name)
		}
	}
	return names
}

// TestAuditReportsExistingDeployments walks the acceptance: Deployments
// that predate a policy are found in the namespace's PolicyReport once the
// policy is hot-loaded in audit mode; a fix, a deletion and a switch to
// enforce each show as they should.
func TestAuditReportsExistingDeployments(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, k8s, kept)
	bad := map[string]*appsv1.Deployment{}
	for _, name := range []string{"bad-0", "bad-1", "bad-2"} {
		d := harness.Deployment(ns, name, appImage)
		require.NoError(t, k8s.Create(ctx, d))
		bad[name] = d
	}
	good := harness.Deployment(ns, "good", appImage, func(d *appsv1.Deployment) { d.Labels = map[string]string{"team": "shop"} })
	require.NoError(t, k8s.Create(ctx, good))

	_, reg := startAudit(t, audit.FormatPolicyReport, logr.Discard())

	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "audit-team-policy", Namespace: harness.GuardNamespace, Labels: map[string]string{vocab.LabelPolicy: "true"}},
		Data:       map[string]string{"team.rego": auditPolicy(ns, "audit")},
	}
	require.NoError(t, k8s.Create(ctx, cm))
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), cm) })

	const policyName = "deployguard.auditteam"
	var st audit.Stored
	waitReport := func(msg string, cond func(audit.Stored) bool) {
		t.Helper()
		st = waitForReport(t, ns, msg, cond)
	}
	waitReport("the three violations never reached the report", func(s audit.Stored) bool {
		return len(failing(s, policyName)) == 3
	})
	assert.ElementsMatch(t, []string{"bad-0", "bad-1", "bad-2"}, failing(st, policyName))
	listedFails := 0
	for _, r := range st.Results {
		if r.Result.Result == audit.ResultFail {
			listedFails++
		}
		if r.Policy != policyName {
			continue
		}
		assert.Equal(t, "high", r.Severity)
		assert.Equal(t, "Ownership", r.Category)
		assert.Equal(t, "metadata.labels.team", r.Field)
		assert.Equal(t, "[policy auditteam] metadata.labels.team: every Deployment needs a team label", r.Message)
		assert.Equal(t, bad[r.Resource.Name].UID, r.Resource.UID, "the result names the Deployment's UID")
		assert.False(t, r.Since.IsZero(), "a result has a timestamp")
	}
	assert.Equal(t, listedFails, st.Summary.Fail, "the summary counts every failure")
	passBefore := st.Summary.Pass
	assert.Positive(t, passBefore, "passes are counted")

	// Fixed: its failure leaves the report and its pass is counted.
	fixed := &appsv1.Deployment{}
	require.NoError(t, k8s.Get(ctx, client.ObjectKeyFromObject(bad["bad-0"]), fixed))
	fixed.Labels = map[string]string{"team": "shop"}
	require.NoError(t, k8s.Update(ctx, fixed))
	waitReport("the fixed Deployment's failure stayed", func(s audit.Stored) bool { return len(failing(s, policyName)) == 2 })
	assert.ElementsMatch(t, []string{"bad-1", "bad-2"}, failing(st, policyName))
	assert.Equal(t, passBefore+1, st.Summary.Pass, "the fixed Deployment's result turned to pass")

	// Deleted: its results go, passes and failures alike.
	require.NoError(t, k8s.Delete(ctx, bad["bad-1"]))
	waitReport("the deleted Deployment's result stayed", func(s audit.Stored) bool { return len(failing(s, policyName)) == 1 })
	assert.Equal(t, []string{"bad-2"}, failing(st, policyName))
	for _, r := range st.Results {
		assert.NotEqual(t, "bad-1", r.Resource.Name, "no result of the deleted Deployment is left")
	}

	// Enforce: updates are refused, the report does not change.
	u, err := report(ctx, ns)
	require.NoError(t, err)
	rv := u.GetResourceVersion()
	before := passes(t, reg)
	require.NoError(t, k8s.Get(ctx, client.ObjectKeyFromObject(cm), cm))
	cm.Data["team.rego"] = auditPolicy(ns, "enforce")
	require.NoError(t, k8s.Update(ctx, cm))
	var refusal string
	require.Eventually(t, func() bool {
		d := &appsv1.Deployment{}
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(bad["bad-2"]), d); err != nil {
			return false
		}
		d.Spec.Replicas = ptr(int32(3))
		err := k8s.Update(ctx, d, client.DryRunAll)
		if err == nil {
			return false
		}
		refusal = err.Error()
		return strings.Contains(refusal, "[policy auditteam]")
	}, waitShort, tick, "the enforced policy never refused an update")
	require.Eventually(t, func() bool { return passes(t, reg) > before }, waitShort, tick, "no audit pass after the policy changed")
	u, err = report(ctx, ns)
	require.NoError(t, err)
	assert.Equal(t, rv, u.GetResourceVersion(), "switching the mode rewrote the report")

	// What the guard writes passes the CRD's validation, unknown fields refused.
	again := u.DeepCopy()
	again.SetName("validation-probe")
	again.SetResourceVersion("")
	require.NoError(t, k8s.Create(ctx, again, client.DryRunAll, client.FieldValidation("Strict")))
}

// TestAuditWithoutReportCRD: with no CRD for the configured report kind the
// audit says so once, keeps running, and admission is untouched.
func TestAuditWithoutReportCRD(t *testing.T) {
	ctx := context.Background()
	var said atomic.Int32
	log := funcr.New(func(prefix, args string) {
		if strings.Contains(args, "NoReportCRD") {
			said.Add(1)
		}
	}, funcr.Options{})
	r, reg := startAudit(t, audit.FormatOpenReports, log)
	require.Eventually(t, r.ReportsDisabled, waitShort, tick, "the missing CRD was not noticed")
	assert.Contains(t, r.Status.Note(), "the Report CRD (openreports.io/v1alpha1) is not installed", "/readyz?verbose says why no report is written")

	ns := harness.NewNamespace(t, k8s, kept)
	before := passes(t, reg)
	for i := range 3 {
		require.NoError(t, k8s.Create(ctx, harness.Deployment(ns, fmt.Sprintf("app-%d", i), appImage)), "admission works without the report CRD")
	}
	require.Eventually(t, func() bool { return passes(t, reg) > before }, waitShort, tick, "the audit stopped passing")
	assert.Equal(t, int32(1), said.Load(), "the missing CRD is logged once")
}

// ownerPolicy asks for an owner annotation, in ns only.
func ownerPolicy(ns, msg string) string {
	return fmt.Sprintf(`# METADATA
# custom:
#   mode: audit
package deployguard.auditowner

import rego.v1

deny contains {"msg": %q, "field": "metadata.annotations.owner"} if {
	input.object.metadata.namespace == %q
	not input.object.metadata.annotations.owner
}
`, msg, ns)
}

// evaluations counts the engine's evaluations of each policy.
func evaluations(t *testing.T, reg *prometheus.Registry) map[string]uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]uint64{}
	for _, mf := range mfs {
		if mf.GetName() != "deployguard_policy_evaluation_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "policy" {
					out[l.GetValue()] = m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return out
}

// TestAuditRefreshesOnlyChangedPolicies: when a new policy set changes one
// policy, the audit evaluates that policy again on every Deployment and leaves
// the results of the others as they were, unevaluated; a removed policy's
// results leave the report.
func TestAuditRefreshesOnlyChangedPolicies(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, k8s, kept)
	const n = 12
	for i := range n {
		require.NoError(t, k8s.Create(ctx, harness.Deployment(ns, fmt.Sprintf("app-%d", i), appImage)))
	}
	engineReg := prometheus.NewRegistry()
	for _, c := range engine.Collectors() {
		require.NoError(t, engineReg.Register(c))
	}
	_, reg := startAudit(t, audit.FormatPolicyReport, logr.Discard())

	policies := func(data map[string]string) *corev1.ConfigMap {
		return &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: "audit-refresh-policies", Namespace: harness.GuardNamespace, Labels: map[string]string{vocab.LabelPolicy: "true"}},
			Data:       data,
		}
	}
	cm := policies(map[string]string{"team.rego": auditPolicy(ns, "audit"), "owner.rego": ownerPolicy(ns, "name an owner")})
	require.NoError(t, k8s.Create(ctx, cm))
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), cm) })

	var st audit.Stored
	waitReport := func(msg string, cond func(audit.Stored) bool) {
		t.Helper()
		st = waitForReport(t, ns, msg, cond)
	}
	messages := func(s audit.Stored, policy string) map[string]string {
		out := map[string]string{}
		for _, r := range s.Results {
			if r.Policy == policy && r.Result.Result == audit.ResultFail {
				out[r.Resource.Name] = r.Message
			}
		}
		return out
	}
	waitReport("both policies' violations never reached the report", func(s audit.Stored) bool {
		return len(failing(s, "deployguard.auditteam")) == n && len(failing(s, "deployguard.auditowner")) == n
	})
	teamSince := map[string]time.Time{}
	for _, r := range st.Results {
		if r.Policy == "deployguard.auditteam" {
			teamSince[r.Resource.Name] = r.Since
		}
	}

	// Only the owner policy changes: it alone is evaluated again, on every
	// audited Deployment, and its new message replaces the old.
	var all appsv1.DeploymentList
	require.NoError(t, k8s.List(ctx, &all))
	before := evaluations(t, engineReg)
	require.NoError(t, k8s.Get(ctx, client.ObjectKeyFromObject(cm), cm))
	cm.Data["owner.rego"] = ownerPolicy(ns, "name an owner in metadata.annotations.owner")
	require.NoError(t, k8s.Update(ctx, cm))
	waitReport("the changed policy's new message never reached the report", func(s audit.Stored) bool {
		for _, m := range messages(s, "deployguard.auditowner") {
			if !strings.Contains(m, "in metadata.annotations.owner") {
				return false
			}
		}
		return len(messages(s, "deployguard.auditowner")) == n
	})
	after := evaluations(t, engineReg)
	ownerRuns, teamRuns := after["auditowner"]-before["auditowner"], after["auditteam"]-before["auditteam"]
	t.Logf("after the owner policy changed: owner evaluated %d times, team %d times, %d Deployments in the cluster", ownerRuns, teamRuns, len(all.Items))
	assert.GreaterOrEqual(t, ownerRuns, uint64(n), "the changed policy was not evaluated again on every Deployment")
	// Admissions elsewhere in the suite may evaluate the team policy a few
	// times; a refresh of it would be once per audited Deployment.
	assert.Less(t, teamRuns, uint64(n), "the unchanged policy was evaluated again on every Deployment")
	assert.Len(t, failing(st, "deployguard.auditteam"), n, "the unchanged policy's results stand")
	for _, r := range st.Results {
		if r.Policy == "deployguard.auditteam" {
			assert.Equal(t, teamSince[r.Resource.Name], r.Since, "an unchanged result keeps the time it was first seen")
		}
	}

	// The owner policy is removed: its results leave the report, the team
	// policy's stay.
	require.NoError(t, k8s.Get(ctx, client.ObjectKeyFromObject(cm), cm))
	delete(cm.Data, "owner.rego")
	require.NoError(t, k8s.Update(ctx, cm))
	waitReport("the removed policy's results stayed", func(s audit.Stored) bool {
		for _, r := range s.Results {
			if r.Policy == "deployguard.auditowner" {
				return false
			}
		}
		return true
	})
	assert.Len(t, failing(st, "deployguard.auditteam"), n, "the remaining policy's results stand")
	assert.Positive(t, passes(t, reg))
}

// overlapWarnings lists, by Deployment, the overlap warnings in the report.
func overlapWarnings(s audit.Stored) map[string][]string {
	out := map[string][]string{}
	for _, r := range s.Results {
		if r.Policy == audit.PolicySpec && r.Rule == audit.RuleOverlap {
			out[r.Resource.Name] = append(out[r.Resource.Name], r.Result.Result+": "+r.Message)
		}
	}
	return out
}

// TestAuditReportsOverlappingSelectors: two stored Deployments whose
// selectors select each other's pods both warn in the namespace's report,
// each naming the other, and each side's result follows a change of the
// other within seconds: a template label change, a deletion.
func TestAuditReportsOverlappingSelectors(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, k8s, kept)
	// api's selector (tier=backend) selects shop's pods; shop's (app=shop)
	// does not select api's.
	shop := harness.Deployment(ns, "shop", appImage, func(d *appsv1.Deployment) {
		d.Spec.Selector.MatchLabels = map[string]string{"app": "shop"}
		d.Spec.Template.Labels = map[string]string{"app": "shop", "tier": "backend"}
	})
	require.NoError(t, k8s.Create(ctx, shop))
	_, reg := startAudit(t, audit.FormatPolicyReport, logr.Discard())
	require.Eventually(t, func() bool { return passes(t, reg) > 0 }, waitShort, tick, "no audit pass")

	// The webhook refuses an overlap on CREATE, but not to the guard itself
	// (its rollbacks must go through): how an overlap comes to be stored,
	// like one that predates the guard.
	asGuard, _ := clientAs(t, guardUser)
	api := harness.Deployment(ns, "api", appImage, func(d *appsv1.Deployment) {
		d.Spec.Selector.MatchLabels = map[string]string{"tier": "backend"}
		d.Spec.Template.Labels = map[string]string{"app": "api", "tier": "backend"}
	})
	require.NoError(t, asGuard.Create(ctx, api))

	var st audit.Stored
	waitOverlaps := func(msg string, want map[string][]string) {
		t.Helper()
		// Well within the hour of the audit's period: the change of one
		// side refreshes the other.
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			u, err := report(ctx, ns)
			require.NoError(c, err)
			st = audit.Parse(u)
			assert.Equal(c, want, overlapWarnings(st), "overlap results by Deployment")
		}, waitShort, tick, msg)
	}
	const fix = "add a label that tells the two apart, such as app.kubernetes.io/instance, to the template and the selector"
	both := map[string][]string{
		"api":  {`warn: spec.selector: this Deployment's pods overlap with another Deployment's; this selector also selects the pods of Deployment "shop" (labels app=shop,tier=backend): ` + fix},
		"shop": {`warn: spec.selector: this Deployment's pods overlap with another Deployment's; these pods would be selected by Deployment "api" (selector tier=backend) too: ` + fix},
	}
	waitOverlaps("the overlap was not reported on both sides", both)
	for _, r := range st.Results {
		if r.Rule == audit.RuleOverlap {
			assert.Equal(t, "spec.selector", r.Field)
		}
	}

	// shop's pods leave api's selector: both pass, api's result turned by
	// shop's change alone.
	require.NoError(t, k8s.Get(ctx, client.ObjectKeyFromObject(shop), shop))
	shop.Spec.Template.Labels["tier"] = "frontend"
	require.NoError(t, k8s.Update(ctx, shop))
	waitOverlaps("the overlap outlived shop's new labels", map[string][]string{})

	// And back (as the guard: admission refuses a new overlap on UPDATE).
	require.NoError(t, asGuard.Get(ctx, client.ObjectKeyFromObject(shop), shop))
	shop.Spec.Template.Labels["tier"] = "backend"
	require.NoError(t, asGuard.Update(ctx, shop))
	waitOverlaps("the overlap shop's labels made again was not reported on both sides", both)

	// api deleted: shop's result turns to pass.
	require.NoError(t, k8s.Delete(ctx, api))
	waitOverlaps("shop still overlaps the deleted api", map[string][]string{})
	for _, r := range st.Results {
		assert.NotEqual(t, "api", r.Resource.Name, "no result of the deleted Deployment is left")
	}
	assert.Positive(t, st.Summary.Pass)
}
