package review

import (
	"context"
	"fmt"
	"slices"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/webhook/native"
	"github.com/deployguard/deployguard/webhook/origin"
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
	DefaultedSelector         = "spec.selector"
	DefaultedMaxSurge         = "spec.strategy.rollingUpdate.maxSurge"
	DefaultedMaxUnavailable   = "spec.strategy.rollingUpdate.maxUnavailable"
	DefaultedRevisionHistory  = "spec.revisionHistoryLimit"
	DefaultedProgressDeadline = "spec.progressDeadlineSeconds"
	DefaultedFinalizers       = "metadata.finalizers"
)

// Default fills in the cluster's defaults on d and returns the fields it
// changed. old is the stored object on UPDATE and nil on CREATE; privileged
// says the request comes from the guard itself or a break-glass group, whose
// finalizer lists are left as sent. Running it again on its own output changes
// nothing. A selector that cannot be repaired is returned as an error list
// with what to add.
func Default(d, old *appsv1.Deployment, o *Options, privileged bool) ([]string, field.ErrorList) {
	var changed []string
	add := func(f string, ok bool) {
		if ok {
			changed = append(changed, f)
		}
	}

	ok, errs := defaultSelector(d, old, o)
	if len(errs) > 0 {
		return nil, errs
	}
	add(DefaultedSelector, ok)
	surge, unavailable := defaultStrategy(d, o)
	add(DefaultedMaxSurge, surge)
	add(DefaultedMaxUnavailable, unavailable)
	add(DefaultedRevisionHistory, defaultRevisionHistoryLimit(d, o))
	add(DefaultedProgressDeadline, defaultProgressDeadline(d, o))
	add(DefaultedFinalizers, defaultFinalizers(d, old, o, privileged))

	if len(changed) > 0 {
		// Only this request's changes: older entries may no longer be true.
		if d.Annotations == nil {
			d.Annotations = map[string]string{}
		}
		d.Annotations[vocab.AnnotationDefaulted] = strings.Join(changed, ",")
	}
	return changed, nil
}

// defaultingWarnings are the warnings about what Default changed that the user
// should know: where the stored object differs from the manifest in a way
// that matters to them.
func defaultingWarnings(d *appsv1.Deployment, changed []string) Findings {
	if !slices.Contains(changed, DefaultedSelector) {
		return nil
	}
	return Findings{warn(origin.Selector, specPath.Child("selector"), fmt.Sprintf(
		"the selector was empty; deployguard set it to %s from the template's stable labels: write it into the manifest to keep it",
		metav1.FormatLabelSelector(d.Spec.Selector)))}
}

// emptySelector is what the API server refuses as "empty selector".
func emptySelector(s *metav1.LabelSelector) bool {
	return s == nil || (len(s.MatchLabels) == 0 && len(s.MatchExpressions) == 0)
}

// defaultSelector repairs a missing or empty selector from the template's
// stable identity labels. The repair is the guard's MutatingAdmissionPolicy
// deployguard-selector (config/native/policies.yaml), the one source of it:
// kube-apiserver applies it before this webhook is called, and where it did
// not (the policy not installed, or `deployguard check`), it is evaluated
// here, in process, with the API server's evaluator. Either way the policy's
// markers are read the same: a repaired selector is reported and its marker
// annotation removed; the refusal marker of an empty selector that cannot be
// repaired refuses, with deployguard-refusals' message.
func defaultSelector(d, old *appsv1.Deployment, o *Options) (bool, field.ErrorList) {
	path := field.NewPath("spec", "selector")
	repairedHere := false
	if emptySelector(d.Spec.Selector) {
		m, err := repairSelector(d, old, o)
		if err != nil {
			return false, field.ErrorList{field.Required(path, "the selector is empty, and could not be repaired: "+err.Error()).WithOrigin(origin.Selector)}
		}
		*d, repairedHere = *m, true
		// The routing label is for the API server's copy of this policy:
		// here the webhook is already called.
		unlabel(d, native.LabelDefaulting)
		unlabel(d, native.LabelRefusals)
	}
	if refusedSelector(d) && (old == nil || !refusedSelector(old)) {
		return false, field.ErrorList{unrepairableSelector(d, old, o).WithOrigin(origin.Selector)}
	}
	v, marked := d.Annotations[native.AnnotationSelectorRepaired]
	if !marked || old != nil && old.Annotations[native.AnnotationSelectorRepaired] == v {
		return false, nil
	}
	// The API server's repair in this request, unless the annotation came
	// with the object (a copy of a Deployment repaired while the guard was
	// down): then the selector is not the repair of this template, or the
	// mark stays the record it was.
	if !repairedHere {
		bare := d.DeepCopy()
		bare.Spec.Selector = nil
		delete(bare.Annotations, native.AnnotationSelectorRepaired)
		m, err := repairSelector(bare, old, o)
		if err != nil || !apiequality.Semantic.DeepEqual(m.Spec.Selector, d.Spec.Selector) {
			return false, nil
		}
	}
	delete(d.Annotations, native.AnnotationSelectorRepaired)
	return true, nil
}

// unlabel removes label key from d, leaving no empty map behind.
func unlabel(d *appsv1.Deployment, key string) {
	delete(d.Labels, key)
	if len(d.Labels) == 0 {
		d.Labels = nil
	}
}

// repairSelector is deployguard-selector applied to d, whose selector is
// empty, in process.
func repairSelector(d, old *appsv1.Deployment, o *Options) (*appsv1.Deployment, error) {
	rules, err := native.Load()
	if err != nil {
		return nil, err
	}
	// The evaluation is bounded by the API server's CEL cost budget.
	return rules.Mutate(context.Background(), nativeRequest(writeOf(d, old)), o.NativeSettings().Params(), native.Selector)
}

// writeOf is the CREATE (old nil) or UPDATE of d as a Request.
func writeOf(d, old *appsv1.Deployment) Request {
	if old == nil {
		return Request{Operation: admissionv1.Create, Object: d}
	}
	return Request{Operation: admissionv1.Update, Object: d, OldObject: old}
}

// refusedSelector says d selects deployguard-selector's refusal marker.
func refusedSelector(d *appsv1.Deployment) bool {
	return d.Spec.Selector != nil && d.Spec.Selector.MatchLabels[native.LabelEmptySelector] == native.EmptySelectorRefused
}

// unrepairableSelector is deployguard-refusals' refusal of d, marked by
// deployguard-selector: the message the API server gives while the guard is
// down.
func unrepairableSelector(d, old *appsv1.Deployment, o *Options) *field.Error {
	path := field.NewPath("spec", "selector")
	msg := "the selector is empty and cannot be repaired"
	for _, f := range o.NativeChecks(context.Background(), writeOf(d, old), native.Refusals) {
		if f.Field == path.String() {
			msg = f.Message
			break
		}
	}
	return field.Required(path, msg)
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
	surge = replaceBuiltin(&ru.MaxSurge, builtinMaxSurge, o.MaxSurge)
	prev := ru.MaxUnavailable
	unavailable = replaceBuiltin(&ru.MaxUnavailable, builtinMaxUnavailable, o.MaxUnavailable)
	if unavailable && NeverProgresses(*ru.MaxSurge, *ru.MaxUnavailable) {
		// The user chose maxSurge 0; our maxUnavailable 0 would deadlock.
		ru.MaxUnavailable, unavailable = prev, false
		if ru.MaxUnavailable == nil {
			ru.MaxUnavailable = ptr(builtinMaxUnavailable)
		}
	}
	return surge, unavailable
}

// replaceBuiltin sets *p to the cluster's default when it is unset or holds
// the API server's built-in one (a value equal to it counts as not chosen),
// and reports whether that changed anything.
func replaceBuiltin[T comparable](p **T, builtin, cluster T) bool {
	if *p != nil && (**p != builtin || **p == cluster) {
		return false
	}
	*p = &cluster
	return true
}

// NeverProgresses reports whether a rolling update with these maxSurge and
// maxUnavailable could never make progress: both 0 (or "0%"), which the API
// server refuses. A string "0", which intstr.Parse never gives but a
// manifest may hold, counts as 0.
func NeverProgresses(maxSurge, maxUnavailable intstr.IntOrString) bool {
	return isZero(maxSurge) && isZero(maxUnavailable)
}

func isZero(v intstr.IntOrString) bool {
	return (v.Type == intstr.Int && v.IntVal == 0) || (v.Type == intstr.String && (v.StrVal == "0%" || v.StrVal == "0"))
}

// defaultRevisionHistoryLimit replaces the built-in default with the
// cluster's. A value the user chose is kept, even 0: the Deployment controller
// prunes old ReplicaSets only once a rollout completes, so a failing rollout
// still has its predecessors to roll back to, and upstream's own conformance
// suite relies on 0 meaning 0. The validating webhook warns about it.
func defaultRevisionHistoryLimit(d *appsv1.Deployment, o *Options) bool {
	return replaceBuiltin(&d.Spec.RevisionHistoryLimit, builtinRevisionHistoryLimit, o.RevisionHistoryLimit)
}

func defaultProgressDeadline(d *appsv1.Deployment, o *Options) bool {
	return replaceBuiltin(&d.Spec.ProgressDeadlineSeconds, builtinProgressDeadlineSeconds, o.ProgressDeadlineSeconds)
}

// defaultFinalizers keeps the guard's cleanup finalizers what the Deployment
// asks for. A client that sends a whole object built on its own side (Update,
// kubectl replace) does not know them; leaving them out is not a request to
// remove them, so they are put back. The ways to change them are the
// deployguard.io/cleanup annotation (the list follows it), and, at deletion,
// the skip-cleanup annotation. Requests from the guard itself and from
// break-glass groups are left as they are: they remove finalizers on purpose.
//
// While a Deployment is being deleted no finalizer may be added, so only those
// the stored object had and the request left out are put back.
func defaultFinalizers(d, old *appsv1.Deployment, o *Options, privileged bool) bool {
	if privileged {
		return false
	}
	var want []string
	switch {
	case d.DeletionTimestamp != nil || (old != nil && old.DeletionTimestamp != nil):
		if old == nil {
			return false
		}
		want = vocab.GuardFinalizers(old.Finalizers)
	default:
		var err error
		if want, err = vocab.DesiredFinalizers(d.Annotations, o.CleanupFinalizers); err != nil {
			return false // refused by the validating webhook, with the reason
		}
	}
	var changed bool
	d.Finalizers, changed = vocab.WithGuardFinalizers(d.Finalizers, want)
	return changed
}
