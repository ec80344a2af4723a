package config

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deployguard/deployguard/policy"
	"github.com/deployguard/deployguard/test/harness"
	"github.com/deployguard/deployguard/webhook/native"
	"github.com/deployguard/deployguard/webhook/routing"
)

// TestShippedRoutingIsTheDefaults: the webhook configuration as shipped
// routes exactly as the guard's leader would with the default configuration
// (and the native policies installed), but for the enforce entry's
// objectSelector, which the leader adds, so that a guard that never started
// leaves a routing that judges every request it must.
func TestShippedRoutingIsTheDefaults(t *testing.T) {
	_, vwc, err := harness.WebhookConfigurations()
	require.NoError(t, err)
	opts := Default().WebhookOptions("system:serviceaccount:deployguard-system:deployguard")
	opts.NativeInAPIServer = true
	// The built-in policies, in their default modes, are what is loaded.
	eng, err := policy.New(policy.Options{})
	require.NoError(t, err)
	require.NoError(t, eng.Load(context.Background(), policy.Builtins()))
	e := routing.EnforcedOf(opts, routing.LoadedPolicies{BeyondSpec: !eng.Active().ReadsOnlySpec()})
	entries := map[string]admissionregistrationv1.ValidatingWebhook{}
	for _, w := range vwc.Webhooks {
		entries[w.Name] = w
	}
	condition := func(hook, name string) (string, bool) {
		for _, mc := range entries[hook].MatchConditions {
			if mc.Name == name {
				return mc.Expression, true
			}
		}
		return "", false
	}
	require.Contains(t, entries, routing.EnforceWebhook)
	require.Contains(t, entries, routing.CreateWebhook)
	require.Contains(t, entries, routing.UpdateWebhook)
	assert.NotContains(t, entries, routing.ValidateWebhook, "an earlier guard leaves this layout alone only without it")

	for _, r := range entries[routing.EnforceWebhook].Rules {
		assert.Equal(t, routing.EnforceOperations(e), r.Operations, "the enforce entry's operations")
	}
	// The leader adds the selector: a re-apply of the manifests then leaves
	// the entry judging every Deployment, never none.
	assert.NotNil(t, routing.EnforceObjectSelector(e))
	if sel := entries[routing.EnforceWebhook].ObjectSelector; assert.NotNil(t, sel, "written out, so that an earlier release's apply removes the leader's") {
		assert.Equal(t, metav1.LabelSelector{}, *sel, "every object as shipped")
	}
	got, ok := condition(routing.EnforceWebhook, routing.MustDecideCondition)
	assert.True(t, ok)
	assert.Equal(t, routing.MustDecide(e), got)
	got, ok = condition(routing.UpdateWebhook, routing.MayAdviseCondition)
	assert.True(t, ok)
	assert.Equal(t, routing.MayAdvise(e), got)
	// An ordinary create costs the API server no CEL evaluation for the
	// validating webhook.
	assert.Empty(t, routing.MayAdviseCreate(e))
	assert.Empty(t, entries[routing.CreateWebhook].MatchConditions, "the create entry has no matchConditions")
	for _, r := range entries[routing.CreateWebhook].Rules {
		assert.Equal(t, []admissionregistrationv1.OperationType{admissionregistrationv1.Create}, r.Operations)
	}
	for _, r := range entries[routing.UpdateWebhook].Rules {
		assert.Equal(t, []admissionregistrationv1.OperationType{admissionregistrationv1.Update}, r.Operations)
	}
}

// The mutating entries as shipped are the default configuration's routing
// with deployguard-selector installed (config/default installs it): the
// default entry takes updates alone, the creates come labelled to the
// other, which evaluates no condition.
func TestShippedMutatingRoutingIsTheDefaults(t *testing.T) {
	mwc, _, err := harness.WebhookConfigurations()
	require.NoError(t, err)
	entries := map[string]admissionregistrationv1.MutatingWebhook{}
	for _, w := range mwc.Webhooks {
		entries[w.Name] = w
	}
	require.Contains(t, entries, routing.DefaultWebhook)
	require.Contains(t, entries, routing.DefaultCreateWebhook)
	labelled := routing.CreatesLabelled(true, true, Default().ChangesEveryDeployment())
	for _, r := range entries[routing.DefaultWebhook].Rules {
		assert.Equal(t, routing.DefaultOperations(labelled), r.Operations)
	}
	create := entries[routing.DefaultCreateWebhook]
	assert.Empty(t, create.MatchConditions)
	require.NotNil(t, create.ObjectSelector)
	assert.Equal(t, []metav1.LabelSelectorRequirement{{Key: native.LabelDefaulting, Operator: metav1.LabelSelectorOpExists}}, create.ObjectSelector.MatchExpressions)
	assert.Equal(t, entries[routing.DefaultWebhook].ClientConfig, create.ClientConfig, "the same handler")
	assert.Equal(t, entries[routing.DefaultWebhook].NamespaceSelector, create.NamespaceSelector, "the same namespaces")
}
