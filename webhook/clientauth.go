package webhook

import (
	"crypto/x509"
	"net/http"
	"slices"

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
// Where the API server presents a client certificate to webhooks (its
// admission configuration's kubeconfig), only it then reaches the guard's
// admission code: a pod that can reach the port gets a refusal that costs a
// TLS handshake and nothing more. The handshake itself accepts clients
// without a certificate, so that the guard's own readiness check (a TLS dial
// of its port) stays quiet.
func RequireClient(names []string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || !clientNamed(r.TLS.VerifiedChains[0][0], names) {
			http.Error(w, "deployguard: a client certificate of the API server is required", http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
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
