package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/test/harness"
	"github.com/deployguard/deployguard/webhook/review"
	"github.com/deployguard/deployguard/webhook/routing"
)

// TestMetadataUpdatesReachTheGuardOnlyWhenAPolicyReadsThem: with the
// built-in policies, which read only the spec, `kubectl annotate` costs no
// webhook call and repeats no warning, while an image change is judged.
// Once a platform team hot-loads a policy that reads the metadata, the
// guard's leader routes such updates to the guard again, and kubectl shows
// that policy's warning; once it is removed, they skip the guard again.
func TestMetadataUpdatesReachTheGuardOnlyWhenAPolicyReadsThem(t *testing.T) {
	ctx := context.Background()
	// The default install's routing: the native refusals enforced by the
	// API server, the built-in policies only.
	def := &review.Options{NativeInAPIServer: true, Quarantine: review.QuarantineEnforce}
	narrow := routing.MayAdvise(routing.EnforcedOf(def, routing.LoadedPolicies{}))
	harness.WaitFor(t, time.Minute, "the validating webhook never routed as for a default install", func(ctx context.Context) (bool, string, error) {
		got := advised(ctx, t)
		return got == narrow, got, nil
	})
	ns := harness.NewNamespace(t, local.Client)
	d := harness.Deployment(ns, "web", "registry.example.com/shop/web:1.0.0", shortDeadline)
	d.Spec.Template.Spec.Containers[0].ReadinessProbe = nil
	require.NoError(t, local.Client.Create(ctx, d))
	kubectl := func(args ...string) string {
		t.Helper()
		out, err := local.Cluster.Kubectl(ctx, local.Cluster.Kubeconfig, append(args, "-n", ns)...)
		require.NoError(t, err, out)
		return out
	}
	const noProbe = `container "app" has no readinessProbe`

	// The built-in probes policy (warn) is asked about a spec change only.
	out := kubectl("set", "image", "deployment/web", "app=registry.example.com/shop/web:1.0.1")
	assert.Contains(t, out, noProbe, "an image change is judged")
	out = kubectl("annotate", "deployment", "web", "note=1")
	assert.NotContains(t, out, "Warning:", "an annotation is not judged (no warning) while no policy reads it")

	cm := hotLoadPolicy(ctx, t, "e2e-routing-owner", "owner.rego", fmt.Sprintf(`# METADATA
# custom:
#   mode: warn
package deployguard.e2eowner

import rego.v1

deny contains {"msg": "annotate the Deployment with its owner", "field": "metadata.annotations.owner"} if {
	input.object.metadata.namespace == %q
	not input.object.metadata.annotations.owner
}
`, ns))

	// Each try writes a new value: an update that changes the metadata only.
	note := 1
	annotate := func() string {
		note++
		return kubectl("annotate", "--overwrite", "deployment", "web", fmt.Sprintf("note=%d", note))
	}
	harness.WaitFor(t, time.Minute, "an annotation never reached the policy that reads it", func(context.Context) (bool, string, error) {
		out := annotate()
		return strings.Contains(out, "annotate the Deployment with its owner"), out, nil
	})
	// Asked, the guard runs every loaded policy.
	out = annotate()
	assert.Contains(t, out, noProbe)
	out = kubectl("annotate", "deployment", "web", "owner=checkout")
	assert.NotContains(t, out, "with its owner", "the policy is satisfied")

	require.NoError(t, local.Client.Delete(ctx, cm))
	harness.WaitFor(t, time.Minute, "annotations still reach the guard once no policy reads them", func(context.Context) (bool, string, error) {
		out := annotate()
		return !strings.Contains(out, "Warning:"), out, nil
	})
}

// advised is the update entry's routing condition as installed.
func advised(ctx context.Context, t *testing.T) string {
	t.Helper()
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	require.NoError(t, local.Client.Get(ctx, client.ObjectKey{Name: "deployguard-validating"}, vwc))
	for _, w := range vwc.Webhooks {
		if w.Name != routing.UpdateWebhook {
			continue
		}
		for _, c := range w.MatchConditions {
			if c.Name == routing.MayAdviseCondition {
				return c.Expression
			}
		}
	}
	return ""
}
