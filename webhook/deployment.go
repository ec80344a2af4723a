package webhook

import (
	"context"
	"time"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/deployguard/deployguard/webhook/exception"
)

var deploymentGK = appsv1.SchemeGroupVersion.WithKind("Deployment").GroupKind()

// Deployment is the admission webhook pair for apps/v1 Deployments, and the
// one review (Review) that the webhooks, `deployguard check` and the audit
// all run.
type Deployment struct {
	Options *Options
	// Overlaps finds the namespace's Deployments the overlap check compares
	// with; nil skips the check.
	Overlaps OverlapSource
	// Policies, when set, runs the Rego policies after the Go checks.
	Policies Policies
	// NamespaceLabels, when set, gives policies the namespace's labels.
	NamespaceLabels func(ctx context.Context, namespace string) (map[string]string, error)
	// Exceptions, when set, finds the PolicyExceptions that cover a
	// Deployment: what they exempt only warns, naming them.
	Exceptions Exceptions
	// Budgets, when set, finds the PodDisruptionBudgets that select a
	// Deployment's pods, for the drain check, and serves the budgets' webhook.
	Budgets BudgetSource
	// ServeVerdicts serves the status webhook that ends the rollback verdict
	// (VerdictPath).
	ServeVerdicts bool
	// Now is the clock exceptions expire by; nil is time.Now.
	Now func() time.Time
	// BodyTimeout bounds how long each webhook request's body may take to
	// arrive; zero is DefaultBodyTimeout.
	BodyTimeout time.Duration
}

// Exceptions finds the PolicyExceptions active at now that cover d.
type Exceptions interface {
	Covering(d *appsv1.Deployment, now time.Time) []*exception.Exception
}
