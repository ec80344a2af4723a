package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The rollback alert fires on two scrapes of a guard whose rollback counter
// went up, and not when it stayed.
func TestFireAutoRollback(t *testing.T) {
	rules := filepath.Join("..", "..", "..", "config", "monitoring", "prometheusrule.yaml")
	scrape := func(n int) string {
		p := filepath.Join(t.TempDir(), "metrics")
		text := "# HELP deployguard_rollbacks_total Decisions.\n# TYPE deployguard_rollbacks_total counter\n" +
			"deployguard_rollbacks_total{result=\"rolled_back\"} " + string(rune('0'+n)) + "\n" +
			"deployguard_rollbacks_total{result=\"failed\"} 0\n" +
			"# HELP deployguard_rollback_reaction_seconds R.\n# TYPE deployguard_rollback_reaction_seconds histogram\n" +
			"deployguard_rollback_reaction_seconds_bucket{le=\"1\"} 0\ndeployguard_rollback_reaction_seconds_bucket{le=\"+Inf\"} 0\n" +
			"deployguard_rollback_reaction_seconds_sum 0\ndeployguard_rollback_reaction_seconds_count 0\n"
		require.NoError(t, os.WriteFile(p, []byte(text), 0o644))
		return p
	}
	f, err := fire([]string{rules}, "DeployGuardAutoRollback", []string{scrape(0), scrape(1)}, 30*time.Second)
	require.NoError(t, err)
	assert.Equal(t, "firing", f.State)
	assert.Contains(t, f.Annotations["summary"], "rolled back a failing rollout")

	f, err = fire([]string{rules}, "DeployGuardAutoRollback", []string{scrape(1), scrape(1)}, 30*time.Second)
	require.NoError(t, err)
	assert.Equal(t, "inactive", f.State)
}

// The exception alert fires while an exception is inside its warning window,
// and not when all are active or only expired ones remain.
func TestFireExceptionExpiringSoon(t *testing.T) {
	rules := filepath.Join("..", "..", "..", "config", "monitoring", "prometheusrule.yaml")
	scrape := func(active, expiring, expired int) string {
		p := filepath.Join(t.TempDir(), "metrics")
		text := "# HELP deployguard_policy_exceptions By state.\n# TYPE deployguard_policy_exceptions gauge\n" +
			fmt.Sprintf("deployguard_policy_exceptions{state=\"active\"} %d\n", active) +
			fmt.Sprintf("deployguard_policy_exceptions{state=\"expiring\"} %d\n", expiring) +
			fmt.Sprintf("deployguard_policy_exceptions{state=\"expired\"} %d\n", expired)
		require.NoError(t, os.WriteFile(p, []byte(text), 0o644))
		return p
	}
	f, err := fire([]string{rules}, "DeployGuardExceptionExpiringSoon", []string{scrape(3, 0, 0), scrape(2, 1, 0)}, 30*time.Second)
	require.NoError(t, err)
	assert.Equal(t, "firing", f.State)
	assert.Contains(t, f.Annotations["summary"], "1 PolicyException(s) expire soon")

	f, err = fire([]string{rules}, "DeployGuardExceptionExpiringSoon", []string{scrape(3, 0, 1), scrape(3, 0, 1)}, 30*time.Second)
	require.NoError(t, err)
	assert.Equal(t, "inactive", f.State)
}

// The scale-up alert fires as soon as a Deployment is reported as stalled
// (the report waited the progress deadline), and not when none is.
func TestFireScaleUpStalled(t *testing.T) {
	rules := filepath.Join("..", "..", "..", "config", "monitoring", "prometheusrule.yaml")
	scrape := func(n int) string { return gaugeScrape(t, "deployguard_scaleups_stalled", n) }
	f, err := fire([]string{rules}, "DeployGuardScaleUpStalled", []string{scrape(0), scrape(1)}, 30*time.Second)
	require.NoError(t, err)
	assert.Equal(t, "firing", f.State)
	assert.Contains(t, f.Annotations["summary"], "1 Deployment(s) stuck short of their replicas")

	f, err = fire([]string{rules}, "DeployGuardScaleUpStalled", []string{scrape(0), scrape(0)}, 30*time.Second)
	require.NoError(t, err)
	assert.Equal(t, "inactive", f.State)
}

// The native-policies alert fires when a replica has found kube-apiserver not
// enforcing the native refusals for the rule's two minutes, and not when it
// enforces them again.
func TestFireNativePoliciesNotEnforced(t *testing.T) {
	rules := filepath.Join("..", "..", "..", "config", "monitoring", "prometheusrule.yaml")
	scrape := func(v int) string { return gaugeScrape(t, "deployguard_native_policies_enforced", v) }
	f, err := fire([]string{rules}, "DeployGuardNativePoliciesNotEnforced", []string{scrape(1), scrape(0), scrape(0), scrape(0), scrape(0), scrape(0)}, 30*time.Second)
	require.NoError(t, err)
	assert.Equal(t, "firing", f.State)
	assert.Contains(t, f.Annotations["summary"], "does not enforce deployguard's native refusals")

	f, err = fire([]string{rules}, "DeployGuardNativePoliciesNotEnforced", []string{scrape(0), scrape(0), scrape(1), scrape(1)}, 30*time.Second)
	require.NoError(t, err)
	assert.Equal(t, "inactive", f.State)
}

// gaugeScrape writes a scrape of one gauge with value v, for fire.
func gaugeScrape(t *testing.T, name string, v int) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "metrics")
	text := fmt.Sprintf("# HELP %[1]s G.\n# TYPE %[1]s gauge\n%[1]s %[2]d\n", name, v)
	require.NoError(t, os.WriteFile(p, []byte(text), 0o644))
	return p
}

// The native-policy alert fires when kube-apiserver counts a compile or
// budget error of deployguard-refusals; not on its ordinary refusals, on the
// selector repair's failed mutations (they refuse nothing), nor on another
// project's policy.
func TestFireNativePolicyErrors(t *testing.T) {
	rules := filepath.Join("..", "..", "..", "config", "monitoring", "prometheusrule.yaml")
	scrape := func(series string, n int) string {
		p := filepath.Join(t.TempDir(), "metrics")
		vap := []string{
			`apiserver_validating_admission_policy_check_total{policy="deployguard-refusals",policy_binding="deployguard-refusals",error_type="invalid_error",enforcement_action="deny"} ` + fmt.Sprint(10*n),
			`apiserver_validating_admission_policy_check_total{policy="another-teams-policy",policy_binding="b",error_type="out_of_budget",enforcement_action="deny"} ` + fmt.Sprint(n),
		}
		mutating := []string{
			`apiserver_mutating_admission_policy_check_total{policy="deployguard-selector",policy_binding="deployguard-selector",error_type="no_error"} ` + fmt.Sprint(5*n),
			`apiserver_mutating_admission_policy_check_total{policy="deployguard-selector",policy_binding="deployguard-selector",error_type="invalid_error"} ` + fmt.Sprint(n),
		}
		if series != "" {
			vap = append(vap, series+" "+fmt.Sprint(n))
		}
		text := "# HELP apiserver_validating_admission_policy_check_total C.\n# TYPE apiserver_validating_admission_policy_check_total counter\n" +
			strings.Join(vap, "\n") + "\n" +
			"# HELP apiserver_mutating_admission_policy_check_total C.\n# TYPE apiserver_mutating_admission_policy_check_total counter\n" +
			strings.Join(mutating, "\n") + "\n"
		require.NoError(t, os.WriteFile(p, []byte(text), 0o644))
		return p
	}
	run := func(series string) Firing {
		var scrapes []string
		for n := range 14 {
			scrapes = append(scrapes, scrape(series, n))
		}
		f, err := fire([]string{rules}, "DeployGuardNativePolicyErrors", scrapes, 30*time.Second)
		require.NoError(t, err)
		return f
	}
	for name, series := range map[string]string{
		"out of budget": `apiserver_validating_admission_policy_check_total{policy="deployguard-refusals",policy_binding="deployguard-refusals",error_type="out_of_budget",enforcement_action="deny"}`,
		"not compiling": `apiserver_validating_admission_policy_check_total{policy="deployguard-refusals",policy_binding="deployguard-refusals",error_type="compile_error",enforcement_action="deny"}`,
	} {
		f := run(series)
		assert.Equal(t, "firing", f.State, name)
		assert.Contains(t, f.Annotations["summary"], "each such Deployment write is refused", name)
	}
	assert.Equal(t, "inactive", run("").State, "ordinary refusals, the selector repair's errors, another project's policy")

	// The selector repair's errors have an alert of their own: such a
	// create is not labelled for the refusals.
	var scrapes []string
	for n := range 14 {
		scrapes = append(scrapes, scrape("", n))
	}
	f, err := fire([]string{rules}, "DeployGuardSelectorPolicyErrors", scrapes, 30*time.Second)
	require.NoError(t, err)
	assert.Equal(t, "firing", f.State)
	assert.Contains(t, f.Annotations["summary"], "only through the guard's webhook")
}
