package integration

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/policy"
	"github.com/deployguard/deployguard/test/harness"
	"github.com/deployguard/deployguard/webhook/audit"
)

// verdict is what a user sees of one Deployment's admission.
type verdict struct {
	Admitted bool
	Problems []string // "field: message", sorted
	Warnings []string // sorted
	// native: refused by one of the guard's native policies.
	native bool
}

// The webhooks (through a real kube-apiserver), `deployguard check` (the
// built binary, offline, with the guard's config file) and the audit (its
// evaluator, on the object the API server would store) give the same verdict
// in the same words on every Deployment of one corpus: for an ordinary user,
// an exempt user, a member of an exempt group, and in an exempt namespace.
func TestAdmissionCheckAndAuditAgree(t *testing.T) {
	bin, err := harness.GuardBinary()
	require.NoError(t, err)
	corpus := filepath.Join("testdata", "parity", "corpus.yaml")
	deployments := readCorpus(t, corpus)
	configFile := filepath.Join(t.TempDir(), "config.yaml")
	require.NoError(t, os.WriteFile(configFile, []byte(guardConfigYAML), 0o600))
	ordinary := harness.NewNamespace(t, k8s, kept)
	err = k8s.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: exemptNamespace}})
	require.True(t, err == nil || apierrors.IsAlreadyExists(err), "%v", err)

	cases := []struct {
		name, namespace, user string
		groups                []string
		exempt                bool
	}{
		{"an ordinary user", ordinary, "parity-user", nil, false},
		{"an exempt user", ordinary, exemptUser, nil, true},
		{"a member of an exempt group", ordinary, "parity-user", []string{exemptGroup}, true},
		{"in an exempt namespace", exemptNamespace, "parity-user", nil, true},
	}
	deniedOrdinary := 0
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			offline := checkVerdicts(t, bin, configFile, corpus, tc.namespace, tc.user, tc.groups)
			require.Len(t, offline, len(deployments))
			c, warnings := clientAsGroups(t, tc.user, append([]string{"system:masters"}, tc.groups...)...)
			denied, audited := 0, 0
			for _, d := range deployments {
				d := d.DeepCopy()
				d.Namespace = tc.namespace
				online := admit(t, c, warnings, d)
				if !online.Admitted {
					denied++
				}
				if refusedNatively(online) {
					// The API server stops at a native policy's first
					// refusal: the webhook is not called, so check's other
					// findings are not said. What it says, check says.
					assert.False(t, offline[d.Name].Admitted, "%s: check admits what a native policy refuses", d.Name)
					assert.Subset(t, offline[d.Name].Problems, online.Problems, "%s: check and the native policies disagree", d.Name)
					assert.Subset(t, offline[d.Name].Warnings, online.Warnings, "%s: check and the native policies disagree", d.Name)
				} else {
					assert.Equal(t, offline[d.Name], online, "%s: check and the webhooks disagree", d.Name)
				}
				if s := storedForm(t, d); !tc.exempt && s != nil {
					said := online
					if refusedNatively(online) {
						said = offline[d.Name] // everything, as the audit judges
					}
					assert.Equal(t, admissionLines(said), auditLines(t, s), "%s: the audit and admission disagree", d.Name)
					audited++
				} else if s == nil {
					// Nothing the audit could ever see: only a selector the
					// guard cannot repair is refused even when exempt.
					assert.False(t, online.Admitted, "%s has no stored form, yet was admitted", d.Name)
				}
				if s := storedForm(t, d); tc.namespace == exemptNamespace && s != nil {
					assertAuditSkips(t, s)
				}
			}
			if tc.exempt {
				assert.Less(t, denied, deniedOrdinary, "an exemption lets through what the checks and policies refuse")
			} else {
				deniedOrdinary = denied
				assert.Positive(t, denied, "the corpus exercises refusals")
				assert.Greater(t, audited, len(deployments)/2, "most of the corpus is compared with the audit")
			}
		})
	}
}

// checkVerdicts runs `deployguard check -o json` on the corpus as user in
// namespace, with the guard's config file.
func checkVerdicts(t *testing.T, bin, configFile, corpus, namespace, user string, groups []string) map[string]verdict {
	t.Helper()
	out, err := exec.Command(bin, "check", "-o", "json", "--config", configFile, "--namespace", namespace,
		"--as", user, "--as-group", strings.Join(groups, ","), "-f", corpus).Output()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		require.Equal(t, 1, exit.ExitCode(), "exit 1: something in the corpus is denied; stderr: %s", exit.Stderr)
	} else {
		require.NoError(t, err)
	}
	var results []struct {
		Kind     string `json:"kind"`
		Name     string `json:"name"`
		Verdict  string `json:"verdict"`
		Problems []struct {
			Field   string `json:"field"`
			Message string `json:"message"`
		} `json:"problems"`
		Warnings []string `json:"warnings"`
	}
	require.NoError(t, json.Unmarshal(out, &results), "%s", out)
	offline := map[string]verdict{}
	for _, r := range results {
		if r.Kind != "Deployment" {
			assert.Equal(t, "skipped", r.Verdict, "%s is passed over", r.Kind)
			continue
		}
		v := verdict{Admitted: r.Verdict == "admitted", Warnings: sorted(r.Warnings)}
		for _, p := range r.Problems {
			v.Problems = append(v.Problems, p.Field+": "+p.Message)
		}
		v.Problems = sorted(v.Problems)
		offline[r.Name] = v
	}
	return offline
}

// admit creates d, dry-run, and returns what its user sees.
func admit(t *testing.T, c client.Client, warnings *warningRecorder, d *appsv1.Deployment) verdict {
	t.Helper()
	before := len(warnings.all())
	err := c.Create(context.Background(), d, client.DryRunAll)
	var ws []string
	for _, w := range warnings.all()[before:] {
		ws = append(ws, nativeLine.ReplaceAllString(w, ""))
	}
	v := verdict{Admitted: err == nil, Warnings: sorted(ws)}
	if err != nil {
		v.native = strings.Contains(err.Error(), "ValidatingAdmissionPolicy '")
		for _, c := range causes(t, err) {
			v.Problems = append(v.Problems, nativeLine.ReplaceAllString(c, ""))
		}
		v.Problems = sorted(v.Problems)
	}
	return v
}

// refusedNatively: one of the guard's native policies refused v.
func refusedNatively(v verdict) bool {
	return v.native
}

// nativeLine is what the API server puts before a native policy's message:
// the guard's own words follow it.
var nativeLine = regexp.MustCompile(`^(: )?(ValidatingAdmissionPolicy '[^']+' with binding '[^']+' denied request|Validation failed for ValidatingAdmissionPolicy '[^']+' with binding '[^']+'): `)

// storedForm is d as the API server would store it, its defaults and the
// guard's included: a dry-run create as a user the checks exempt. Nil when
// even that is refused (a selector the guard cannot repair).
func storedForm(t *testing.T, d *appsv1.Deployment) *appsv1.Deployment {
	t.Helper()
	c, _ := clientAsGroups(t, exemptUser, "system:masters")
	s := d.DeepCopy()
	if err := c.Create(context.Background(), s, client.DryRunAll); err != nil {
		return nil
	}
	return s
}

// admissionLines are admission's problems and warnings as the audit words
// them, less what only a create says: the defaulting of an empty selector.
// A policy's refusal "field: Forbidden: [policy p] message" is the audit's
// "[policy p] field: message".
func admissionLines(v verdict) []string {
	var out []string
	for _, p := range v.Problems {
		if field, msg, ok := strings.Cut(p, ": Forbidden: [policy "); ok {
			name, rest, _ := strings.Cut(msg, "] ")
			p = "[policy " + name + "] " + field + ": " + rest
		}
		out = append(out, p)
	}
	for _, w := range v.Warnings {
		if !strings.HasPrefix(w, "spec.selector: the selector was empty") {
			out = append(out, w)
		}
	}
	return sorted(out)
}

// auditLines are the audit's fail and warn results for s, less those of
// audit-mode policies, which admission only logs. Nil for no stored form.
func auditLines(t *testing.T, s *appsv1.Deployment) []string {
	t.Helper()
	auditMode := map[string]bool{}
	for _, p := range engine.Policies() {
		auditMode["deployguard."+p.Name] = p.Mode == policy.ModeAudit
	}
	e := &audit.Evaluator{Options: guardConfig().WebhookOptions(guardUser), Engine: engine}
	var out []string
	for _, r := range e.Evaluate(context.Background(), s) {
		if (r.Result != audit.ResultFail && r.Result != audit.ResultWarn) || auditMode[r.Policy] {
			continue
		}
		msg := r.Message
		if strings.HasPrefix(r.Policy, "deployguard.") && r.Field == "" {
			// Admission refuses a policy finding without a field at spec.
			name := strings.TrimPrefix(r.Policy, "deployguard.")
			msg = "[policy " + name + "] spec: " + strings.TrimPrefix(msg, "[policy "+name+"] ")
		}
		out = append(out, msg)
	}
	return sorted(out)
}

// assertAuditSkips: in an exempt namespace the audit finds nothing and says
// the namespace is exempt.
func assertAuditSkips(t *testing.T, s *appsv1.Deployment) {
	t.Helper()
	e := &audit.Evaluator{Options: guardConfig().WebhookOptions(guardUser), Engine: engine}
	exempt := false
	for _, r := range e.Evaluate(context.Background(), s) {
		assert.NotContains(t, []string{audit.ResultFail, audit.ResultWarn}, r.Result, "%s/%s in an exempt namespace: %s", r.Policy, r.Rule, r.Message)
		exempt = exempt || (r.Result == audit.ResultSkip && r.Rule == "exempt")
	}
	assert.True(t, exempt, "the audit says the namespace is exempt")
}

func readCorpus(t *testing.T, path string) []*appsv1.Deployment {
	t.Helper()
	ds, err := harness.ReadDeployments(path)
	require.NoError(t, err)
	return ds
}

// causes returns the refusal's problems as "field: message", as the API
// server relays them from the webhook.
func causes(t *testing.T, err error) []string {
	t.Helper()
	var st apierrors.APIStatus
	require.True(t, errors.As(err, &st), "%v", err)
	var out []string
	if d := st.Status().Details; d != nil {
		for _, c := range d.Causes {
			out = append(out, c.Field+": "+c.Message)
		}
	}
	require.NotEmpty(t, out, "the refusal carries its causes: %v", err)
	return out
}

func sorted(xs []string) []string {
	if len(xs) == 0 {
		return nil
	}
	out := append([]string(nil), xs...)
	for i := range out {
		out[i] = strings.TrimSpace(out[i])
	}
	sort.Strings(out)
	return out
}
