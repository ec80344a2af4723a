package review_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/webhook/origin"
	"github.com/deployguard/deployguard/webhook/review"
	"github.com/deployguard/deployguard/webhook/review/reviewtest"
)

// platformDefaults are defaults a platform team chose over the built-in ones.
func platformDefaults(o *review.Options) {
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
		opts        func(*review.Options)
		privileged  bool
		wantChanged []string
		wantErr     string
		check       func(t *testing.T, d *appsv1.Deployment)
	}{
		{
			name: "a default install changes nothing in a valid Deployment",
			in:   reviewtest.Stored(),
			check: func(t *testing.T, d *appsv1.Deployment) {
				assert.Equal(t, reviewtest.Stored(), d)
			},
		},
		{
			name:        "the platform's defaults replace the built-in values",
			in:          reviewtest.Stored(),
			opts:        platformDefaults,
			wantChanged: []string{review.DefaultedMaxUnavailable, review.DefaultedRevisionHistory, review.DefaultedProgressDeadline},
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
			in: reviewtest.Stored(func(d *appsv1.Deployment) {
				d.Spec.Strategy.RollingUpdate.MaxUnavailable = ptr.To(intstr.FromInt32(1))
				d.Spec.Strategy.RollingUpdate.MaxSurge = ptr.To(intstr.FromInt32(2))
				d.Spec.RevisionHistoryLimit = ptr.To(int32(5))
				d.Spec.ProgressDeadlineSeconds = ptr.To(int32(120))
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
			in:   reviewtest.Stored(func(d *appsv1.Deployment) { d.Spec.RevisionHistoryLimit = ptr.To(int32(0)) }),
			opts: platformDefaults,
			// The strategy and deadline still equal the built-in values.
			wantChanged: []string{review.DefaultedMaxUnavailable, review.DefaultedProgressDeadline},
			check: func(t *testing.T, d *appsv1.Deployment) {
				assert.Equal(t, int32(0), *d.Spec.RevisionHistoryLimit)
			},
		},
		{
			name: "empty selector is repaired from stable labels only",
			in: reviewtest.Stored(func(d *appsv1.Deployment) {
				d.Spec.Selector = nil
				d.Spec.Template.Labels = map[string]string{"app.kubernetes.io/name": "web", "app.kubernetes.io/instance": "prod", "version": "v2", "pod-template-hash": "x"}
			}),
			wantChanged: []string{review.DefaultedSelector},
			check: func(t *testing.T, d *appsv1.Deployment) {
				assert.Equal(t, map[string]string{"app.kubernetes.io/name": "web", "app.kubernetes.io/instance": "prod"}, d.Spec.Selector.MatchLabels)
			},
		},
		{
			name: "selector with no terms counts as empty",
			in: reviewtest.Stored(func(d *appsv1.Deployment) {
				d.Spec.Selector = &metav1.LabelSelector{}
				d.Spec.Template.Labels = map[string]string{"app": "legacy"}
			}),
			wantChanged: []string{review.DefaultedSelector},
			check: func(t *testing.T, d *appsv1.Deployment) {
				assert.Equal(t, map[string]string{"app": "legacy"}, d.Spec.Selector.MatchLabels)
			},
		},
		{
			name: "empty selector with no stable label is refused with the labels to add",
			in: reviewtest.Stored(func(d *appsv1.Deployment) {
				d.Spec.Selector = nil
				d.Spec.Template.Labels = map[string]string{"version": "v3"}
			}),
			wantErr: "spec.selector: Required value: the selector is empty and cannot be repaired: the pod template has none of the stable labels " +
				"app.kubernetes.io/name, app.kubernetes.io/instance, app. Add one to spec.template.metadata.labels (for example app.kubernetes.io/name: web)",
		},
		{
			name: "a selector the API server repaired (deployguard-selector) is reported, and its marker removed",
			in: reviewtest.Stored(func(d *appsv1.Deployment) {
				d.Annotations = map[string]string{"deployguard.io/selector-repaired": "true", "team": "shop"}
			}),
			wantChanged: []string{review.DefaultedSelector},
			check: func(t *testing.T, d *appsv1.Deployment) {
				assert.Equal(t, map[string]string{"team": "shop", vocab.AnnotationDefaulted: review.DefaultedSelector}, d.Annotations)
			},
		},
		{
			name: "a copied mark with a selector that is not the template's repair is left as it came",
			in: reviewtest.Stored(func(d *appsv1.Deployment) {
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
			in: reviewtest.Stored(func(d *appsv1.Deployment) {
				d.Annotations = map[string]string{"deployguard.io/selector-repaired": "true"}
			}),
			old: reviewtest.Stored(func(d *appsv1.Deployment) {
				d.Annotations = map[string]string{"deployguard.io/selector-repaired": "true"}
			}),
			check: func(t *testing.T, d *appsv1.Deployment) {
				assert.Equal(t, "true", d.Annotations["deployguard.io/selector-repaired"])
			},
		},
		{
			name: "a selector the API server could not repair is refused with deployguard-refusals' words",
			in: reviewtest.Stored(func(d *appsv1.Deployment) {
				d.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"deployguard.io/empty-selector": "refused"}}
				d.Spec.Template.Labels = map[string]string{"deployguard.io/empty-selector": "refused", "version": "v3"}
			}),
			wantErr: "spec.selector: Required value: the selector is empty and cannot be repaired: the pod template has none of the stable labels " +
				"app.kubernetes.io/name, app.kubernetes.io/instance, app. Add one to spec.template.metadata.labels (for example app.kubernetes.io/name: web)",
		},
		{
			name: "user's maxSurge 0 keeps a non-zero maxUnavailable",
			in: reviewtest.Stored(func(d *appsv1.Deployment) {
				d.Spec.Strategy.RollingUpdate.MaxSurge = ptr.To(intstr.FromInt32(0))
			}),
			opts:        platformDefaults,
			wantChanged: []string{review.DefaultedRevisionHistory, review.DefaultedProgressDeadline},
			check: func(t *testing.T, d *appsv1.Deployment) {
				assert.Equal(t, intstr.FromString("25%"), *d.Spec.Strategy.RollingUpdate.MaxUnavailable)
			},
		},
		{
			name: "Recreate is left alone",
			in: reviewtest.Stored(func(d *appsv1.Deployment) {
				d.Spec.Strategy = appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType}
			}),
			opts:        platformDefaults,
			wantChanged: []string{review.DefaultedRevisionHistory, review.DefaultedProgressDeadline},
			check: func(t *testing.T, d *appsv1.Deployment) {
				assert.Nil(t, d.Spec.Strategy.RollingUpdate)
			},
		},
		{
			name:        "the cleanup annotation adds its finalizers in canonical order after others",
			in:          reviewtest.Stored(cleanup("drain, record"), withFinalizers("example.com/keep")),
			wantChanged: []string{review.DefaultedFinalizers},
			check: func(t *testing.T, d *appsv1.Deployment) {
				assert.Equal(t, []string{"example.com/keep", vocab.FinalizerRecord, vocab.FinalizerDrain}, d.Finalizers)
			},
		},
		{
			name:        "the cluster's default steps apply without the annotation",
			in:          reviewtest.Stored(),
			opts:        func(o *review.Options) { o.CleanupFinalizers = []string{vocab.FinalizerRecord} },
			wantChanged: []string{review.DefaultedFinalizers},
			check: func(t *testing.T, d *appsv1.Deployment) {
				assert.Equal(t, []string{vocab.FinalizerRecord}, d.Finalizers)
			},
		},
		{
			name:        "none in the annotation wins over the cluster's default",
			in:          reviewtest.Stored(cleanup("none")),
			opts:        func(o *review.Options) { o.CleanupFinalizers = vocab.CanonicalFinalizers() },
			wantChanged: nil,
		},
		{
			name:        "a full update that leaves the finalizers out gets them back",
			in:          reviewtest.Stored(cleanup("record,drain")),
			old:         reviewtest.Stored(cleanup("record,drain"), withFinalizers(vocab.CanonicalFinalizers()...)),
			wantChanged: []string{review.DefaultedFinalizers},
			check: func(t *testing.T, d *appsv1.Deployment) {
				assert.Equal(t, vocab.CanonicalFinalizers(), d.Finalizers)
			},
		},
		{
			name:        "removing the annotation removes the finalizers",
			in:          reviewtest.Stored(withFinalizers("example.com/keep", vocab.FinalizerRecord, vocab.FinalizerDrain)),
			old:         reviewtest.Stored(cleanup("record,drain"), withFinalizers("example.com/keep", vocab.FinalizerRecord, vocab.FinalizerDrain)),
			wantChanged: []string{review.DefaultedFinalizers},
			check: func(t *testing.T, d *appsv1.Deployment) {
				assert.Equal(t, []string{"example.com/keep"}, d.Finalizers)
			},
		},
		{
			name:        "an earlier version's finalizers go from a Deployment that does not ask",
			in:          reviewtest.Stored(withFinalizers(vocab.FinalizerDrain, vocab.FinalizerRecord)),
			old:         reviewtest.Stored(withFinalizers(vocab.FinalizerDrain, vocab.FinalizerRecord)),
			wantChanged: []string{review.DefaultedFinalizers},
			check: func(t *testing.T, d *appsv1.Deployment) {
				assert.Nil(t, d.Finalizers)
			},
		},
		{
			name:       "the guard's own and break-glass writes are left as sent",
			in:         reviewtest.Stored(cleanup("record,drain"), withFinalizers(vocab.FinalizerDrain)),
			old:        reviewtest.Stored(cleanup("record,drain"), withFinalizers(vocab.CanonicalFinalizers()...)),
			privileged: true,
			check: func(t *testing.T, d *appsv1.Deployment) {
				assert.Equal(t, []string{vocab.FinalizerDrain}, d.Finalizers)
			},
		},
		{
			name:        "while deleting, what the stored object had is put back",
			in:          reviewtest.Stored(cleanup("record,drain"), deleting, withFinalizers("orphan")),
			old:         reviewtest.Stored(cleanup("record,drain"), deleting, withFinalizers(vocab.FinalizerDrain, "orphan")),
			wantChanged: []string{review.DefaultedFinalizers},
			check: func(t *testing.T, d *appsv1.Deployment) {
				assert.Equal(t, []string{"orphan", vocab.FinalizerDrain}, d.Finalizers, "the record step had run: its finalizer stays gone")
			},
		},
		{
			name: "while deleting, nothing new is added",
			in:   reviewtest.Stored(cleanup("record,drain"), deleting),
			old:  reviewtest.Stored(cleanup("record,drain"), deleting),
			check: func(t *testing.T, d *appsv1.Deployment) {
				assert.Empty(t, d.Finalizers)
			},
		},
		{
			name: "an unknown step leaves the finalizers alone (the validating webhook refuses it)",
			in:   reviewtest.Stored(cleanup("recrod"), withFinalizers(vocab.FinalizerDrain)),
			check: func(t *testing.T, d *appsv1.Deployment) {
				assert.Equal(t, []string{vocab.FinalizerDrain}, d.Finalizers)
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := reviewtest.Options()
			if tt.opts != nil {
				tt.opts(o)
			}
			changed, errs := review.Default(tt.in, tt.old, o, tt.privileged)
			if tt.wantErr != "" {
				require.NotEmpty(t, errs)
				assert.Contains(t, errs.ToAggregate().Error(), tt.wantErr)
				assert.Equal(t, origin.Selector, review.RefusedBy(errs), "the only refusal Default makes is the selector's")
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
			changed2, errs2 := review.Default(again, tt.old, o, tt.privileged)
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
	review.APIServerDefaults(d)
	assert.Equal(t, int32(1), *d.Spec.Replicas)
	assert.Equal(t, appsv1.RollingUpdateDeploymentStrategyType, d.Spec.Strategy.Type)
	assert.Equal(t, intstr.FromString("25%"), *d.Spec.Strategy.RollingUpdate.MaxSurge)
	assert.Equal(t, int32(10), *d.Spec.RevisionHistoryLimit)
	assert.Equal(t, int32(600), *d.Spec.ProgressDeadlineSeconds)
	assert.Equal(t, corev1.PullAlways, d.Spec.Template.Spec.Containers[0].ImagePullPolicy)
	assert.Equal(t, corev1.PullIfNotPresent, d.Spec.Template.Spec.Containers[1].ImagePullPolicy)
	assert.Equal(t, corev1.PullIfNotPresent, d.Spec.Template.Spec.Containers[2].ImagePullPolicy)
}

// TestNeverProgresses: the one rule of a rolling update that cannot move,
// for the webhook's defaults and the config file's alike.
func TestNeverProgresses(t *testing.T) {
	tests := []struct {
		name               string
		surge, unavailable intstr.IntOrString
		want               bool
	}{
		{"0 and 0", intstr.FromInt32(0), intstr.FromInt32(0), true},
		{"0 and 0%", intstr.FromInt32(0), intstr.FromString("0%"), true},
		{"a string 0, as a manifest may hold it", intstr.FromString("0"), intstr.FromString("0%"), true},
		{"a surge of 1", intstr.FromInt32(1), intstr.FromInt32(0), false},
		{"25% unavailable", intstr.FromString("0%"), intstr.FromString("25%"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, review.NeverProgresses(tt.surge, tt.unavailable))
		})
	}
}
