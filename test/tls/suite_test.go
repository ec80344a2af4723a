// Package tls tests the webhooks' TLS end to end, each test on its own local
// cluster (real kube-apiserver, kube-controller-manager, kube-scheduler, kwok
// nodes): the guard's self-managed certificate and the cert-manager install
// path against cert-manager's own controllers, rotation under admission load
// with zero failed requests, /readyz against the CA bundle the API server
// holds, the expiry metric and warning, and the TLS settings.
package tls

import (
	"context"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cmapi "github.com/cert-manager/cert-manager/pkg/apis/certmanager/v1"

	"github.com/deployguard/deployguard/test/harness"
)

// tier has the control plane, the guard binary and the tier's work folder:
// each test starts a cluster of its own in a folder of its own.
var tier *harness.Tier

func TestMain(m *testing.M) {
	os.Exit(harness.RunTier(m, harness.TierOptions{
		Name: "tls",
		Setup: func(_ context.Context, tr *harness.Tier) error {
			tier = tr
			return nil
		},
	}))
}

func scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(cmapi.AddToScheme(s))
	return s
}

// injectedBundle is the caBundle of the guard's validating webhook.
func injectedBundle(ctx context.Context, c client.Client) ([]byte, error) {
	v := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	if err := c.Get(ctx, client.ObjectKey{Name: "deployguard-validating"}, v); err != nil {
		return nil, err
	}
	return v.Webhooks[0].ClientConfig.CABundle, nil
}

// setBundle replaces the caBundle of every webhook of both configurations, as
// an operator (or a broken injector) would: on a conflict it reads again and
// retries, as kubectl edit would, since the guard may be writing the same
// objects at the moment.
func setBundle(ctx context.Context, t *testing.T, c client.Client, bundle []byte) {
	t.Helper()
	require.NoError(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		m := &admissionregistrationv1.MutatingWebhookConfiguration{}
		if err := c.Get(ctx, client.ObjectKey{Name: "deployguard-mutating"}, m); err != nil {
			return err
		}
		for i := range m.Webhooks {
			m.Webhooks[i].ClientConfig.CABundle = bundle
		}
		return c.Update(ctx, m)
	}))
	require.NoError(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		v := &admissionregistrationv1.ValidatingWebhookConfiguration{}
		if err := c.Get(ctx, client.ObjectKey{Name: "deployguard-validating"}, v); err != nil {
			return err
		}
		for i := range v.Webhooks {
			v.Webhooks[i].ClientConfig.CABundle = bundle
		}
		return c.Update(ctx, v)
	}))
}

// readyzStatus is the guard's /readyz status code (0 when it does not answer).
func readyzStatus(g *harness.Guard) int {
	code, _, err := g.Get(g.ProbeAddr, "/readyz")
	if err != nil {
		return 0
	}
	return code
}
