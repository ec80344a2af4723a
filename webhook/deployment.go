package webhook

import (
	"context"

	appsv1 "k8s.io/api/apps/v1"
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
}

const namespaceControllerUser = "system:serviceaccount:kube-system:namespace-controller"
