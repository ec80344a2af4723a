package webhook

import (
	"crypto/x509"
	"net/http"
	"slices"
	"time"

	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
)

// RequireClientOn returns srv with every handler registered on it, by
// whatever registers it (the Deployment webhooks, the PolicyException
// webhook, the not-found answer of every other path), behind
// RequireClient(names): no admission path of the port can be left out of
// the client certificate check. Only a handler put on srv.WebhookMux()
// directly is not; the guard puts none there.
func RequireClientOn(srv ctrlwebhook.Server, names []string) ctrlwebhook.Server {
	return clientServer{Server: srv, names: names}
}

type clientServer struct {
	ctrlwebhook.Server
	names []string
}

func (s clientServer) Register(path string, h http.Handler) {
	s.Server.Register(path, RequireClient(s.names, h))
}

// RequireClient answers 403, before anything else is done, every request
// whose TLS client did not present a certificate that the server verified
// against its client CA (tls.Config.ClientCAs, with
// tls.VerifyClientCertIfGiven), or one named by none of names (its subject's
// common name or a DNS name; any verified certificate when names is empty).
// The refusal closes the connection without reading the rest of the body
// (Refuse): it runs before any body deadline is set.
// Where the API server presents a client certificate to webhooks (its
// admission configuration's kubeconfig), only it then reaches the guard's
// admission code: a pod that can reach the port gets a refusal that costs a
// TLS handshake and nothing more. The handshake itself accepts clients
// without a certificate, so that the guard's own readiness check (a TLS dial
// of its port) stays quiet.
func RequireClient(names []string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || !clientNamed(r.TLS.VerifiedChains[0][0], names) {
			Refuse(w, r, http.StatusForbidden, "deployguard: a client certificate of the API server is required")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// Refuse answers code with msg and ends the connection without reading
// what is left of the request's body. Left to itself, Go's server reads up
// to 256 KiB of an unread body after the handler, to reuse the connection,
// before it even writes the answer, and a server without ReadTimeout (the
// webhook and metrics servers have only ReadHeaderTimeout) reads it with no
// deadline: a client that declares a body and stalls would hold the
// goroutine and its TLS connection for good. "Connection: close" stops the
// read before the answer; a read deadline already past stops the one when
// the body is closed after the handler, which happens regardless.
func Refuse(w http.ResponseWriter, r *http.Request, code int, msg string) {
	w.Header().Set("Connection", "close")
	if r.Body != nil && r.Body != http.NoBody {
		// ErrNotSupported only where there is no connection (a recorder).
		_ = http.NewResponseController(w).SetReadDeadline(time.Now())
	}
	http.Error(w, msg, code)
}

func clientNamed(c *x509.Certificate, names []string) bool {
	if len(names) == 0 {
		return true
	}
	if slices.Contains(names, c.Subject.CommonName) {
		return true
	}
	for _, n := range c.DNSNames {
		if slices.Contains(names, n) {
			return true
		}
	}
	return false
}
