package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/test/harness"
)

// auditJSON is the part of `deployguard audit -o json` the test reads.
type auditJSON struct {
	Policies []struct {
		Policy     string         `json:"policy"`
		Severity   string         `json:"severity"`
		Category   string         `json:"category"`
		Counts     map[string]int `json:"deployments"`
		Namespaces []struct {
			Namespace string         `json:"namespace"`
			Counts    map[string]int `json:"deployments"`
			Failing   []string       `json:"failing"`
		} `json:"namespaces"`
	} `json:"policies"`
}

// TestAuditCommand: a platform team hot-loads a policy in audit mode on a
// running guard, then asks `deployguard audit` (and kubectl) which existing
// Deployments it would refuse, before enforcing it.
func TestAuditCommand(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, local.Client)
	for _, name := range []string{"billing", "checkout", "search"} {
		d := harness.Deployment(ns, name, "registry.example.com/shop/"+name+":1.0.0", shortDeadline)
		if name == "search" {
			d.Labels = map[string]string{"team": "discovery"}
		}
		require.NoError(t, local.Client.Create(ctx, d))
	}
	hotLoadPolicy(ctx, t, "e2e-audit-team", "team.rego", fmt.Sprintf(`# METADATA
# custom:
#   mode: audit
#   severity: high
#   category: Ownership
package deployguard.e2eteam

import rego.v1

deny contains {"msg": "every Deployment needs a team label", "field": "metadata.labels.team"} if {
	input.object.metadata.namespace == %q
	not input.object.metadata.labels.team
}
`, ns))

	var report auditJSON
	harness.WaitFor(t, time.Minute, "the audit never reported the two Deployments without a team", func(ctx context.Context) (bool, string, error) {
		out, err := guard(ctx, t, "audit", "-n", ns, "-o", "json")
		if err != nil {
			return false, out, nil
		}
		report = auditJSON{}
		if err := json.Unmarshal([]byte(out), &report); err != nil {
			return false, out, err
		}
		for _, p := range report.Policies {
			if p.Policy == "deployguard.e2eteam" && p.Counts["fail"] == 2 {
				return true, out, nil
			}
		}
		return false, out, nil
	})
	for _, p := range report.Policies {
		if p.Policy != "deployguard.e2eteam" {
			continue
		}
		assert.Equal(t, "high", p.Severity)
		assert.Equal(t, "Ownership", p.Category)
		require.Len(t, p.Namespaces, 1)
		assert.Equal(t, ns, p.Namespaces[0].Namespace)
		assert.ElementsMatch(t, []string{"billing", "checkout"}, p.Namespaces[0].Failing)
	}

	text, err := guard(ctx, t, "audit", "-n", ns)
	require.NoError(t, err, text)
	t.Logf("deployguard audit -n %s:\n%s", ns, text)
	assert.Contains(t, text, "deployguard.e2eteam (severity high, category Ownership): 2 Deployments in 1 namespaces would be refused")
	assert.Contains(t, text, "  "+ns+": 2 fail  (billing, checkout)")

	// The same report through kubectl, as the README shows it.
	out, err := local.Cluster.Kubectl(ctx, local.Cluster.Kubeconfig, "get", "policyreport", "-n", ns)
	require.NoError(t, err, out)
	assert.True(t, strings.Contains(out, "deployguard"), "kubectl get policyreport shows the guard's report:\n%s", out)
}

// hotLoadPolicy writes a policy ConfigMap in the guard's namespace, as a
// platform team hot-loads a policy, and deletes it when the test ends.
func hotLoadPolicy(ctx context.Context, t *testing.T, name, file, rego string) *corev1.ConfigMap {
	t.Helper()
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: harness.GuardNamespace, Labels: map[string]string{vocab.LabelPolicy: "true"}},
		Data:       map[string]string{file: rego},
	}
	require.NoError(t, local.Client.Create(ctx, cm))
	t.Cleanup(func() { _ = local.Client.Delete(context.Background(), cm) })
	return cm
}
