package webhook

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/deployguard/deployguard/reconciler/vocab"
)

func testOptions() *Options {
	return &Options{
		StableLabelKeys:         []string{"app.kubernetes.io/name", "app.kubernetes.io/instance", "app"},
		MaxSurge:                intstr.FromString("25%"),
		MaxUnavailable:          intstr.FromInt32(0),
		RevisionHistoryLimit:    10,
		ProgressDeadlineSeconds: 600,
		AddFinalizers:           true,
		RevisionHistoryBounds:   Range{Min: 2, Max: 100},
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

func TestDefault(t *testing.T) {
	tests := []struct {
		name        string
		in          *appsv1.Deployment
		old         *appsv1.Deployment
		opts        func(*Options)
		wantChanged []string
		wantErr     string
		check       func(t *testing.T, d *appsv1.Deployment)
	}{
		{
			name:        "built-in defaults are replaced by the cluster's, finalizers added",
			in:          stored(),
			wantChanged: []string{defaultedMaxUnavailable, defaultedFinalizers},
			check: func(t *testing.T, d *appsv1.Deployment) {
				assert.Equal(t, intstr.FromInt32(0), *d.Spec.Strategy.RollingUpdate.MaxUnavailable)
				assert.Equal(t, intstr.FromString("25%"), *d.Spec.Strategy.RollingUpdate.MaxSurge)
				assert.Equal(t, vocab.CanonicalFinalizers(), d.Finalizers)
				assert.Equal(t, "spec.strategy.rollingUpdate.maxUnavailable,metadata.finalizers", d.Annotations[vocab.AnnotationDefaulted])
			},
		},
		{
			name: "explicit values other than the built-in defaults are kept",
			in: stored(func(d *appsv1.Deployment) {
				d.Spec.Strategy.RollingUpdate.MaxUnavailable = ptr(intstr.FromInt32(1))
				d.Spec.Strategy.RollingUpdate.MaxSurge = ptr(intstr.FromInt32(2))
				d.Spec.RevisionHistoryLimit = ptr(int32(5))
				d.Spec.ProgressDeadlineSeconds = ptr(int32(120))
				d.Finalizers = vocab.CanonicalFinalizers()
			}),
			wantChanged: nil,
			check: func(t *testing.T, d *appsv1.Deployment) {
				assert.Equal(t, intstr.FromInt32(1), *d.Spec.Strategy.RollingUpdate.MaxUnavailable)
				assert.Equal(t, int32(5), *d.Spec.RevisionHistoryLimit)
				assert.Equal(t, int32(120), *d.Spec.ProgressDeadlineSeconds)
				assert.NotContains(t, d.Annotations, vocab.AnnotationDefaulted)
			},
		},
		{
			name: "values equal to the built-in defaults count as not chosen",
			in:   stored(func(d *appsv1.Deployment) { d.Finalizers = vocab.CanonicalFinalizers() }),
			opts: func(o *Options) {
				o.RevisionHistoryLimit, o.ProgressDeadlineSeconds = 20, 300
			},
			wantChanged: []string{defaultedMaxUnavailable, defaultedRevisionHistory, defaultedProgressDeadline},
			check: func(t *testing.T, d *appsv1.Deployment) {
				assert.Equal(t, int32(20), *d.Spec.RevisionHistoryLimit)
				assert.Equal(t, int32(300), *d.Spec.ProgressDeadlineSeconds)
			},
		},
		{
			name: "revision history below the rollback floor is raised",
			in: stored(func(d *appsv1.Deployment) {
				d.Spec.RevisionHistoryLimit = ptr(int32(0))
				d.Finalizers = vocab.CanonicalFinalizers()
			}),
			wantChanged: []string{defaultedMaxUnavailable, defaultedRevisionHistory},
			check: func(t *testing.T, d *appsv1.Deployment) {
				assert.Equal(t, int32(2), *d.Spec.RevisionHistoryLimit)
			},
		},
		{
			name: "empty selector is repaired from stable labels only",
			in: stored(func(d *appsv1.Deployment) {
				d.Spec.Selector = nil
				d.Spec.Template.Labels = map[string]string{"app.kubernetes.io/name": "web", "app.kubernetes.io/instance": "prod", "version": "v2", "pod-template-hash": "x"}
			}),
			wantChanged: []string{defaultedSelector, defaultedMaxUnavailable, defaultedFinalizers},
			check: func(t *testing.T, d *appsv1.Deployment) {
				assert.Equal(t, map[string]string{"app.kubernetes.io/name": "web", "app.kubernetes.io/instance": "prod"}, d.Spec.Selector.MatchLabels)
			},
		},
		{
			name: "selector with no terms counts as empty",
			in: stored(func(d *appsv1.Deployment) {
				d.Spec.Selector = &metav1.LabelSelector{}
				d.Spec.Template.Labels = map[string]string{"app": "legacy"}
			}),
			wantChanged: []string{defaultedSelector, defaultedMaxUnavailable, defaultedFinalizers},
			check: func(t *testing.T, d *appsv1.Deployment) {
				assert.Equal(t, map[string]string{"app": "legacy"}, d.Spec.Selector.MatchLabels)
			},
		},
		{
			name: "empty selector with no stable label is refused with the labels to add",
			in: stored(func(d *appsv1.Deployment) {
				d.Spec.Selector = nil
				d.Spec.Template.Labels = map[string]string{"version": "v3"}
			}),
			wantErr: "Add one to spec.template.metadata.labels (for example app.kubernetes.io/name: web)",
		},
		{
			name: "user's maxSurge 0 keeps a non-zero maxUnavailable",
			in: stored(func(d *appsv1.Deployment) {
				d.Spec.Strategy.RollingUpdate.MaxSurge = ptr(intstr.FromInt32(0))
				d.Finalizers = vocab.CanonicalFinalizers()
			}),
			wantChanged: nil,
			check: func(t *testing.T, d *appsv1.Deployment) {
				assert.Equal(t, intstr.FromString("25%"), *d.Spec.Strategy.RollingUpdate.MaxUnavailable)
			},
		},
		{
			name: "Recreate is left alone",
			in: stored(func(d *appsv1.Deployment) {
				d.Spec.Strategy = appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType}
				d.Finalizers = vocab.CanonicalFinalizers()
			}),
			wantChanged: nil,
			check: func(t *testing.T, d *appsv1.Deployment) {
				assert.Nil(t, d.Spec.Strategy.RollingUpdate)
			},
		},
		{
			name: "finalizers are put in canonical order after others",
			in: stored(func(d *appsv1.Deployment) {
				d.Finalizers = []string{vocab.FinalizerRecord, "example.com/keep"}
			}),
			wantChanged: []string{defaultedMaxUnavailable, defaultedFinalizers},
			check: func(t *testing.T, d *appsv1.Deployment) {
				assert.Equal(t, []string{"example.com/keep", vocab.FinalizerDrain, vocab.FinalizerRecord}, d.Finalizers)
			},
		},
		{
			name:        "an update never re-adds a finalizer the stored object had",
			in:          stored(func(d *appsv1.Deployment) { d.Finalizers = []string{vocab.FinalizerRecord} }),
			old:         stored(func(d *appsv1.Deployment) { d.Finalizers = vocab.CanonicalFinalizers() }),
			wantChanged: []string{defaultedMaxUnavailable},
			check: func(t *testing.T, d *appsv1.Deployment) {
				assert.Equal(t, []string{vocab.FinalizerRecord}, d.Finalizers)
			},
		},
		{
			name:        "an update adopts a Deployment that predates the guard",
			in:          stored(),
			old:         stored(),
			wantChanged: []string{defaultedMaxUnavailable, defaultedFinalizers},
		},
		{
			name: "a Deployment being deleted gets no finalizers",
			in: stored(func(d *appsv1.Deployment) {
				d.DeletionTimestamp = &metav1.Time{}
			}),
			wantChanged: []string{defaultedMaxUnavailable},
			check: func(t *testing.T, d *appsv1.Deployment) {
				assert.Empty(t, d.Finalizers)
			},
		},
		{
			name:        "finalizers off by config",
			in:          stored(),
			opts:        func(o *Options) { o.AddFinalizers = false },
			wantChanged: []string{defaultedMaxUnavailable},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := testOptions()
			if tt.opts != nil {
				tt.opts(o)
			}
			changed, errs := Default(tt.in, tt.old, o)
			if tt.wantErr != "" {
				require.NotEmpty(t, errs)
				assert.Contains(t, errs.ToAggregate().Error(), tt.wantErr)
				return
			}
			require.Empty(t, errs)
			assert.Equal(t, tt.wantChanged, changed)
			if tt.check != nil {
				tt.check(t, tt.in)
			}

			// Idempotent: the webhook may be invoked again (reinvocationPolicy
			// IfNeeded) and must then change nothing.
			again := tt.in.DeepCopy()
			changed2, errs2 := Default(again, tt.old, o)
			require.Empty(t, errs2)
			assert.Empty(t, changed2, "second run changed fields")
			assert.Equal(t, tt.in, again)
		})
	}
}

func TestAPIServerDefaults(t *testing.T) {
	d := &appsv1.Deployment{Spec: appsv1.DeploymentSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
		Containers: []corev1.Container{{Name: "a", Image: "nginx"}, {Name: "b", Image: "registry:5000/x/y:1.0"}, {Name: "c", Image: "x@sha256:abc"}},
	}}}}
	APIServerDefaults(d)
	assert.Equal(t, int32(1), *d.Spec.Replicas)
	assert.Equal(t, appsv1.RollingUpdateDeploymentStrategyType, d.Spec.Strategy.Type)
	assert.Equal(t, builtinMaxSurge, *d.Spec.Strategy.RollingUpdate.MaxSurge)
	assert.Equal(t, int32(10), *d.Spec.RevisionHistoryLimit)
	assert.Equal(t, int32(600), *d.Spec.ProgressDeadlineSeconds)
	assert.Equal(t, corev1.PullAlways, d.Spec.Template.Spec.Containers[0].ImagePullPolicy)
	assert.Equal(t, corev1.PullIfNotPresent, d.Spec.Template.Spec.Containers[1].ImagePullPolicy)
	assert.Equal(t, corev1.PullIfNotPresent, d.Spec.Template.Spec.Containers[2].ImagePullPolicy)
}
