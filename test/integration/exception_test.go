package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/test/harness"
	"github.com/deployguard/deployguard/webhook/audit"
	"github.com/deployguard/deployguard/webhook/exception"
)

// exceptTeamPolicy refuses, in the namespaces ns only, a Deployment without
// a team label.
func exceptTeamPolicy(ns ...string) string {
	quoted := make([]string, len(ns))
	for i, n := range ns {
		quoted[i] = fmt.Sprintf("%q", n)
	}
	return fmt.Sprintf(`# METADATA
# custom:
#   mode: enforce
package deployguard.exceptteam

import rego.v1

deny contains {"msg": "every Deployment needs a team label", "field": "metadata.labels.team"} if {
	input.object.metadata.namespace in {%s}
	not input.object.metadata.labels.team
}
`, strings.Join(quoted, ", "))
}

// loadExceptTeam hot-loads exceptTeamPolicy for the namespaces ns, writes it
// to a directory for check too, and returns that directory.
func loadExceptTeam(t *testing.T, ns ...string) string {
	t.Helper()
	ctx := context.Background()
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "except-team-" + ns[0], Namespace: harness.GuardNamespace, Labels: map[string]string{vocab.LabelPolicy: "true"}},
		Data:       map[string]string{"exceptteam.rego": exceptTeamPolicy(ns...)},
	}
	require.NoError(t, k8s.Create(ctx, cm))
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), cm) })
	// From this ConfigMap: the one an earlier test loaded under the same
	// name may still be in the set until its deletion has been seen, and
	// then, for a moment, neither is.
	source := "configmap/" + cm.Namespace + "/" + cm.Name + "/"
	require.Eventually(t, func() bool {
		for _, p := range engine.Policies() {
			if p.Name == "exceptteam" && strings.HasPrefix(p.Source, source) {
				return true
			}
		}
		return false
	}, waitShort, tick, "the policy is loaded")
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "exceptteam.rego"), []byte(exceptTeamPolicy(ns...)), 0o600))
	return dir
}

func newException(name string, match exception.Match, expires time.Time, policies ...string) *exception.PolicyException {
	return &exception.PolicyException{
		TypeMeta:   metav1.TypeMeta{APIVersion: exception.GroupVersion.String(), Kind: exception.Kind},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: harness.GuardNamespace},
		Spec: exception.Spec{Match: match, Policies: policies, ExpiresAt: metav1.NewTime(expires),
			Owner: "team-shop", Reason: "SHOP-123: resources are set in the next release"},
	}
}

// writeYAML writes objs as one multi-document file and returns its path.
func writeYAML(t *testing.T, dir, name string, objs ...any) string {
	t.Helper()
	var b []byte
	for _, o := range objs {
		if d, ok := o.(*appsv1.Deployment); ok {
			d = d.DeepCopy()
			d.APIVersion, d.Kind = "apps/v1", "Deployment"
			o = d
		}
		y, err := yaml.Marshal(o)
		require.NoError(t, err)
		b = append(append(b, "---\n"...), y...)
	}
	p := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(p, b, 0o600))
	return p
}

// runCheck runs `deployguard check` and returns its exit code and output.
func runCheck(t *testing.T, args ...string) (int, string) {
	t.Helper()
	bin, err := harness.GuardBinary()
	require.NoError(t, err)
	out, err := exec.Command(bin, append([]string{"check"}, args...)...).CombinedOutput()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode(), string(out)
	}
	require.NoError(t, err, "%s", out)
	return 0, string(out)
}

// The acceptance of exceptions: an enforced policy refuses a Deployment; an
// exception for that one Deployment lets it through with a warning naming
// the exception, the PolicyReport shows skip and check exits 0; at its
// expiry admission refuses again, the report shows fail and check exits 1,
// all three within 5 s of expiresAt.
func TestExceptionLetsThroughUntilItExpires(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, k8s, kept)
	policyDir := loadExceptTeam(t, ns)
	_, _ = startAudit(t, audit.FormatPolicyReport, logr.Discard())
	c, warnings := clientAs(t, "")

	web := harness.Deployment(ns, "web", appImage)
	require.Eventually(t, func() bool {
		err := c.Create(ctx, web.DeepCopy(), client.DryRunAll)
		return err != nil && strings.Contains(err.Error(), "[policy exceptteam]")
	}, waitShort, tick, "the enforced policy refuses the Deployment")

	expires := time.Now().Add(20 * time.Second).Truncate(time.Second)
	ex := newException("web-team-label", exception.Match{Namespace: ns, Names: []string{"web"}}, expires, "exceptteam")
	require.NoError(t, k8s.Create(ctx, ex.DeepCopy()))
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), ex) })
	created := time.Now()

	// Admission: let through, with a warning that names the exception.
	require.Eventually(t, func() bool {
		return c.Create(ctx, web.DeepCopy()) == nil
	}, waitShort, tick, "the exception lets the Deployment through")
	t.Logf("the exception took effect at admission %v after its creation", time.Since(created).Round(time.Millisecond))
	named := "PolicyException " + harness.GuardNamespace + "/web-team-label until " + expires.UTC().Format(time.RFC3339)
	assert.True(t, containsLine(warnings.all(), named), "a warning names the exception and its expiry: %q", warnings.all())

	// The audit: skip, naming the exception.
	st := waitForReport(t, ns, "the report never showed the exception", func(s audit.Stored) bool {
		return resultOf(s, "web", "deployguard.exceptteam") == audit.ResultSkip
	})
	for _, r := range st.Results {
		if r.Resource.Name == "web" && r.Policy == "deployguard.exceptteam" {
			assert.Contains(t, r.Message, named)
		}
	}

	// deployguard audit lists the exception and the Deployment it covers.
	bin, err := harness.GuardBinary()
	require.NoError(t, err)
	listed, err := exec.Command(bin, "audit", "--kubeconfig", adminKubeconfig(t), "-n", ns,
		"--exceptions-namespace", harness.GuardNamespace).CombinedOutput()
	require.NoError(t, err, "%s", listed)
	for _, want := range []string{"PolicyExceptions: 0 active, 1 expiring, 0 expired", // 20 s left: inside the 7-day warning

		harness.GuardNamespace + "/web-team-label: until " + expires.UTC().Format(time.RFC3339), "expiring soon", "owner team-shop", "SHOP-123",
		"exempts policy exceptteam for Deployments web in " + ns, "covers 1: " + ns + "/web"} {
		assert.Contains(t, string(listed), want)
	}

	// check, with the same exception, agrees.
	dir := t.TempDir()
	manifest := writeYAML(t, dir, "web.yaml", web)
	exDir := filepath.Join(dir, "exceptions")
	require.NoError(t, os.Mkdir(exDir, 0o700))
	writeYAML(t, exDir, "web.yaml", ex)
	configFile := writeConfig(t, dir)
	args := []string{"--config", configFile, "--policy-dir", policyDir, "--exceptions", exDir, "-f", manifest}
	code, out := runCheck(t, args...)
	require.Equal(t, 0, code, "check with the exception admits: %s", out)
	assert.Contains(t, out, named)
	require.True(t, time.Now().Before(expires), "the test reached expiry before its checks: make the expiry longer")

	// At expiry, all three within 5 s.
	deadline := expires.Add(5 * time.Second)
	changed := &appsv1.Deployment{}
	require.NoError(t, k8s.Get(ctx, client.ObjectKeyFromObject(web), changed))
	changed.Spec.Template.Annotations = map[string]string{"release": "2"}
	waitUntil(t, deadline, "admission refuses again after expiresAt", func() bool {
		err := c.Update(ctx, changed.DeepCopy(), client.DryRunAll)
		if err == nil {
			return false
		}
		assert.False(t, time.Now().Before(expires), "refused before expiresAt: %v", err)
		return strings.Contains(err.Error(), "[policy exceptteam]")
	})
	waitUntil(t, deadline, "the report shows fail after expiresAt", func() bool {
		u, err := report(ctx, ns)
		return err == nil && resultOf(audit.Parse(u), "web", "deployguard.exceptteam") == audit.ResultFail
	})
	code, out = runCheck(t, args...)
	assert.Equal(t, 1, code, "check with the expired exception refuses: %s", out)
	assert.True(t, time.Now().Before(deadline), "check agreed within 5 s of expiresAt")
}

func containsLine(lines []string, s string) bool {
	for _, l := range lines {
		if strings.Contains(l, s) {
			return true
		}
	}
	return false
}

// resultOf is the listed result of policy for the Deployment name in s, ""
// if none is listed (a pass is only counted).
func resultOf(s audit.Stored, name, policy string) string {
	for _, r := range s.Results {
		if r.Resource.Name == name && r.Policy == policy {
			return r.Result.Result
		}
	}
	return ""
}

// waitUntil polls cond until it holds, failing the test at deadline.
func waitUntil(t *testing.T, deadline time.Time, msg string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	err := wait.PollUntilContextCancel(ctx, tick, true, func(context.Context) (bool, error) { return cond(), nil })
	require.NoError(t, err, msg)
}

func writeConfig(t *testing.T, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "config.yaml")
	require.NoError(t, os.WriteFile(p, []byte(guardConfigYAML), 0o600))
	return p
}

// The same decision in admission, check (with the exceptions from files and
// read from the cluster) and the audit, on a table of scopes and of rules: an
// enforced policy (covered: admitted with a warning, else refused) and a spec
// check that warns (covered: the warning names the exception and the audit
// says skip, else it warns).
func TestExceptionScopesAgree(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, k8s, kept)
	other := harness.NewNamespace(t, k8s, kept)
	policyDir := loadExceptTeam(t, ns, other)
	soon := time.Now().Add(3 * time.Second).Truncate(time.Second).Add(time.Second)
	later := time.Now().Add(time.Hour)
	// longHistory passes the policy (it has a team) and keeps more revisions
	// than bounds.revisionHistoryLimit allows: the revision-history check warns.
	longHistory := func(d *appsv1.Deployment) {
		d.Labels = map[string]string{"team": "shop"}
		d.Spec.RevisionHistoryLimit = ptr(int32(500))
	}
	checks := func(ex *exception.PolicyException, rules ...string) *exception.PolicyException {
		ex.Spec.Policies, ex.Spec.Checks = nil, rules
		return ex
	}
	cases := []struct {
		scope   string
		d       *appsv1.Deployment
		ex      *exception.PolicyException
		check   string // the spec check the row is about; "" for the policy
		covered bool
	}{
		{scope: "by name", d: harness.Deployment(ns, "by-name", appImage), ex: newException("by-name", exception.Match{Namespace: ns, Names: []string{"by-name"}}, later, "exceptteam"), covered: true},
		{scope: "by selector", d: harness.Deployment(ns, "by-selector", appImage, func(d *appsv1.Deployment) { d.Labels = map[string]string{"tier": "legacy"} }),
			ex: newException("by-selector", exception.Match{Namespace: ns, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "legacy"}}}, later, "exceptteam"), covered: true},
		{scope: "by namespace", d: harness.Deployment(other, "by-namespace", appImage), ex: newException("by-namespace", exception.Match{Namespace: other}, later, "exceptteam"), covered: true},
		{scope: "in the wrong namespace", d: harness.Deployment(ns, "wrong-namespace", appImage), ex: newException("wrong-namespace", exception.Match{Namespace: "elsewhere", Names: []string{"wrong-namespace"}}, later, "exceptteam")},
		{scope: "another rule", d: harness.Deployment(ns, "other-rule", appImage), ex: newException("other-rule", exception.Match{Namespace: ns, Names: []string{"other-rule"}}, later, "images")},
		{scope: "expired", d: harness.Deployment(ns, "expired", appImage), ex: newException("expired", exception.Match{Namespace: ns, Names: []string{"expired"}}, soon, "exceptteam")},
		{scope: "expiring in the future", d: harness.Deployment(ns, "future", appImage), ex: newException("future", exception.Match{Namespace: ns, Names: []string{"future"}}, later, "exceptteam"), covered: true},
		{scope: "a spec check by rule", d: harness.Deployment(ns, "history", appImage, longHistory), check: "revision-history", covered: true,
			ex: checks(newException("history", exception.Match{Namespace: ns, Names: []string{"history"}}, later), "revision-history")},
		{scope: "another spec check", d: harness.Deployment(ns, "deadline", appImage, longHistory), check: "revision-history",
			ex: checks(newException("deadline", exception.Match{Namespace: ns, Names: []string{"deadline"}}, later), "progress-deadline")},
		{scope: "a spec check, expired", d: harness.Deployment(ns, "history-expired", appImage, longHistory), check: "revision-history",
			ex: checks(newException("history-expired", exception.Match{Namespace: ns, Names: []string{"history-expired"}}, soon), "revision-history")},
	}
	dir := t.TempDir()
	exDir := filepath.Join(dir, "exceptions")
	require.NoError(t, os.Mkdir(exDir, 0o700))
	var manifests []any
	for _, tc := range cases {
		require.NoError(t, k8s.Create(ctx, tc.ex.DeepCopy()), tc.scope)
		t.Cleanup(func() { _ = k8s.Delete(context.Background(), tc.ex) })
		writeYAML(t, exDir, tc.ex.Name+".yaml", tc.ex)
		manifests = append(manifests, tc.d)
	}
	waitUntil(t, soon.Add(waitShort), "the short exceptions expire", func() bool { return time.Now().After(soon) })
	common := []string{"-o", "json", "--config", writeConfig(t, dir), "--policy-dir", policyDir, "-f", writeYAML(t, dir, "all.yaml", manifests...)}
	code, fromFiles := runCheck(t, append(common, "--exceptions", exDir)...)
	require.Equal(t, 1, code, "some are refused: %s", fromFiles)
	code, fromCluster := runCheck(t, append(common, "--cluster-exceptions", "--kubeconfig", adminKubeconfig(t))...)
	require.Equal(t, 1, code, "some are refused: %s", fromCluster)
	ev := &audit.Evaluator{Options: guardConfig().WebhookOptions(guardUser), Engine: engine, Exceptions: exceptions}
	for _, tc := range cases {
		t.Run(tc.scope, func(t *testing.T) {
			c, warnings := clientAs(t, "")
			excepted := "excepted by PolicyException " + harness.GuardNamespace + "/" + tc.ex.Name
			// Through the API server: as soon as the watch has delivered the
			// exception, the decision is final.
			require.Eventually(t, func() bool {
				warnings.reset()
				err := c.Create(ctx, tc.d.DeepCopy(), client.DryRunAll)
				if tc.check == "" {
					return (err == nil) == tc.covered
				}
				return err == nil && containsLine(warnings.all(), excepted) == tc.covered
			}, waitShort, tick, "admission")
			for name, out := range map[string]string{"check --exceptions": fromFiles, "check --cluster-exceptions": fromCluster} {
				r := checkResultOf(t, out, tc.d.Name)
				if tc.check == "" {
					assert.Equal(t, tc.covered, r.Verdict == "admitted", name)
				} else {
					assert.Equal(t, "admitted", r.Verdict, name)
					assert.Equal(t, tc.covered, containsLine(r.Warnings, excepted), "%s: %q", name, r.Warnings)
				}
			}
			policy, rule := "deployguard.exceptteam", ""
			want := audit.ResultFail
			if tc.check != "" {
				policy, rule, want = audit.PolicySpec, tc.check, audit.ResultWarn
			}
			if tc.covered {
				want = audit.ResultSkip
			}
			got := ""
			for _, r := range ev.Evaluate(ctx, tc.d.DeepCopy()) {
				if r.Policy == policy && (rule == "" || r.Rule == rule) {
					got = r.Result
				}
			}
			assert.Equal(t, want, got, "audit")
		})
	}
}

// checkResultOf reads check -o json's result for the Deployment name.
func checkResultOf(t *testing.T, out, name string) (r struct {
	Name, Verdict string
	Warnings      []string
}) {
	t.Helper()
	var results []struct {
		Name, Verdict string
		Warnings      []string
	}
	require.NoError(t, yaml.Unmarshal([]byte(out), &results))
	for _, r := range results {
		if r.Name == name {
			return r
		}
	}
	require.FailNow(t, "check said nothing of "+name)
	return r
}

// Who may grant an exception is RBAC on the CRD: a service account without
// the platform role cannot create one; bound to it, it can.
func TestOnlyThePlatformRoleGrantsExceptions(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, k8s, kept)
	role, err := os.ReadFile(filepath.Join(harness.RepoRoot(), "config", "rbac", "exceptions_role.yaml"))
	require.NoError(t, err)
	for _, doc := range strings.Split(string(role), "\n---\n") {
		cr := &rbacv1.ClusterRole{}
		require.NoError(t, yaml.Unmarshal([]byte(doc), cr))
		if err := k8s.Create(ctx, cr); err != nil && !apierrors.IsAlreadyExists(err) {
			require.NoError(t, err)
		}
	}
	sa := "system:serviceaccount:" + ns + ":deployer"
	app, _ := clientAsGroups(t, sa, "system:serviceaccounts", "system:serviceaccounts:"+ns)
	ex := newException("granted-by-"+ns, exception.Match{Namespace: ns, Names: []string{"web"}}, time.Now().Add(time.Hour), "images")
	err = app.Create(ctx, ex.DeepCopy())
	require.True(t, apierrors.IsForbidden(err), "an application's service account cannot grant an exception: %v", err)

	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "platform-exceptions-" + ns, Namespace: harness.GuardNamespace},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "deployguard-exceptions-admin"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "deployer", Namespace: ns}},
	}
	require.NoError(t, k8s.Create(ctx, binding))
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), binding) })
	require.Eventually(t, func() bool { return app.Create(ctx, ex.DeepCopy()) == nil }, waitShort, tick, "the platform role grants it")
	_ = k8s.Delete(ctx, ex)
}

// A malformed exception is refused with what to change.
func TestExceptionRefusals(t *testing.T) {
	ctx := context.Background()
	in := time.Now().Add(time.Hour)
	for _, tc := range []struct {
		name string
		mut  func(*exception.PolicyException)
		want string
	}{
		{"no expiry", func(e *exception.PolicyException) { e.Spec.ExpiresAt = metav1.Time{} }, "expiresAt"},
		{"too far ahead", func(e *exception.PolicyException) {
			e.Spec.ExpiresAt = metav1.NewTime(time.Now().Add(200 * 24 * time.Hour))
		}, "exceptions.maxDuration"},
		{"an unknown policy", func(e *exception.PolicyException) { e.Spec.Policies = []string{"no-such-policy"} }, `"no-such-policy"`},
		{"an invariant", func(e *exception.PolicyException) { e.Spec.Policies, e.Spec.Checks = nil, []string{"strategy"} }, "invariant"},
		{"an empty scope", func(e *exception.PolicyException) { e.Spec.Match = exception.Match{} }, "spec.match.namespace"},
		{"an empty selector", func(e *exception.PolicyException) {
			e.Spec.Match.Names, e.Spec.Match.Selector = nil, &metav1.LabelSelector{}
		}, "empty selector"},
		{"outside the exceptions namespace", func(e *exception.PolicyException) { e.Namespace = "default" }, "honoured only in namespace " + harness.GuardNamespace},
		{"no owner", func(e *exception.PolicyException) { e.Spec.Owner = "" }, "owner"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ex := newException("refused", exception.Match{Namespace: "shop", Names: []string{"web"}}, in, "images")
			tc.mut(ex)
			err := k8s.Create(ctx, ex, client.DryRunAll)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}
