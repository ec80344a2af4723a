// Package tls tests the webhooks' TLS end to end, each test on its own local
// cluster (real kube-apiserver, kube-controller-manager, kube-scheduler, kwok
// nodes): the guard's self-managed certificate and the cert-manager install
// path against cert-manager's own controllers, rotation under admission load
// with zero failed requests, /readyz against the CA bundle the API server
// holds, the expiry metric and warning, and the TLS settings.
package tls

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cmapi "github.com/cert-manager/cert-manager/pkg/apis/certmanager/v1"

	"github.com/deployguard/deployguard/test/harness"
)

var tools, guardBin string

func TestMain(m *testing.M) {
	var err error
	if tools, err = harness.ToolsDir(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if guardBin, err = harness.GuardBinary(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

func scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(cmapi.AddToScheme(s))
	return s
}

// workDir is a folder for one test's cluster, guard and logs, kept (and its
// log's end printed) when the test fails.
func workDir(t *testing.T) (string, *os.File) {
	t.Helper()
	dir, err := os.MkdirTemp("", "deployguard-tls-")
	require.NoError(t, err)
	log, err := os.Create(filepath.Join(dir, "test.log"))
	require.NoError(t, err)
	t.Cleanup(func() {
		log.Close()
		if t.Failed() {
			b, _ := os.ReadFile(log.Name())
			if len(b) > 15000 {
				b = b[len(b)-15000:]
			}
			t.Logf("work folder kept: %s\n--- end of %s ---\n%s", dir, log.Name(), b)
			return
		}
		os.RemoveAll(dir)
	})
	return dir, log
}

// loadConfig is the admin configuration without client-side rate limits: the
// load must reach the API server at the rate asked.
func loadConfig(t *testing.T, cfg *rest.Config) *rest.Config {
	t.Helper()
	c := rest.CopyConfig(cfg)
	c.QPS, c.Burst = 2000, 4000
	return c
}

func newNamespace(ctx context.Context, t *testing.T, c client.Client, name string) string {
	t.Helper()
	require.NoError(t, c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}))
	return name
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
// an operator (or a broken injector) would.
func setBundle(ctx context.Context, t *testing.T, c client.Client, bundle []byte) {
	t.Helper()
	m := &admissionregistrationv1.MutatingWebhookConfiguration{}
	require.NoError(t, c.Get(ctx, client.ObjectKey{Name: "deployguard-mutating"}, m))
	for i := range m.Webhooks {
		m.Webhooks[i].ClientConfig.CABundle = bundle
	}
	require.NoError(t, c.Update(ctx, m))
	v := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	require.NoError(t, c.Get(ctx, client.ObjectKey{Name: "deployguard-validating"}, v))
	for i := range v.Webhooks {
		v.Webhooks[i].ClientConfig.CABundle = bundle
	}
	require.NoError(t, c.Update(ctx, v))
}

// readyzStatus is the guard's /readyz status code (0 when it does not answer).
func readyzStatus(g *harness.Guard) int {
	code, _, err := g.Get(g.ProbeAddr, "/readyz")
	if err != nil {
		return 0
	}
	return code
}
