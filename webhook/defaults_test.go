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

// platformDefaults are defaults a platform team chose over the built-in ones.
func platformDefaults(o *Options) {
	o.MaxUnavailable = intstr.FromInt32(0)
	o.RevisionHistoryLimit, o.ProgressDeadlineSeconds = 20, 300
}

func TestDefault(t *testing.T) {
	cleanup := func(steps string) func(*appsv1.Deployment) {
		return func(d *appsv1.Deployment) {
			d.Annotations = map[string]string{vocab.AnnotationCleanup: steps}
		}
	}
	withFinalizers := func(f ...string) func(*appsv1.Deployment) {
		return func(d *appsv1.Deployment) { d.Finalizers = f }
	}
	deleting := func(d *appsv1.Deployment) { d.DeletionTimestamp = &metav1.Time{} }
	tests := []struct {
		name        string
		in          *appsv1.Deployment
		old         *appsv1.Deployment
		opts        func(*Options)
		privileged  bool
		wantChanged []string
		wantErr     string
		check       func(t *testing.T, d *appsv1.Deployment)
	}{
		{
			name: "a default install changes nothing in a valid Deployment",
			in:   stored(),
			check: func(t *testing.T, d *appsv1.Deployment) {
				assert.Equal(t, stored(), d)
			},
		},
		{
			name:        "the platform's defaults replace the built-in values",
			in:          stored(),
			opts:        platformDefaults,
			wantChanged: []string{DefaultedMaxUnavailable, DefaultedRevisionHistory, DefaultedProgressDeadline},
			check: func(t *testing.T, d *appsv1.Deployment) {
				assert.Equal(t, intstr.FromInt32(0), *d.Spec.Strategy.RollingUpdate.MaxUnavailable)
				assert.Equal(t, intstr.FromString("25%"), *d.Spec.Strategy.RollingUpdate.MaxSurge)
				assert.Equal(t, int32(20), *d.Spec.RevisionHistoryLimit)
				assert.Equal(t, int32(300), *d.Spec.ProgressDeadlineSeconds)
				assert.Equal(t, "spec.strategy.rollingUpdate.maxUnavailable,spec.revisionHistoryLimit,spec.progressDeadlineSeconds", d.Annotations[vocab.AnnotationDefaulted])
				assert.Empty(t, d.Finalizers)
			},
		},
		{
			name: "explicit values other than the built-in defaults are kept",
			in: stored(func(d *appsv1.Deployment) {
				d.Spec.Strategy.RollingUpdate.MaxUnavailable = ptr(intstr.FromInt32(1))
				d.Spec.Strategy.RollingUpdate.MaxSurge = ptr(intstr.FromInt32(2))
				d.Spec.RevisionHistoryLimit = ptr(int32(5))
				d.Spec.ProgressDeadlineSeconds = ptr(int32(120))
			}),
			opts: platformDefaults,
			check: func(t *testing.T, d *appsv1.Deployment) {
				assert.Equal(t, intstr.FromInt32(1), *d.Spec.Strategy.RollingUpdate.MaxUnavailable)
				assert.Equal(t, int32(5), *d.Spec.RevisionHistoryLimit)
				assert.Equal(t, int32(120), *d.Spec.ProgressDeadlineSeconds)
				assert.NotContains(t, d.Annotations, vocab.AnnotationDefaulted)
			},
		},
		{
			name: "an explicit revisionHistoryLimit of 0 is kept",
			in:   stored(func(d *appsv1.Deployment) { d.Spec.RevisionHistoryLimit = ptr(int32(0)) }),
			opts: platformDefaults,
			// The strategy and deadline still equal the built-in values.
			wantChanged: []string{DefaultedMaxUnavailable, DefaultedProgressDeadline},
			check: func(t *testing.T, d *appsv1.Deployment) {
				assert.Equal(t, int32(0), *d.Spec.RevisionHistoryLimit)
			},
		},
		{
			name: "empty selector is repaired from stable labels only",
			in: stored(func(d *appsv1.Deployment) {
				d.Spec.Selector = nil
				d.Spec.Template.Labels = map[string]string{"app.kubernetes.io/name": "web", "app.kubernetes.io/instance": "prod", "version": "v2", "pod-template-hash": "x"}
			}),
			wantChanged: []string{DefaultedSelector},
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
			wantChanged: []string{DefaultedSelector},
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
			wantErr: "spec.selector: Required value: the selector is empty and cannot be repaired: the pod template has none of the stable labels " +
				"app.kubernetes.io/name, app.kubernetes.io/instance, app. Add one to spec.template.metadata.labels (for example app.kubernetes.io/name: web)",
		},
		{
			name: "a selector the API server repaired (deployguard-selector) is reported, and its marker removed",
			in: stored(func(d *appsv1.Deployment) {
				d.Annotations = map[string]string{"deployguard.io/selector-repaired": "true", "team": "shop"}
			}),
			wantChanged: []string{DefaultedSelector},
			check: func(t *testing.T, d *appsv1.Deployment) {
				assert.Equal(t, map[string]string{"team": "shop", vocab.AnnotationDefaulted: DefaultedSelector}, d.Annotations)
			},
		},
		{
			name: "a copied mark with a selector that is not the template's repair is left as it came",
			in: stored(func(d *appsv1.Deployment) {
				d.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}
				d.Spec.Template.Labels["app"] = "web"
				d.Annotations = map[string]string{"deployguard.io/selector-repaired": "true"}
			}),
			check: func(t *testing.T, d *appsv1.Deployment) {
				assert.Equal(t, map[string]string{"deployguard.io/selector-repaired": "true"}, d.Annotations)
			},
		},
		{
			name: "an update keeps the marker of a repair while the guard was down",
			in: stored(func(d *appsv1.Deployment) {
				d.Annotations = map[string]string{"deployguard.io/selector-repaired": "true"}
			}),
			old: stored(func(d *appsv1.Deployment) {
				d.Annotations = map[string]string{"deployguard.io/selector-repaired": "true"}
			}),
			check: func(t *testing.T, d *appsv1.Deployment) {
				assert.Equal(t, "true", d.Annotations["deployguard.io/selector-repaired"])
			},
		},
		{
			name: "a selector the API server could not repair is refused with deployguard-refusals' words",
			in: stored(func(d *appsv1.Deployment) {
				d.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"deployguard.io/empty-selector": "refused"}}
				d.Spec.Template.Labels = map[string]string{"deployguard.io/empty-selector": "refused", "version": "v3"}
			}),
			wantErr: "spec.selector: Required value: the selector is empty and cannot be repaired: the pod template has none of the stable labels " +
				"app.kubernetes.io/name, app.kubernetes.io/instance, app. Add one to spec.template.metadata.labels (for example app.kubernetes.io/name: web)",
		},
		{
			name: "user's maxSurge 0 keeps a non-zero maxUnavailable",
			in: stored(func(d *appsv1.Deployment) {
				d.Spec.Strategy.RollingUpdate.MaxSurge = ptr(intstr.FromInt32(0))
			}),
			opts:        platformDefaults,
			wantChanged: []string{DefaultedRevisionHistory, DefaultedProgressDeadline},
			check: func(t *testing.T, d *appsv1.Deployment) {
				assert.Equal(t, intstr.FromString("25%"), *d.Spec.Strategy.RollingUpdate.MaxUnavailable)
			},
		},
		{
			name: "Recreate is left alone",
			in: stored(func(d *appsv1.Deployment) {
				d.Spec.Strategy = appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType}
			}),
			opts:        platformDefaults,
			wantChanged: []string{DefaultedRevisionHistory, DefaultedProgressDeadline},
			check: func(t *testing.T, d *appsv1.Deployment) {
				assert.Nil(t, d.Spec.Strategy.RollingUpdate)
			},
		},
		{
			name:        "the cleanup annotation adds its finalizers in canonical order after others",
			in:          stored(cleanup("drain, record"), withFinalizers("example.com/keep")),
			wantChanged: []string{DefaultedFinalizers},
			check: func(t *testing.T, d *appsv1.Deployment) {
				assert.Equal(t, []string{"example.com/keep", vocab.FinalizerRecord, vocab.FinalizerDrain}, d.Finalizers)
			},
		},
		{
			name:        "the cluster's default steps apply without the annotation",
			in:          stored(),
			opts:        func(o *Options) { o.CleanupFinalizers = []string{vocab.FinalizerRecord} },
			wantChanged: []string{DefaultedFinalizers},
			check: func(t *testing.T, d *appsv1.Deployment) {
				assert.Equal(t, []string{vocab.FinalizerRecord}, d.Finalizers)
			},
		},
		{
			name:        "none in the annotation wins over the cluster's default",
			in:          stored(cleanup("none")),
			opts:        func(o *Options) { o.CleanupFinalizers = vocab.CanonicalFinalizers() },
			wantChanged: nil,
		},
		{
			name:        "a full update that leaves the finalizers out gets them back",
			in:          stored(cleanup("record,drain")),
			old:         stored(cleanup("record,drain"), withFinalizers(vocab.CanonicalFinalizers()...)),
			wantChanged: []string{DefaultedFinalizers},
			check: func(t *testing.T, d *appsv1.Deployment) {
				assert.Equal(t, vocab.CanonicalFinalizers(), d.Finalizers)
			},
		},
		{
			name:        "removing the annotation removes the finalizers",
			in:          stored(withFinalizers("example.com/keep", vocab.FinalizerRecord, vocab.FinalizerDrain)),
			old:         stored(cleanup("record,drain"), withFinalizers("example.com/keep", vocab.FinalizerRecord, vocab.FinalizerDrain)),
			wantChanged: []string{DefaultedFinalizers},
			check: func(t *testing.T, d *appsv1.Deployment) {
				assert.Equal(t, []string{"example.com/keep"}, d.Finalizers)
			},
		},
		{
			name:        "an earlier version's finalizers go from a Deployment that does not ask",
			in:          stored(withFinalizers(vocab.FinalizerDrain, vocab.FinalizerRecord)),
			old:         stored(withFinalizers(vocab.FinalizerDrain, vocab.FinalizerRecord)),
			wantChanged: []string{DefaultedFinalizers},
			check: func(t *testing.T, d *appsv1.Deployment) {
				assert.Nil(t, d.Finalizers)
			},
		},
		{
			name:       "the guard's own and break-glass writes are left as sent",
			in:         stored(cleanup("record,drain"), withFinalizers(vocab.FinalizerDrain)),
			old:        stored(cleanup("record,drain"), withFinalizers(vocab.CanonicalFinalizers()...)),
			privileged: true,
			check: func(t *testing.T, d *appsv1.Deployment) {
				assert.Equal(t, []string{vocab.FinalizerDrain}, d.Finalizers)
			},
		},
		{
			name:        "while deleting, what the stored object had is put back",
			in:          stored(cleanup("record,drain"), deleting, withFinalizers("orphan")),
			old:         stored(cleanup("record,drain"), deleting, withFinalizers(vocab.FinalizerDrain, "orphan")),
			wantChanged: []string{DefaultedFinalizers},
			check: func(t *testing.T, d *appsv1.Deployment) {
				assert.Equal(t, []string{"orphan", vocab.FinalizerDrain}, d.Finalizers, "the record step had run: its finalizer stays gone")
			},
		},
		{
			name: "while deleting, nothing new is added",
			in:   stored(cleanup("record,drain"), deleting),
			old:  stored(cleanup("record,drain"), deleting),
			check: func(t *testing.T, d *appsv1.Deployment) {
				assert.Empty(t, d.Finalizers)
			},
		},
		{
			name: "an unknown step leaves the finalizers alone (the validating webhook refuses it)",
			in:   stored(cleanup("recrod"), withFinalizers(vocab.FinalizerDrain)),
			check: func(t *testing.T, d *appsv1.Deployment) {
				assert.Equal(t, []string{vocab.FinalizerDrain}, d.Finalizers)
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := testOptions()
			if tt.opts != nil {
				tt.opts(o)
			}
			changed, errs := Default(tt.in, tt.old, o, tt.privileged)
			if tt.wantErr != "" {
				require.NotEmpty(t, errs)
				assert.Contains(t, errs.ToAggregate().Error(), tt.wantErr)
				assert.Equal(t, OriginSelector, RefusedBy(errs), "the only refusal Default makes is the selector's")
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
			changed2, errs2 := Default(again, tt.old, o, tt.privileged)
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
	assert.Equal(t, intstr.FromString("25%"), *d.Spec.Strategy.RollingUpdate.MaxSurge)
	assert.Equal(t, int32(10), *d.Spec.RevisionHistoryLimit)
	assert.Equal(t, int32(600), *d.Spec.ProgressDeadlineSeconds)
	assert.Equal(t, corev1.PullAlways, d.Spec.Template.Spec.Containers[0].ImagePullPolicy)
	assert.Equal(t, corev1.PullIfNotPresent, d.Spec.Template.Spec.Containers[1].ImagePullPolicy)
	assert.Equal(t, corev1.PullIfNotPresent, d.Spec.Template.Spec.Containers[2].ImagePullPolicy)
}
