package webhook

import (
	"context"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/deployguard/deployguard/policy"
	"github.com/deployguard/deployguard/reconciler/vocab"
)

// testOptions are the options of a default install: the API server's own
// defaults, no cleanup steps unless a Deployment asks.
func testOptions() *Options {
	return &Options{
		StableLabelKeys:         []string{"app.kubernetes.io/name", "app.kubernetes.io/instance", "app"},
		MaxSurge:                intstr.FromString("25%"),
		MaxUnavailable:          intstr.FromString("25%"),
		RevisionHistoryLimit:    10,
		ProgressDeadlineSeconds: 600,
		RevisionHistoryBounds:   Range{Min: 1, Max: 100},
		ProgressDeadlineBounds:  Range{Min: 30, Max: 7200},
		GuardUsername:           "system:serviceaccount:deployguard-system:deployguard",
		BreakGlassGroups:        []string{"platform-admins"},
		Quarantine:              QuarantineEnforce,
	}
}

// stored returns a Deployment as the API server hands it to the mutating
// webhook: built-in defaults applied.
func stored(mut ...func(*appsv1.Deployment)) *appsv1.Deployment {
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr(int32(3)),
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
	APIServerDefaults(d)
	for _, m := range mut {
		m(d)
	}
	return d
}

// guarded is a stored Deployment that asks for the guard's cleanup, after the
// mutating webhook.
func guarded(mut ...func(*appsv1.Deployment)) *appsv1.Deployment {
	d := stored()
	d.Annotations = map[string]string{vocab.AnnotationCleanup: "record,drain"}
	if _, errs := Default(d, nil, testOptions(), false); len(errs) > 0 {
		panic(errs)
	}
	for _, m := range mut {
		m(d)
	}
	return d
}

// indexOf is the index the webhook uses, holding ds.
func indexOf(ds ...*appsv1.Deployment) OverlapSource {
	x := NewOverlapIndex(nil)
	for _, d := range ds {
		x.Set(d)
	}
	return x
}

type overlapsFunc func(ctx context.Context, d *appsv1.Deployment) ([]Selection, error)

func (f overlapsFunc) OverlapCandidates(ctx context.Context, d *appsv1.Deployment) ([]Selection, error) {
	return f(ctx, d)
}

type policyFunc func(in policy.Request) policy.Decision

func (f policyFunc) Evaluate(_ context.Context, in policy.Request) (policy.Decision, error) {
	return f(in), nil
}

func deploymentIn(ns, name string, replicas int32, podLabels map[string]string) *appsv1.Deployment {
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: podLabels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: podLabels}},
		},
	}
}

func pdbIn(namespace, name string, sel *metav1.LabelSelector, minAvailable *intstr.IntOrString) *policyv1.PodDisruptionBudget {
	return &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec:       policyv1.PodDisruptionBudgetSpec{Selector: sel, MinAvailable: minAvailable},
	}
}
