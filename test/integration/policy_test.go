package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/test/harness"
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
	ns := newNamespace(t, nil)
	unlabelled := func() *appsv1.Deployment { return deployment(ns, "anon") }
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

	labelled := deployment(ns, "owned")
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
	prod := newNamespace(t, map[string]string{"tier": "production"})
	dev := newNamespace(t, map[string]string{"tier": "dev"})
	single := func(ns string) *appsv1.Deployment {
		d := deployment(ns, "single")
		d.Spec.Replicas = ptr(int32(1))
		return d
	}
	require.Eventually(t, func() bool {
		err := k8s.Create(ctx, single(prod), client.DryRunAll)
		return err != nil && strings.Contains(err.Error(), "[policy tier] production namespaces need at least 2 replicas")
	}, waitShort, tick)
	assert.NoError(t, k8s.Create(ctx, single(dev), client.DryRunAll))
}
