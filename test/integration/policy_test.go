package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/test/harness"
	"github.com/deployguard/deployguard/webhook/routing"
)

const teamPolicy = `package deployguard.team

import rego.v1

deny contains {"msg": "every Deployment needs a team label: add metadata.labels.team", "field": "metadata.labels.team"} if {
	not input.object.metadata.labels.team
}
`

// A policy ConfigMap takes effect, is reported when broken, and is lifted when
// deleted, all without a restart.
func TestPolicyHotReloadFromConfigMaps(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, k8s, kept)
	unlabelled := func() *appsv1.Deployment { return harness.Deployment(ns, "anon", appImage) }
	denied := func() (bool, string) {
		err := k8s.Create(ctx, unlabelled(), client.DryRunAll)
		if err == nil {
			return false, ""
		}
		return strings.Contains(err.Error(), "[policy team]"), err.Error()
	}
	ok, msg := denied()
	require.False(t, ok, "denied before the policy exists: %s", msg)

	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "team-policy", Namespace: harness.GuardNamespace, Labels: map[string]string{vocab.LabelPolicy: "true"}},
		Data:       map[string]string{"team.rego": teamPolicy},
	}
	created := time.Now()
	require.NoError(t, k8s.Create(ctx, cm))
	require.Eventually(t, func() bool { ok, msg = denied(); return ok }, waitShort, 20*time.Millisecond, "the new policy never denied")
	t.Logf("policy live %s after the ConfigMap was created", time.Since(created).Round(time.Millisecond))
	assert.Contains(t, msg, "metadata.labels.team: Forbidden: [policy team] every Deployment needs a team label")

	labelled := harness.Deployment(ns, "owned", appImage)
	labelled.Labels = map[string]string{"team": "checkout"}
	require.NoError(t, k8s.Create(ctx, labelled, client.DryRunAll), "a compliant Deployment is admitted")

	// A broken module is reported on the ConfigMap and changes nothing.
	broken := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "broken-policy", Namespace: harness.GuardNamespace, Labels: map[string]string{vocab.LabelPolicy: "true"}},
		Data:       map[string]string{"broken.rego": "package deployguard.broken\n\ndeny contains msg if {\n\tmsg := \n}\n"},
	}
	require.NoError(t, k8s.Create(ctx, broken))
	var annotation string
	require.Eventually(t, func() bool {
		got := &corev1.ConfigMap{}
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(broken), got); err != nil {
			return false
		}
		annotation = got.Annotations[policyErrorAnnotation]
		return annotation != ""
	}, waitShort, tick, "the syntax error was not reported on the ConfigMap")
	assert.Contains(t, annotation, "broken.rego:5: rego_parse_error", "the error names the key and the line")
	require.Eventually(t, func() bool {
		var evs eventsv1.EventList
		if err := k8s.List(ctx, &evs, client.InNamespace(harness.GuardNamespace)); err != nil {
			return false
		}
		for _, e := range evs.Items {
			if e.Regarding.Name == "broken-policy" && e.Type == corev1.EventTypeWarning {
				return true
			}
		}
		return false
	}, waitShort, tick, "no Warning event on the broken ConfigMap")
	ok, msg = denied()
	assert.True(t, ok, "the policies in force stay in force: %s", msg)

	// Deleting the ConfigMap lifts its rule.
	require.NoError(t, k8s.Delete(ctx, cm))
	require.NoError(t, k8s.Delete(ctx, broken))
	require.Eventually(t, func() bool { ok, _ := denied(); return !ok }, waitShort, tick, "the rule outlived its ConfigMap")
}

// A rule that reads the namespace's labels sees them through input.namespaceLabels.
func TestPolicySeesNamespaceLabels(t *testing.T) {
	ctx := context.Background()
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "tier-policy", Namespace: harness.GuardNamespace, Labels: map[string]string{vocab.LabelPolicy: "true"}},
		Data: map[string]string{"tier.rego": `package deployguard.tier

import rego.v1

deny contains "production namespaces need at least 2 replicas" if {
	input.namespaceLabels.tier == "production"
	input.object.spec.replicas < 2
}
`},
	}
	require.NoError(t, k8s.Create(ctx, cm))
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), cm) })
	prod := harness.NewNamespace(t, k8s, kept, harness.NamespaceLabels(map[string]string{"tier": "production"}))
	dev := harness.NewNamespace(t, k8s, kept, harness.NamespaceLabels(map[string]string{"tier": "dev"}))
	single := func(ns string) *appsv1.Deployment {
		d := harness.Deployment(ns, "single", appImage)
		d.Spec.Replicas = ptr(int32(1))
		return d
	}
	require.Eventually(t, func() bool {
		err := k8s.Create(ctx, single(prod), client.DryRunAll)
		return err != nil && strings.Contains(err.Error(), "[policy tier] production namespaces need at least 2 replicas")
	}, waitShort, tick)
	assert.NoError(t, k8s.Create(ctx, single(dev), client.DryRunAll))
}

// criticalPolicy is the platform team's deletion rule of issue 46, as
// policy/README.md ("Deletions") tells authors to write one.
const criticalPolicy = `# METADATA
# custom:
#   mode: enforce
package deployguard.itcritical

deny contains "a tier: critical Deployment may not be deleted: remove the label first if it is no longer critical" if {
	input.operation == "DELETE"
	input.oldObject.metadata.labels.tier == "critical"
}
`

// An enforced policy refuses the DELETE of a Deployment labelled tier:
// critical, through the real API server, once the validating webhook is
// routed as the guard's leader routes it for that policy; a Deployment it
// does not object to is deleted, and so is the critical one once its label
// is gone.
func TestEnforcedPolicyRefusesDeletingACriticalDeployment(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, k8s, kept)
	critical := harness.Deployment(ns, "payments", appImage, func(d *appsv1.Deployment) { d.Labels = map[string]string{"tier": "critical"} })
	plain := harness.Deployment(ns, "ledger", appImage)
	require.NoError(t, k8s.Create(ctx, critical))
	require.NoError(t, k8s.Create(ctx, plain))

	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "critical-policy", Namespace: harness.GuardNamespace, Labels: map[string]string{vocab.LabelPolicy: "true"}},
		Data:       map[string]string{"critical.rego": criticalPolicy},
	}
	require.NoError(t, k8s.Create(ctx, cm))
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), cm) })
	require.Eventually(t, func() bool {
		for _, p := range engine.Policies() {
			if p.Name == "itcritical" {
				return p.Deletes
			}
		}
		return false
	}, waitShort, tick, "the deletion rule was never loaded, or not as one that judges deletions")

	// The suite runs no leader: route the validating webhook as it would
	// for the loaded set, and give the suite its shipped routing back.
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	require.NoError(t, k8s.Get(ctx, client.ObjectKey{Name: "deployguard-validating"}, vwc))
	shipped := vwc.DeepCopy().Webhooks
	t.Cleanup(func() {
		_ = retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cur := &admissionregistrationv1.ValidatingWebhookConfiguration{}
			if err := k8s.Get(context.Background(), client.ObjectKey{Name: "deployguard-validating"}, cur); err != nil {
				return err
			}
			cur.Webhooks = shipped
			return k8s.Update(context.Background(), cur)
		})
	})
	e := routing.EnforcedOf(guardConfig().WebhookOptions(guardUser), routing.LoadedPoliciesOf(engine.Active()))
	require.True(t, e.PoliciesOnDelete, "the enforced deletion rule routes DELETE to the guard")
	_, err := routing.Route(ctx, k8s, "deployguard-validating", e)
	require.NoError(t, err)
	require.Contains(t, enforceOperations(ctx, t), admissionregistrationv1.Delete)

	// Dry runs until the API server has the new routing: a delete that
	// came too early must not delete.
	const refusal = `Deployment.apps "payments" is invalid: metadata: Forbidden: [policy itcritical] a tier: critical Deployment may not be deleted: remove the label first if it is no longer critical`
	var msg string
	require.Eventually(t, func() bool {
		err := k8s.Delete(ctx, critical.DeepCopy(), client.DryRunAll)
		if err == nil {
			return false
		}
		msg = err.Error()
		return strings.Contains(msg, "[policy itcritical]")
	}, waitShort, tick, "the DELETE of a tier: critical Deployment was never refused")
	assert.Contains(t, msg, refusal)
	err = k8s.Delete(ctx, critical.DeepCopy())
	require.Error(t, err, "refused for real, not only in a dry run")
	assert.Contains(t, err.Error(), refusal)
	require.NoError(t, k8s.Get(ctx, client.ObjectKeyFromObject(critical), &appsv1.Deployment{}), "still there")

	assert.NoError(t, k8s.Delete(ctx, plain), "a Deployment the policy does not object to is deleted")

	// The documented way out: the label removed (an ordinary update), the
	// deletion goes through.
	require.NoError(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := &appsv1.Deployment{}
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(critical), cur); err != nil {
			return err
		}
		delete(cur.Labels, "tier")
		return k8s.Update(ctx, cur)
	}))
	assert.NoError(t, k8s.Delete(ctx, critical.DeepCopy()), "no longer critical")
}

// enforceOperations are the operations of the validating webhook's enforce
// entry as the API server has them.
func enforceOperations(ctx context.Context, t *testing.T) []admissionregistrationv1.OperationType {
	t.Helper()
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	require.NoError(t, k8s.Get(ctx, client.ObjectKey{Name: "deployguard-validating"}, vwc))
	for _, w := range vwc.Webhooks {
		if w.Name == routing.EnforceWebhook {
			return w.Rules[0].Operations
		}
	}
	require.FailNow(t, "no "+routing.EnforceWebhook+" entry")
	return nil
}
