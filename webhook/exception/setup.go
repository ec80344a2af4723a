package exception

import (
	"context"
	"fmt"
	"net/http"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/deployguard/deployguard/webhook/bodylimit"
	"github.com/deployguard/deployguard/webhook/boundedlog"
)

// SetupWithManager serves the PolicyException webhook on mgr's webhook
// server (wrapped by wrap, when set; the client certificate check, when
// configured, is the server's own: webhook.RequireClientOn) and returns an
// index of the exceptions of namespace, fed by mgr's informer: an exception
// takes effect at admission as soon as the watch delivers it. Without the CRD it returns a
// nil index and says so: the guard runs without exceptions.
func SetupWithManager(ctx context.Context, mgr ctrl.Manager, namespace string, limits func() Limits, wrap func(http.Handler) http.Handler) (*Index, error) {
	// Every line it logs is bounded, and a body it would read as YAML, or
	// too large, is refused first: the request's bytes are the client's.
	h := bodylimit.Handler(&admission.Webhook{Handler: &Validator{Limits: limits}, LogConstructor: boundedlog.Constructor})
	if wrap != nil {
		h = wrap(h)
	}
	mgr.GetWebhookServer().Register(WebhookPath, h)
	gk := GroupVersion.WithKind(Kind).GroupKind()
	if _, err := mgr.GetRESTMapper().RESTMapping(gk, GroupVersion.Version); err != nil {
		// Never a reason not to guard Deployments.
		ctrl.Log.WithName("setup").Info("the PolicyException API is not served: no exceptions apply until the CRD is installed and the guard restarts",
			"reason", "ExceptionsUnavailable", "error", err.Error())
		return nil, nil
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

// Served reports whether the API server serves PolicyExceptions: the
// guard runs without exceptions otherwise, and with them after a restart
// once the CRD is installed.
func Served(cfg *rest.Config) bool {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return false
	}
	list, err := dc.ServerResourcesForGroupVersion(GroupVersion.String())
	if err != nil {
		return false
	}
	for _, r := range list.APIResources {
		if r.Name == "policyexceptions" {
			return true
		}
	}
	return false
}

// ListOnce reads the PolicyExceptions of namespace once, for the commands
// that run outside the guard (audit, check). served is false when the API
// server does not serve PolicyExceptions: then there are none to apply.
func ListOnce(ctx context.Context, c client.Reader, namespace string) (items []PolicyException, served bool, err error) {
	var list PolicyExceptionList
	if err := c.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		if meta.IsNoMatchError(err) || apierrors.IsNotFound(err) {
			return nil, false, nil
		}
		return nil, true, fmt.Errorf("listing the PolicyExceptions of %s: %w", namespace, err)
	}
	return list.Items, true, nil
}
