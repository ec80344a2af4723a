package checkadmission

import (
	"net/http"

	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/deployguard/deployguard/webhook/bodylimit"
	"github.com/deployguard/deployguard/webhook/boundedlog"
)

// Register serves the webhook at WebhookPath on server, wrapped by wrap
// when set (serve wraps it as the PolicyException webhook: the body
// time-out and the graceful stop's connection closing; the client
// certificate check, when configured, is the server's own). Without the
// CRDs nothing calls it, so it needs no discovery.
func Register(server ctrlwebhook.Server, wrap func(http.Handler) http.Handler) {
	// Every line it logs is bounded, and a body it would read as YAML, or
	// too large, is refused first: the request's bytes are the client's.
	h := bodylimit.Handler(&admission.Webhook{Handler: Validator{}, LogConstructor: boundedlog.Constructor})
	if wrap != nil {
		h = wrap(h)
	}
	server.Register(WebhookPath, h)
}
