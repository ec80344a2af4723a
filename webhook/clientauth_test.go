package webhook

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/deployguard/deployguard/webhook/exception"
	"github.com/deployguard/deployguard/webhook/review"
	"github.com/deployguard/deployguard/webhook/review/reviewtest"
)

// TestEveryPathRequiresTheClientCertificate: with the check on the server
// (RequireClientOn, as serve wires --client-ca-file), every path the guard's
// webhooks register, the PolicyException webhook's included, answers 403 to
// a client without the API server's certificate before any admission work,
// and reaches its handler with it.
func TestEveryPathRequiresTheClientCertificate(t *testing.T) {
	ca, caKey := newCA(t, "webhook clients")
	other, otherKey := newCA(t, "someone else")
	var paths []string
	srv := RequireClientOn(recordingServer{Server: ctrlwebhook.NewServer(ctrlwebhook.Options{}), paths: &paths}, []string{"kube-apiserver"})
	mgr := webhookManager{server: srv}
	hooks := &Hooks{Reviewer: &review.Reviewer{Options: reviewtest.Options(), Budgets: review.NewBudgetIndex(nil)}, ServeVerdicts: true}
	hooks.SetupWithManager(mgr, nil, nil)
	_, err := exception.SetupWithManager(context.Background(), mgr, "deployguard-system",
		func() exception.Limits { return exception.Limits{MaxDuration: time.Hour} }, nil)
	require.NoError(t, err)
	srv.Register("/", http.NotFoundHandler()) // as serve answers every other path
	require.ElementsMatch(t, []string{MutatePath, ValidatePath, VerdictPath, BudgetPath, exception.WebhookPath, "/"}, paths)

	ts := httptest.NewUnstartedServer(srv.WebhookMux())
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	ts.TLS = &tls.Config{ClientCAs: pool, ClientAuth: tls.VerifyClientCertIfGiven, MinVersion: tls.VersionTLS12}
	ts.StartTLS()
	t.Cleanup(ts.Close)

	tests := []struct {
		name       string
		cert       *tls.Certificate
		wantRefuse bool
	}{
		{name: "no certificate", wantRefuse: true},
		{name: "a certificate of another name", cert: clientCert(t, ca, caKey, "a pod"), wantRefuse: true},
		// Go's client offers no certificate that the server's accepted CAs
		// did not issue: as none.
		{name: "a certificate of another CA", cert: clientCert(t, other, otherKey, "kube-apiserver"), wantRefuse: true},
		{name: "the API server's certificate", cert: clientCert(t, ca, caKey, "kube-apiserver")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := ts.Client().Transport.(*http.Transport).Clone()
			if tt.cert != nil {
				tr.TLSClientConfig.Certificates = []tls.Certificate{*tt.cert}
			}
			hc := &http.Client{Transport: tr, Timeout: 10 * time.Second}
			defer tr.CloseIdleConnections()
			for _, path := range paths {
				resp, err := hc.Post(ts.URL+path, "application/json", strings.NewReader(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"1","operation":"CREATE"}}`))
				require.NoError(t, err, path)
				body, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				require.NoError(t, err)
				if tt.wantRefuse {
					assert.Equal(t, http.StatusForbidden, resp.StatusCode, path)
					assert.Contains(t, string(body), "a client certificate of the API server is required", path)
				} else {
					assert.NotEqual(t, http.StatusForbidden, resp.StatusCode, "%s: %s", path, body)
				}
			}
		})
	}
}

// recordingServer records every path registered on it.
type recordingServer struct {
	ctrlwebhook.Server
	paths *[]string
}

func (s recordingServer) Register(path string, h http.Handler) {
	*s.paths = append(*s.paths, path)
	s.Server.Register(path, h)
}

// webhookManager is what the webhooks' setup reads of a manager: its webhook
// server, and a REST mapper that serves no PolicyException API (so the
// exception webhook is registered and no informer is started).
type webhookManager struct {
	ctrl.Manager
	server ctrlwebhook.Server
}

func (m webhookManager) GetWebhookServer() ctrlwebhook.Server { return m.server }
func (m webhookManager) GetRESTMapper() meta.RESTMapper       { return meta.NewDefaultRESTMapper(nil) }

func newCA(t *testing.T, name string) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	ca, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return ca, key
}

func clientCert(t *testing.T, ca *x509.Certificate, caKey *ecdsa.PrivateKey, name string) *tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, ca, &key.PublicKey, caKey)
	require.NoError(t, err)
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
