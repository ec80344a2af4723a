package webhook

import (
	"fmt"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/deployguard/deployguard/reconciler/vocab"
)

// The API server's built-in defaults for apps/v1 Deployments. They are applied
// before any mutating webhook runs, so the webhook cannot tell "omitted" from
// "explicitly the default": a value equal to one of these counts as not chosen.
var (
	builtinMaxSurge                      = intstr.FromString("25%")
	builtinMaxUnavailable                = intstr.FromString("25%")
	builtinRevisionHistoryLimit    int32 = 10
	builtinProgressDeadlineSeconds int32 = 600
)

// Fields named in the defaulted annotation.
const (
	defaultedSelector         = "spec.selector"
	defaultedMaxSurge         = "spec.strategy.rollingUpdate.maxSurge"
	defaultedMaxUnavailable   = "spec.strategy.rollingUpdate.maxUnavailable"
	defaultedRevisionHistory  = "spec.revisionHistoryLimit"
	defaultedProgressDeadline = "spec.progressDeadlineSeconds"
	defaultedFinalizers       = "metadata.finalizers"
)

// Default fills in the cluster's defaults on d and returns the fields it
// changed. old is the stored object on UPDATE and nil on CREATE. Running it again
// on its own output changes nothing. A selector that cannot be repaired is
// returned as an error list with what to add.
func Default(d, old *appsv1.Deployment, o *Options) ([]string, field.ErrorList) {
	var changed []string
	add := func(f string, ok bool) {
		if ok {
			changed = append(changed, f)
		}
	}

	ok, errs := defaultSelector(d, o)
	if len(errs) > 0 {
		return nil, errs
	}
	add(defaultedSelector, ok)
	surge, unavailable := defaultStrategy(d, o)
	add(defaultedMaxSurge, surge)
	add(defaultedMaxUnavailable, unavailable)
	add(defaultedRevisionHistory, defaultRevisionHistoryLimit(d, o))
	add(defaultedProgressDeadline, defaultProgressDeadline(d, o))
	add(defaultedFinalizers, defaultFinalizers(d, old, o))

	if len(changed) > 0 {
		// Only this request's changes: older entries may no longer be true.
		if d.Annotations == nil {
			d.Annotations = map[string]string{}
		}
		d.Annotations[vocab.AnnotationDefaulted] = strings.Join(changed, ",")
	}
	return changed, nil
}

// emptySelector is what the API server refuses as "empty selector".
func emptySelector(s *metav1.LabelSelector) bool {
	return s == nil || (len(s.MatchLabels) == 0 && len(s.MatchExpressions) == 0)
}

// defaultSelector repairs a missing or empty selector from the template's stable
// identity labels. Version-like labels are never used: a selector that includes
// them would stop matching the next version's pods.
func defaultSelector(d *appsv1.Deployment, o *Options) (bool, field.ErrorList) {
	if !emptySelector(d.Spec.Selector) {
		return false, nil
	}
	match := map[string]string{}
	for _, k := range o.StableLabelKeys {
		if v, ok := d.Spec.Template.Labels[k]; ok && v != "" {
			match[k] = v
		}
	}
	if len(match) == 0 {
		return false, field.ErrorList{field.Required(field.NewPath("spec", "selector"), fmt.Sprintf(
			"the selector is empty and cannot be repaired: the pod template has none of the stable labels %s. "+
				"Add one to spec.template.metadata.labels (for example %s: %s), or set spec.selector.matchLabels to labels the template carries",
			strings.Join(o.StableLabelKeys, ", "), firstOr(o.StableLabelKeys, "app"), nameOr(d)))}
	}
	d.Spec.Selector = &metav1.LabelSelector{MatchLabels: match}
	return true, nil
}

func firstOr(s []string, def string) string {
	if len(s) > 0 {
		return s[0]
	}
	return def
}

func nameOr(d *appsv1.Deployment) string {
	if d.Name != "" {
		return d.Name
	}
	return "<name>"
}

// defaultStrategy replaces each rolling-update parameter equal to the built-in
// default with the cluster's. It never produces maxSurge = maxUnavailable = 0,
// which the API server refuses.
func defaultStrategy(d *appsv1.Deployment, o *Options) (surge, unavailable bool) {
	s := &d.Spec.Strategy
	if s.Type == "" {
		s.Type = appsv1.RollingUpdateDeploymentStrategyType
	}
	if s.Type != appsv1.RollingUpdateDeploymentStrategyType {
		return false, false
	}
	if s.RollingUpdate == nil {
		s.RollingUpdate = &appsv1.RollingUpdateDeployment{}
	}
	ru := s.RollingUpdate
	if ru.MaxSurge == nil || *ru.MaxSurge == builtinMaxSurge {
		surge = set(&ru.MaxSurge, o.MaxSurge)
	}
	if ru.MaxUnavailable == nil || *ru.MaxUnavailable == builtinMaxUnavailable {
		prev := ru.MaxUnavailable
		unavailable = set(&ru.MaxUnavailable, o.MaxUnavailable)
		if unavailable && isZero(*ru.MaxSurge) && isZero(*ru.MaxUnavailable) {
			// The user chose maxSurge 0; our maxUnavailable 0 would deadlock.
			ru.MaxUnavailable, unavailable = prev, false
			if ru.MaxUnavailable == nil {
				v := builtinMaxUnavailable
				ru.MaxUnavailable = &v
			}
		}
	}
	return surge, unavailable
}

// set stores v in *p and reports whether that changed anything.
func set(p **intstr.IntOrString, v intstr.IntOrString) bool {
	if *p != nil && **p == v {
		return false
	}
	*p = &v
	return true
}

func isZero(v intstr.IntOrString) bool {
	return (v.Type == intstr.Int && v.IntVal == 0) || (v.Type == intstr.String && (v.StrVal == "0%" || v.StrVal == "0"))
}

func defaultRevisionHistoryLimit(d *appsv1.Deployment, o *Options) bool {
	want := o.RevisionHistoryLimit
	if cur := d.Spec.RevisionHistoryLimit; cur != nil && *cur != builtinRevisionHistoryLimit {
		want = *cur
	}
	// Rollback needs old ReplicaSets to go back to.
	want = max(want, o.RevisionHistoryBounds.Min)
	if d.Spec.RevisionHistoryLimit != nil && *d.Spec.RevisionHistoryLimit == want {
		return false
	}
	d.Spec.RevisionHistoryLimit = &want
	return true
}

func defaultProgressDeadline(d *appsv1.Deployment, o *Options) bool {
	cur := d.Spec.ProgressDeadlineSeconds
	if cur != nil && (*cur != builtinProgressDeadlineSeconds || *cur == o.ProgressDeadlineSeconds) {
		return false
	}
	v := o.ProgressDeadlineSeconds
	d.Spec.ProgressDeadlineSeconds = &v
	return true
}

// defaultFinalizers adds the guard's cleanup finalizers in canonical order. On
// UPDATE they are added only to a Deployment that has none of them yet (one that
// predates the guard): re-adding one a user removed would hide the removal,
// which the validating webhook refuses with a reason instead. A Deployment being
// deleted never gets new finalizers.
func defaultFinalizers(d, old *appsv1.Deployment, o *Options) bool {
	if !o.AddFinalizers || d.DeletionTimestamp != nil {
		return false
	}
	if old != nil && (old.DeletionTimestamp != nil || len(guardFinalizers(old.Finalizers)) > 0) {
		return false
	}
	canonical := vocab.CanonicalFinalizers()
	have := guardFinalizers(d.Finalizers)
	if slices.Equal(have, canonical) {
		return false
	}
	kept := slices.DeleteFunc(slices.Clone(d.Finalizers), func(f string) bool { return slices.Contains(canonical, f) })
	d.Finalizers = append(kept, canonical...)
	return true
}

// guardFinalizers returns the known guard finalizers in f, in their order.
func guardFinalizers(f []string) []string {
	canonical := vocab.CanonicalFinalizers()
	var out []string
	for _, x := range f {
		if slices.Contains(canonical, x) {
			out = append(out, x)
		}
	}
	return out
}
