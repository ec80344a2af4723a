package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"

	"github.com/deployguard/deployguard/test/harness"
)

// TestAuditJudgesWhatTheCacheDoesNotKeep: the guard's cache keeps neither a
// Deployment's pod template nor a 200 KB annotation of a tenant's, yet a
// policy that reads either judges what the API server stores: the audit
// reads an incomplete copy whole. Judged from the cache, both would pass.
func TestAuditJudgesWhatTheCacheDoesNotKeep(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, local.Client)
	notes := func(end string) harness.DeploymentOption {
		return func(d *appsv1.Deployment) {
			d.Annotations = map[string]string{"team.example/notes": strings.Repeat("x", 200_000) + end}
		}
	}
	for _, d := range []*appsv1.Deployment{
		harness.Deployment(ns, "notes-bad", "registry.example.com/shop/app:1.0.0", shortDeadline, notes("forbidden")),
		harness.Deployment(ns, "notes-good", "registry.example.com/shop/app:1.0.0", shortDeadline, notes("fine")),
		harness.Deployment(ns, "legacy", "registry.example.com/legacy/app:1.0.0", shortDeadline),
	} {
		require.NoError(t, local.Client.Create(ctx, d))
	}
	hotLoadPolicy(ctx, t, "e2e-audit-trimmed", "trimmed.rego", fmt.Sprintf(`# METADATA
# custom:
#   mode: audit
package deployguard.e2etrimmed

import rego.v1

deny contains {"msg": "the notes say forbidden", "field": "metadata.annotations"} if {
	input.object.metadata.namespace == %[1]q
	endswith(input.object.metadata.annotations["team.example/notes"], "forbidden")
}

deny contains {"msg": "no legacy images", "field": "spec.template.spec.containers"} if {
	input.object.metadata.namespace == %[1]q
	some c in input.object.spec.template.spec.containers
	contains(c.image, "/legacy/")
}
`, ns))

	harness.WaitFor(t, time.Minute, "the audit never reported the annotation and the image the cache does not keep", func(ctx context.Context) (bool, string, error) {
		out, err := guard(ctx, t, "audit", "-n", ns, "-o", "json")
		if err != nil {
			return false, out, nil
		}
		var report auditJSON
		if err := json.Unmarshal([]byte(out), &report); err != nil {
			return false, out, err
		}
		for _, p := range report.Policies {
			if p.Policy != "deployguard.e2etrimmed" || len(p.Namespaces) != 1 {
				continue
			}
			failing := slices.Clone(p.Namespaces[0].Failing)
			slices.Sort(failing)
			return slices.Equal(failing, []string{"legacy", "notes-bad"}), fmt.Sprintf("failing: %v", failing), nil
		}
		return false, "no results of deployguard.e2etrimmed yet: " + out, nil
	})
	text, err := guard(ctx, t, "audit", "-n", ns)
	require.NoError(t, err, text)
	assert.Contains(t, text, "  "+ns+": 2 fail  (legacy, notes-bad)")
}
