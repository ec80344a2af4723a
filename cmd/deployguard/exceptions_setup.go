package main

import (
	"context"

	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/deployguard/deployguard/cmd/deployguard/config"
	"github.com/deployguard/deployguard/policy"
	"github.com/deployguard/deployguard/webhook/exception"
)

// setupExceptions serves the PolicyException webhook and indexes the
// exceptions of the configured namespace (nil without the CRD).
func setupExceptions(ctx context.Context, mgr ctrl.Manager, cfg config.Config, guardNamespace string, eng *policy.Engine, stop *gracefulStop) (*exception.Index, error) {
	return exception.SetupWithManager(ctx, mgr, cfg.ExceptionsNamespace(guardNamespace),
		func() exception.Limits { return cfg.ExceptionLimits(guardNamespace, config.PolicyNames(eng)) }, stop.CloseConnections)
}
