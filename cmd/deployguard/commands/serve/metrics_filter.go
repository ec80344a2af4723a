package serve

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/apis/apiserver"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	authenticationv1 "k8s.io/client-go/kubernetes/typed/authentication/v1"
	authorizationv1 "k8s.io/client-go/kubernetes/typed/authorization/v1"
	"k8s.io/client-go/rest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	guardwebhook "github.com/deployguard/deployguard/webhook"
)

const (
	// maxMetricsAuthorization is the longest Authorization header the
	// metrics filter sends to the API server (a ServiceAccount token is
	// about 1 KiB; the header may hold 1 MiB): longer is 401 at once.
	maxMetricsAuthorization = 8 << 10
	// metricsAuthSlots is how many metrics requests may be authenticated
	// and authorized at once (each may cost a TokenReview and a
	// SubjectAccessReview); past it a request is 429, never queued.
	metricsAuthSlots = 16
)

// metricsAuthFilter is controller-runtime's metrics/filters
// WithAuthenticationAndAuthorization (same TokenReview and
// SubjectAccessReview delegation, caches and back-off) but for one answer:
// a bearer token the API server does not accept is 401, as the API server
// itself answers it, where controller-runtime answers 500 and logs an error
// with its stack trace. Anyone who reaches the port may send tokens: what
// they send must cost a refusal, not an error line each (metricsFilter says
// what else bounds it).
func metricsAuthFilter(config *rest.Config, httpClient *http.Client) (metricsserver.Filter, error) {
	authn, err := authenticationv1.NewForConfigAndClient(config, httpClient)
	if err != nil {
		return nil, err
	}
	authz, err := authorizationv1.NewForConfigAndClient(config, httpClient)
	if err != nil {
		return nil, err
	}
	// The API server's own retry back-off for its webhook authenticators.
	backoff := &wait.Backoff{Duration: 500 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Steps: 5}
	authenticator, _, err := authenticatorfactory.DelegatingAuthenticatorConfig{
		Anonymous:                &apiserver.AnonymousAuthConfig{Enabled: false},
		CacheTTL:                 time.Minute,
		TokenAccessReviewClient:  authn,
		TokenAccessReviewTimeout: 10 * time.Second,
		WebhookRetryBackoff:      backoff,
	}.New()
	if err != nil {
		return nil, fmt.Errorf("creating the metrics authenticator: %w", err)
	}
	authorizerOf, err := authorizerfactory.DelegatingAuthorizerConfig{
		SubjectAccessReviewClient: authz,
		AllowCacheTTL:             5 * time.Minute,
		DenyCacheTTL:              30 * time.Second,
		WebhookRetryBackoff:       backoff,
	}.New()
	if err != nil {
		return nil, fmt.Errorf("creating the metrics authorizer: %w", err)
	}
	return metricsFilter(authenticator, authorizerOf, metricsAuthSlots), nil
}

// metricsFilter puts handler behind authn and authz, with what a caller who
// is not yet known can cost bounded: an Authorization header longer than
// maxMetricsAuthorization is 401 without a TokenReview (each distinct token
// is one); at most slots requests are authenticated and authorized at once,
// and past them a request is 429 with Retry-After: 1, not queued; every
// refusal closes the connection without reading the body
// (guardwebhook.Refuse), and a body is given DefaultBodyTimeout to arrive
// (the server has no ReadTimeout).
func metricsFilter(authn authenticator.Request, authz authorizer.Authorizer, slots int) metricsserver.Filter {
	sem := make(chan struct{}, slots)
	return func(log logr.Logger, handler http.Handler) (http.Handler, error) {
		return guardwebhook.WithBodyTimeout(0, http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			n := 0
			for _, v := range req.Header.Values("Authorization") {
				n += len(v)
			}
			if n > maxMetricsAuthorization {
				log.V(4).Info("Metrics request not authenticated", "reason", "Authorization header too long", "bytes", n)
				guardwebhook.Refuse(w, req, http.StatusUnauthorized, "Unauthorized")
				return
			}
			select {
			case sem <- struct{}{}:
			default:
				w.Header().Set("Retry-After", "1")
				guardwebhook.Refuse(w, req, http.StatusTooManyRequests, "Too many metrics requests being authorized")
				return
			}
			allowed := func() bool {
				defer func() { <-sem }()
				return authorizeMetrics(log, authn, authz, w, req)
			}()
			if allowed {
				handler.ServeHTTP(w, req)
			}
		})), nil
	}
}

// authorizeMetrics reports whether the API server vouches for req's caller
// and lets it read req's path; when not, it has answered req.
func authorizeMetrics(log logr.Logger, authn authenticator.Request, authz authorizer.Authorizer, w http.ResponseWriter, req *http.Request) bool {
	res, ok, err := authn.AuthenticateRequest(req)
	if err != nil || !ok {
		// No token, or one the API server did not vouch for (the
		// TokenReview said no, or could not be made: either way the
		// caller is not known).
		log.V(4).Info("Metrics request not authenticated", "reason", fmt.Sprint(err))
		guardwebhook.Refuse(w, req, http.StatusUnauthorized, "Unauthorized")
		return false
	}
	attrs := authorizer.AttributesRecord{User: res.User, Verb: strings.ToLower(req.Method), Path: req.URL.Path}
	decision, reason, err := authz.Authorize(req.Context(), attrs)
	if err != nil {
		log.Error(err, "Authorizing a metrics request failed", "user", res.User.GetName())
		guardwebhook.Refuse(w, req, http.StatusInternalServerError, "Authorization failed")
		return false
	}
	if decision != authorizer.DecisionAllow {
		log.V(4).Info("Metrics request forbidden", "user", res.User.GetName(), "reason", reason)
		guardwebhook.Refuse(w, req, http.StatusForbidden, fmt.Sprintf("Authorization denied for user %s", res.User.GetName()))
		return false
	}
	return true
}
