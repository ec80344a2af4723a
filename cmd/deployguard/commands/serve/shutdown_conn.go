package serve

import "net/http"

// CloseConnections wraps a webhook handler: once the stop signal has come,
// every response tells the client to close its connection after reading it.
// The API server keeps its connections to a replica open between requests,
// and a load balancer (or kube-proxy) in TCP mode keeps them pinned to that
// replica after it left the endpoints. Without this, the drain at the end of
// the shutdown delay closes those idle connections itself, and a request the
// API server writes on one at that moment fails with "server closed idle
// connection" (it does not retry a POST). With it, each connection the API
// server uses during the delay is retired by the API server itself, and the
// next request opens a new one, to a replica still in the endpoints.
func (g *gracefulStop) CloseConnections(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if g.stopping.Load() {
			w.Header().Set("Connection", "close")
		}
		next.ServeHTTP(w, r)
	})
}
