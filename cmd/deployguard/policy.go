package main

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/deployguard/deployguard/cmd/deployguard/config"
	"github.com/deployguard/deployguard/policy"
	"github.com/deployguard/deployguard/reconciler/vocab"
)

// annotationPolicyError holds a rejected policy ConfigMap's errors.
const annotationPolicyError = vocab.Domain + "/policy-error"

// newPolicyEngine builds the engine from the config file and loads the
// built-in library (less what the file switches off) and the policy directory.
// serve and check share it, so that both apply the same policies.
func newPolicyEngine(ctx context.Context, cfg config.Config, dir string) (*policy.Engine, []policy.Source, error) {
	opts, err := cfg.PolicyOptions()
	if err != nil {
		return nil, nil, err
	}
	eng, err := policy.New(opts)
	if err != nil {
		return nil, nil, err
	}
	base := policy.Builtins()
	if dir != "" {
		fromDir, err := policy.FromDir(dir)
		if err != nil {
			return nil, nil, fmt.Errorf("reading policies from %s: %w", dir, err)
		}
		base = append(base, fromDir...)
	}
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := eng.Load(lctx, base); err != nil {
		return nil, nil, fmt.Errorf("loading policies: %w", err)
	}
	return eng, base, nil
}

// setupPolicies loads the policies and keeps them in step with the labelled
// ConfigMaps of the guard's namespace (hot reload, no restart).
func setupPolicies(ctx context.Context, mgr ctrl.Manager, pr *probes, reg prometheus.Registerer, cfg config.Config, dir, namespace string) (*policy.Engine, error) {
	eng, base, err := newPolicyEngine(ctx, cfg, dir)
	if err != nil {
		return nil, err
	}
	for _, c := range eng.Collectors() {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering policy metrics: %w", err)
		}
	}
	src := &policy.ConfigMapSource{
		Engine: eng, Base: base, Namespace: namespace,
		LabelKey: vocab.LabelPolicy, ErrorAnnotation: annotationPolicyError,
	}
	if err := src.SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("watching policy ConfigMaps: %w", err)
	}
	if err := pr.AddReadyzCheck("policies", src.Ready); err != nil {
		return nil, err
	}
	return eng, nil
}
