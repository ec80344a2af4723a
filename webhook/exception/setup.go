package exception

import (
	"context"
	"fmt"
	"net/http"

	"k8s.io/apimachinery/pkg/api/meta"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// SetupWithManager serves the PolicyException webhook on mgr's webhook
// server (wrapped by wrap, when set) and returns an index of the exceptions
// of namespace, fed by mgr's informer: an exception takes effect at
// admission as soon as the watch delivers it. Without the CRD it returns a
// nil index and says so: the guard runs without exceptions.
func SetupWithManager(ctx context.Context, mgr ctrl.Manager, namespace string, limits func() Limits, wrap func(http.Handler) http.Handler) (*Index, error) {
	var h http.Handler = &admission.Webhook{Handler: &Validator{Limits: limits}}
	if wrap != nil {
		h = wrap(h)
	}
	mgr.GetWebhookServer().Register(WebhookPath, h)
	gk := GroupVersion.WithKind(Kind).GroupKind()
	if _, err := mgr.GetRESTMapper().RESTMapping(gk, GroupVersion.Version); err != nil {
		if meta.IsNoMatchError(err) {
			ctrl.Log.WithName("setup").Info("the PolicyException CRD is not installed: no exceptions apply until it is and the guard restarts",
				"reason", "ExceptionsUnavailable")
			return nil, nil
		}
		return nil, fmt.Errorf("looking up the PolicyException API: %w", err)
	}
	idx := NewIndex(namespace)
	inf, err := mgr.GetCache().GetInformer(ctx, &PolicyException{})
	if err != nil {
		return nil, fmt.Errorf("getting the PolicyException informer: %w", err)
	}
	if err := idx.Feed(inf); err != nil {
		return nil, fmt.Errorf("indexing PolicyExceptions: %w", err)
	}
	return idx, nil
}
