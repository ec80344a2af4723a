package install

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/test/harness"
)

// policyException is a PolicyException for the resources policy on one
// Deployment, expiring at expires.
func policyException(name string, expires time.Time) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "deployguard.io/v1alpha1", "kind": "PolicyException",
		"metadata": map[string]any{"name": name, "namespace": harness.GuardNamespace},
		"spec": map[string]any{
			"match":     map[string]any{"namespace": "legacy", "names": []any{"web"}},
			"checks":    []any{"revision-history"},
			"expiresAt": expires.UTC().Format(time.RFC3339),
			"owner":     "platform-team", "reason": "OPS-1234: the chart ships no resources",
		},
	}}
	return u
}

// eventOn waits for an Event with reason on the named PolicyException and
// returns its message.
func eventOn(ctx context.Context, t *testing.T, name, reason string, within time.Duration) string {
	t.Helper()
	var msg string
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, within, true, func(ctx context.Context) (bool, error) {
		var evs corev1.EventList
		if err := local.Client.List(ctx, &evs, client.InNamespace(harness.GuardNamespace)); err != nil {
			return false, nil
		}
		for _, e := range evs.Items {
			if e.InvolvedObject.Kind == "PolicyException" && e.InvolvedObject.Name == name && e.Reason == reason {
				msg = e.Message
				return true, nil
			}
		}
		return false, nil
	})
	require.NoError(t, err, "no %s Event on PolicyException %s", reason, name)
	return msg
}

// The running guard tells the platform team ahead of an exception's expiry
// (an Event and deployguard_policy_exceptions{state="expiring"}, which the
// alert reads) and at it (an ExceptionExpired Event).
func TestExceptionExpiryIsAnnounced(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	soon := policyException("legacy-web-soon", time.Now().Add(48*time.Hour))
	require.NoError(t, local.Client.Create(ctx, soon))
	t.Cleanup(func() { _ = local.Client.Delete(context.Background(), soon) })
	msg := eventOn(ctx, t, soon.GetName(), "ExceptionExpiringSoon", 30*time.Second)
	for _, want := range []string{"PolicyException deployguard-system/legacy-web-soon expires at", "check revision-history",
		"Deployments web in legacy", "owner platform-team", "OPS-1234", "renew it"} {
		require.Contains(t, msg, want)
	}

	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		fams, err := scrape(ctx)
		if err != nil {
			return false, nil
		}
		for _, m := range fams["deployguard_policy_exceptions"].GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "state" && l.GetValue() == "expiring" && m.GetGauge().GetValue() >= 1 {
					return true, nil
				}
			}
		}
		return false, nil
	})
	require.NoError(t, err, `deployguard_policy_exceptions{state="expiring"} never counted the exception`)

	// The webhook refuses an expiry in the past, so this one expires while
	// the test waits.
	brief := policyException("legacy-web-brief", time.Now().Add(8*time.Second))
	require.NoError(t, local.Client.Create(ctx, brief))
	t.Cleanup(func() { _ = local.Client.Delete(context.Background(), brief) })
	msg = eventOn(ctx, t, brief.GetName(), "ExceptionExpired", 40*time.Second)
	require.True(t, strings.HasPrefix(msg, "PolicyException deployguard-system/legacy-web-brief expired at"), msg)
	require.Contains(t, msg, "no longer applies")
}
