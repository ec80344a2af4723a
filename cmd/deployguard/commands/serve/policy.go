package serve

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/deployguard/deployguard/cmd/deployguard/cli"
	"github.com/deployguard/deployguard/cmd/deployguard/config"
	"github.com/deployguard/deployguard/cmd/deployguard/health"
	"github.com/deployguard/deployguard/policy"
	"github.com/deployguard/deployguard/reconciler/vocab"
)

// annotationPolicyError holds a rejected policy ConfigMap's errors.
const annotationPolicyError = vocab.Domain + "/policy-error"

// setupPolicies loads the policies and keeps them in step with the labelled
// ConfigMaps of the guard's namespace (hot reload, no restart). loaded
// reports whether the ConfigMaps' policies are in the set yet.
func setupPolicies(ctx context.Context, mgr ctrl.Manager, pr *health.Probes, reg prometheus.Registerer, cfg config.Config, dir, namespace string) (eng *policy.Engine, loaded func() bool, err error) {
	eng, base, err := cli.NewPolicyEngine(ctx, cfg, dir)
	if err != nil {
		return nil, nil, err
	}
	for _, c := range eng.Collectors() {
		if err := reg.Register(c); err != nil {
			return nil, nil, fmt.Errorf("registering policy metrics: %w", err)
		}
	}
	src := &policy.ConfigMapSource{
		Engine: eng, Base: base, Namespace: namespace,
		LabelKey: vocab.LabelPolicy, ErrorAnnotation: annotationPolicyError,
	}
	if err := src.SetupWithManager(mgr); err != nil {
		return nil, nil, fmt.Errorf("watching policy ConfigMaps: %w", err)
	}
	if err := pr.AddReadyzCheck("policies", src.Ready); err != nil {
		return nil, nil, err
	}
	return eng, func() bool { return src.Ready(nil) == nil }, nil
}
