// Package reviewtest holds the fixtures the tests of the review and of its
// callers share: a default install's options, Deployments as the API server
// hands them to the webhooks, and small stand-ins for the review's sources.
package reviewtest

import (
	"context"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/deployguard/deployguard/policy"
	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/webhook/review"
)

// Options are the options of a default install: the API server's own
// defaults, no cleanup steps unless a Deployment asks.
func Options() *review.Options {
	return &review.Options{
		StableLabelKeys:         []string{"app.kubernetes.io/name", "app.kubernetes.io/instance", "app"},
		MaxSurge:                intstr.FromString("25%"),
		MaxUnavailable:          intstr.FromString("25%"),
		RevisionHistoryLimit:    10,
		ProgressDeadlineSeconds: 600,
		RevisionHistoryBounds:   review.Range{Min: 1, Max: 100},
		ProgressDeadlineBounds:  review.Range{Min: 30, Max: 7200},
		GuardUsername:           "system:serviceaccount:deployguard-system:deployguard",
		BreakGlassGroups:        []string{"platform-admins"},
		Quarantine:              review.QuarantineEnforce,
	}
}

// Stored returns a Deployment as the API server hands it to the mutating
// webhook: built-in defaults applied.
func Stored(mut ...func(*appsv1.Deployment)) *appsv1.Deployment {
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(int32(3)),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": "web"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app.kubernetes.io/name": "web", "version": "v1"}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name: "web", Image: "nginx:1.27.3",
					ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/", Port: intstr.FromInt32(80)}}},
				}}},
			},
		},
	}
	review.APIServerDefaults(d)
	for _, m := range mut {
		m(d)
	}
	return d
}

// Guarded is a stored Deployment that asks for the guard's cleanup, after the
// mutating webhook.
func Guarded(mut ...func(*appsv1.Deployment)) *appsv1.Deployment {
	d := Stored()
	d.Annotations = map[string]string{vocab.AnnotationCleanup: "record,drain"}
	if _, errs := review.Default(d, nil, Options(), false); len(errs) > 0 {
		panic(errs)
	}
	for _, m := range mut {
		m(d)
	}
	return d
}

// Index is the index the webhook uses, holding ds.
func Index(ds ...*appsv1.Deployment) review.OverlapSource {
	x := review.NewOverlapIndex(nil)
	for _, d := range ds {
		x.Set(d)
	}
	return x
}

// OverlapsFunc finds the candidates of the overlap check.
type OverlapsFunc func(ctx context.Context, d *appsv1.Deployment) ([]review.Selection, error)

// OverlapCandidates implements review.OverlapSource.
func (f OverlapsFunc) OverlapCandidates(ctx context.Context, d *appsv1.Deployment) ([]review.Selection, error) {
	return f(ctx, d)
}

// PoliciesFunc decides what the Rego policies would.
type PoliciesFunc func(in policy.Request) policy.Decision

// Evaluate implements review.Policies.
func (f PoliciesFunc) Evaluate(_ context.Context, in policy.Request) (policy.Decision, error) {
	return f(in), nil
}

// DeploymentIn is a Deployment of namespace ns with replicas and the
// template's labels as its selector.
func DeploymentIn(ns, name string, replicas int32, podLabels map[string]string) *appsv1.Deployment {
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: podLabels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: podLabels}},
		},
	}
}

// BudgetIn is a PodDisruptionBudget of namespace with a minAvailable.
func BudgetIn(namespace, name string, sel *metav1.LabelSelector, minAvailable *intstr.IntOrString) *policyv1.PodDisruptionBudget {
	return &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec:       policyv1.PodDisruptionBudgetSpec{Selector: sel, MinAvailable: minAvailable},
	}
}

// CriticalPolicy refuses, in mode, the deletion of a Deployment labelled
// tier: critical, as policy/README.md tells authors to write it: against
// oldObject.
func CriticalPolicy(name, mode string) policy.Source {
	return policy.Source{Name: name + ".rego", Module: `# METADATA
# custom:
#   mode: ` + mode + `
package deployguard.` + name + `

deny contains "a tier: critical Deployment may not be deleted: remove the label first if it is no longer critical" if {
	input.operation == "DELETE"
	input.oldObject.metadata.labels.tier == "critical"
}
`}
}

// OwnerPolicy refuses a Deployment without an owner label, in the way most
// policies are written: about input.object alone, which a DELETE has not.
var OwnerPolicy = policy.Source{Name: "owner.rego", Module: `package deployguard.owner

deny contains {"msg": "add an owner label", "field": "metadata.labels.owner"} if {
	not input.object.metadata.labels.owner
}
`}
