package serve

import (
	"context"
	"fmt"
	"net/http"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/deployguard/deployguard/cmd/deployguard/config"
	"github.com/deployguard/deployguard/cmd/deployguard/leader"
	"github.com/deployguard/deployguard/policy"
	guardwebhook "github.com/deployguard/deployguard/webhook"
	"github.com/deployguard/deployguard/webhook/exception"
)

// setupExceptions serves the PolicyException webhook and indexes the
// exceptions of the configured namespace (nil without the CRD).
func setupExceptions(ctx context.Context, mgr ctrl.Manager, cfg config.Config, guardNamespace string, eng *policy.Engine, stop *gracefulStop) (*exception.Index, error) {
	return exception.SetupWithManager(ctx, mgr, cfg.ExceptionsNamespace(guardNamespace),
		func() exception.Limits { return cfg.ExceptionLimits(guardNamespace, config.PolicyNames(eng)) },
		func(h http.Handler) http.Handler { return stop.CloseConnections(guardwebhook.WithBodyTimeout(0, h)) })
}

// setupExceptionExpiry counts the exceptions by state on every replica and,
// on the leader, puts an Event on each as it nears its expiry and at it.
func setupExceptionExpiry(terms *leader.Terms, cfg config.Config, idx *exception.Index) error {
	if idx == nil {
		return nil
	}
	warning := cfg.Exceptions.ExpiryWarning.Duration
	if err := metrics.Registry.Register(&exception.Collector{Index: idx, Warning: warning}); err != nil {
		return fmt.Errorf("registering the exception metrics: %w", err)
	}
	terms.Setup = append(terms.Setup, func(_ context.Context, lm ctrl.Manager) error {
		return lm.Add(&exception.Notifier{Index: idx, Warning: warning,
			Recorder: lm.GetEventRecorder("deployguard"), Log: ctrl.Log.WithName("exceptions")})
	})
	return nil
}
