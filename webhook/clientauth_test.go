package webhook

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"math/big"
	"net"
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

// TestRefusalDoesNotWaitForTheBody: a client without a certificate that
// declares a body and stalls after a few bytes of it gets its 403 and the
// connection closed at once, whatever the path; Go's server would otherwise
// read the rest of the body, with no deadline, before answering (it reads
// up to 256 KiB of an unread body to reuse the connection), and hold the
// goroutine and the TLS connection for as long as the client liked.
func TestRefusalDoesNotWaitForTheBody(t *testing.T) {
	ca, _ := newCA(t, "webhook clients")
	srv := RequireClientOn(ctrlwebhook.NewServer(ctrlwebhook.Options{}), []string{"kube-apiserver"})
	reached := make(chan string, 8)
	srv.Register(MutatePath, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { reached <- r.URL.Path }))
	srv.Register("/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { reached <- r.URL.Path }))
	ts := httptest.NewUnstartedServer(srv.WebhookMux())
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	ts.TLS = &tls.Config{ClientCAs: pool, ClientAuth: tls.VerifyClientCertIfGiven, MinVersion: tls.VersionTLS12}
	ts.StartTLS()
	t.Cleanup(ts.Close)
	clientTLS := ts.Client().Transport.(*http.Transport).TLSClientConfig.Clone()

	tests := []struct {
		name    string
		path    string
		headers string // the body's framing
		body    string // all the client sends of it
	}{
		{name: "any path, 10 of 1000 bytes", path: "/anything", headers: "Content-Length: 1000\r\n", body: "0123456789"},
		{name: "an admission path, 10 of 1000 bytes", path: MutatePath, headers: "Content-Length: 1000\r\n", body: "0123456789"},
		{name: "chunked, one chunk and no end", path: "/anything", headers: "Transfer-Encoding: chunked\r\n", body: "a\r\n0123456789\r\n"},
		{name: "more declared than the server would read", path: "/anything", headers: "Content-Length: 2097152\r\n", body: "0123456789"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn, err := tls.Dial("tcp", ts.Listener.Addr().String(), clientTLS)
			require.NoError(t, err)
			defer conn.Close()
			// The test's own bound: reaching it is the failure.
			require.NoError(t, conn.SetDeadline(time.Now().Add(5*time.Second)))
			_, err = io.WriteString(conn, "POST "+tt.path+" HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\n"+tt.headers+"\r\n"+tt.body)
			require.NoError(t, err)

			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			require.NoError(t, err, "the 403 must not wait for the body")
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			require.NoError(t, err)
			assert.Equal(t, http.StatusForbidden, resp.StatusCode)
			assert.Contains(t, string(body), "a client certificate of the API server is required")
			assert.True(t, resp.Close, "the answer says the connection ends")

			_, err = br.ReadByte()
			var ne net.Error
			require.False(t, errors.As(err, &ne) && ne.Timeout(), "the server must close the connection, not wait for the body: %v", err)
			assert.ErrorIs(t, err, io.EOF)
			assert.Empty(t, reached, "no handler is reached")
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
