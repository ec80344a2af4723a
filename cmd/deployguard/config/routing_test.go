package config

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"sigs.k8s.io/yaml"

	"github.com/deployguard/deployguard/policy"
	guardwebhook "github.com/deployguard/deployguard/webhook"
)

// TestShippedRoutingIsTheDefaults: the webhook configuration as shipped
// routes exactly as the guard's leader would with the default configuration
// (and the native policies installed), so a default install is never
// rewritten, and a guard that never started leaves the right routing.
func TestShippedRoutingIsTheDefaults(t *testing.T) {
	b, err := os.ReadFile("../../../config/webhook/manifests.yaml")
	require.NoError(t, err)
	var vwc *admissionregistrationv1.ValidatingWebhookConfiguration
	for _, doc := range strings.Split(string(b), "\n---\n") {
		if strings.Contains(doc, "kind: ValidatingWebhookConfiguration") {
			vwc = &admissionregistrationv1.ValidatingWebhookConfiguration{}
			require.NoError(t, yaml.UnmarshalStrict([]byte(doc), vwc))
		}
	}
	require.NotNil(t, vwc)
	opts := Default().WebhookOptions("system:serviceaccount:deployguard-system:deployguard")
	opts.NativeInAPIServer = true
	// The built-in policies, in their default modes, are what is loaded.
	eng, err := policy.New(policy.Options{})
	require.NoError(t, err)
	require.NoError(t, eng.Load(context.Background(), policy.Builtins()))
	e := opts.Enforced(guardwebhook.LoadedPolicies{BeyondSpec: !eng.Active().ReadsOnlySpec()})
	want := map[string][2]string{
		guardwebhook.EnforceWebhook:  {guardwebhook.MustDecideCondition, guardwebhook.MustDecide(e)},
		guardwebhook.ValidateWebhook: {guardwebhook.MayAdviseCondition, guardwebhook.MayAdvise(e)},
	}
	for hook, cond := range want {
		found := false
		for _, w := range vwc.Webhooks {
			if w.Name != hook {
				continue
			}
			for _, mc := range w.MatchConditions {
				if mc.Name == cond[0] {
					found = true
					assert.Equal(t, cond[1], mc.Expression, "%s: %s", hook, cond[0])
				}
			}
		}
		assert.True(t, found, "%s has the matchCondition %s", hook, cond[0])
	}
}
