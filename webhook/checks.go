package webhook

import (
	"fmt"
	"math"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/deployguard/deployguard/reconciler/vocab"
)

var (
	specPath     = field.NewPath("spec")
	strategyPath = specPath.Child("strategy")
)

// CheckSpec runs the Go safety checks on a Deployment's spec: selector, strategy,
// revision history and progress deadline. They are the same on CREATE and UPDATE.
// A missing readiness probe is the built-in probes policy's to report, so that
// one problem gives one warning.
func CheckSpec(d *appsv1.Deployment, o *Options) Findings {
	f := checkSelector(d)
	f = append(f, checkStrategy(d)...)
	f = append(f, checkRevisionHistory(d, o)...)
	return append(f, checkProgressDeadline(d, o)...)
}

// checkSelector refuses an empty selector (the API server does too, but the
// offline check and the mutating webhook see it first) and a selector that does
// not select the template's own pods.
func checkSelector(d *appsv1.Deployment) Findings {
	p := specPath.Child("selector")
	if emptySelector(d.Spec.Selector) {
		return Findings{refuse(field.Required(p,
			"an empty selector would select every pod in the namespace: set spec.selector.matchLabels to the template's stable labels, for example app.kubernetes.io/name"),
			reasonSelector)}
	}
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil {
		return Findings{refuse(field.Invalid(p, d.Spec.Selector, err.Error()), reasonSelector)}
	}
	if !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
		return Findings{refuse(field.Invalid(specPath.Child("template", "metadata", "labels"), d.Spec.Template.Labels,
			fmt.Sprintf("the selector %q does not select the template's labels: add the selector's labels to spec.template.metadata.labels", sel.String())),
			reasonSelector)}
	}
	return nil
}

// CheckOverlap refuses a Deployment whose selector selects the pods of another
// Deployment in the namespace, or whose pods another Deployment's selector
// selects: two Deployments would then fight over the same pods. others are
// the candidates an OverlapSource found; the decision is made here, exactly.
func CheckOverlap(d *appsv1.Deployment, others []Selection) Findings {
	var f Findings
	p := specPath.Child("selector")
	mine, ok := SelectionOf(d)
	if !ok {
		return f // reported by checkSelector
	}
	// In name order, so that the message does not depend on the index.
	others = slices.SortedFunc(slices.Values(others), func(a, b Selection) int { return strings.Compare(a.Name, b.Name) })
	for _, o := range others {
		if o.Name == d.Name || o.Deleting {
			continue
		}
		switch {
		case mine.Selector.Matches(o.TemplateLabels):
			f = append(f, refuse(field.Invalid(p, mine.Selector.String(), fmt.Sprintf(
				"this selector also selects the pods of Deployment %q (labels %s): add a label that tells the two apart, such as app.kubernetes.io/instance, to the template and the selector",
				o.Name, o.TemplateLabels.String())), reasonOverlap))
		case o.Selector.Matches(mine.TemplateLabels):
			f = append(f, refuse(field.Invalid(specPath.Child("template", "metadata", "labels"), mine.TemplateLabels.String(), fmt.Sprintf(
				"these pods would be selected by Deployment %q (selector %s) too: add a label that tells the two apart, such as app.kubernetes.io/instance, to the template and the selector",
				o.Name, o.Selector.String())), reasonOverlap))
		}
	}
	return f
}

// checkStrategy refuses a rolling update that may take every replica down at
// once and warns about Recreate, which always does.
func checkStrategy(d *appsv1.Deployment) Findings {
	var f Findings
	replicas := replicasOf(d)
	switch d.Spec.Strategy.Type {
	case appsv1.RecreateDeploymentStrategyType:
		if replicas > 1 {
			f = append(f, warn(reasonStrategy, strategyPath.Child("type"), fmt.Sprintf(
				"Recreate stops all %d replicas before starting new ones, so every rollout is an outage; use RollingUpdate unless the app cannot run two versions at once", replicas)))
		}
	case appsv1.RollingUpdateDeploymentStrategyType, "":
		ru := d.Spec.Strategy.RollingUpdate
		if ru == nil || ru.MaxUnavailable == nil || replicas <= 1 {
			return f
		}
		_, unavailable := resolveFenceposts(ru.MaxSurge, ru.MaxUnavailable, replicas)
		if unavailable >= replicas {
			f = append(f, refuse(field.Invalid(strategyPath.Child("rollingUpdate", "maxUnavailable"), ru.MaxUnavailable.String(), fmt.Sprintf(
				"resolves to %d of %d replicas, so a rollout may take every replica down at once: set it below %d (for example 25%%), or to 0 with maxSurge of at least 1",
				unavailable, replicas, replicas)), reasonStrategy))
		}
	}
	return f
}

// resolveFenceposts mirrors the Deployment controller: maxSurge rounds up,
// maxUnavailable rounds down, and 0/0 becomes 0/1.
func resolveFenceposts(maxSurge, maxUnavailable *intstr.IntOrString, desired int32) (int32, int32) {
	surge := scaled(maxSurge, desired, true)
	unavailable := scaled(maxUnavailable, desired, false)
	if surge == 0 && unavailable == 0 {
		unavailable = 1
	}
	return surge, unavailable
}

func scaled(v *intstr.IntOrString, total int32, roundUp bool) int32 {
	if v == nil {
		return 0
	}
	if v.Type == intstr.Int {
		return v.IntVal
	}
	s := strings.TrimSuffix(v.StrVal, "%")
	var pct float64
	if _, err := fmt.Sscanf(s, "%g", &pct); err != nil {
		return 0 // the API server refuses a malformed percentage
	}
	x := pct * float64(total) / 100
	if roundUp {
		return int32(math.Ceil(x))
	}
	return int32(math.Floor(x))
}

func replicasOf(d *appsv1.Deployment) int32 {
	if d.Spec.Replicas == nil {
		return 1
	}
	return *d.Spec.Replicas
}

// outOfBounds reports a value outside the platform team's bounds: refused
// (by the check named reason) when the bounds are enforced, a warning
// otherwise.
func outOfBounds(f *Findings, reason string, p *field.Path, v int32, detail string, o *Options) {
	if o.BoundsEnforce {
		*f = append(*f, refuse(field.Invalid(p, v, detail), reason))
		return
	}
	*f = append(*f, warn(reason, p, fmt.Sprintf("%d is outside this cluster's bounds: %s", v, detail)))
}

func checkRevisionHistory(d *appsv1.Deployment, o *Options) Findings {
	var f Findings
	p := specPath.Child("revisionHistoryLimit")
	v := builtinRevisionHistoryLimit
	if d.Spec.RevisionHistoryLimit != nil {
		v = *d.Spec.RevisionHistoryLimit
	}
	b := o.RevisionHistoryBounds
	switch {
	case v < b.Min && v == 0:
		outOfBounds(&f, reasonRevisionHistory, p, v, fmt.Sprintf(
			"0 keeps no old ReplicaSet once a rollout completes, so kubectl rollout undo has nothing to go back to "+
				"(deployguard still rolls back a rollout that fails: the Deployment controller keeps its predecessors until it completes); set at least %d", b.Min), o)
	case v < b.Min:
		outOfBounds(&f, reasonRevisionHistory, p, v, fmt.Sprintf("keep at least %d old ReplicaSets, so that a rollback has somewhere to go", b.Min), o)
	case v > b.Max:
		outOfBounds(&f, reasonRevisionHistory, p, v, fmt.Sprintf("keep at most %d: every old ReplicaSet stays in the cluster, idle", b.Max), o)
	}
	return f
}

func checkProgressDeadline(d *appsv1.Deployment, o *Options) Findings {
	var f Findings
	p := specPath.Child("progressDeadlineSeconds")
	if d.Spec.ProgressDeadlineSeconds == nil {
		return f
	}
	v := *d.Spec.ProgressDeadlineSeconds
	if v == math.MaxInt32 {
		f = append(f, warn(reasonProgressDeadline, p, "the maximum value means the deadline never passes, so a stuck rollout is never detected nor rolled back"))
		return f
	}
	// The API server refuses a deadline not above minReadySeconds too; the
	// offline check sees the manifest first.
	if v <= d.Spec.MinReadySeconds {
		f = append(f, refuse(field.Invalid(p, v, fmt.Sprintf(
			"must be greater than spec.minReadySeconds (%d), or no rollout could ever complete in time", d.Spec.MinReadySeconds)), reasonProgressDeadline))
		return f
	}
	b := o.ProgressDeadlineBounds
	switch {
	case v < b.Min:
		outOfBounds(&f, reasonProgressDeadline, p, v, fmt.Sprintf(
			"set at least %d seconds: a shorter deadline fails rollouts that are only slow, and deployguard rolls them back", b.Min), o)
	case v > b.Max:
		outOfBounds(&f, reasonProgressDeadline, p, v, fmt.Sprintf(
			"set at most %d seconds: a stuck rollout is rolled back only when its deadline passes", b.Max), o)
	}
	return f
}

// CheckFinalizers enforces the finalizer rules. No unknown finalizer in the
// guard's domain is accepted, and the cleanup annotation must name known steps.
// While a Deployment is being deleted, only the guard (and break-glass groups)
// may remove or reorder the guard's finalizers: their steps have not all run.
// Outside deletion nothing is refused: the mutating webhook puts back what a
// client left out, and the reconciler keeps the list what the Deployment asks
// for. old is nil on CREATE.
func CheckFinalizers(d, old *appsv1.Deployment, privileged bool) Findings {
	var f Findings
	p := field.NewPath("metadata", "finalizers")
	canonical := vocab.CanonicalFinalizers()
	var had []string
	if old != nil {
		had = old.Finalizers
	}
	for i, x := range d.Finalizers {
		if vocab.IsGuardFinalizer(x) && !slices.Contains(canonical, x) && !slices.Contains(had, x) {
			f = append(f, refuse(field.NotSupported(p.Index(i), x, canonical), reasonFinalizers))
		}
	}
	if v, ok := d.Annotations[vocab.AnnotationCleanup]; ok && (old == nil || old.Annotations[vocab.AnnotationCleanup] != v) {
		if _, err := vocab.ParseCleanupSteps(v); err != nil {
			f = append(f, refuse(field.Invalid(field.NewPath("metadata", "annotations").Key(vocab.AnnotationCleanup), v,
				err.Error()+`; for example "record,drain"`), reasonFinalizers))
		}
	}
	if old == nil || privileged || old.DeletionTimestamp == nil {
		return f
	}
	before, after := vocab.GuardFinalizers(old.Finalizers), vocab.GuardFinalizers(d.Finalizers)
	if slices.Equal(before, after) {
		return f
	}
	return append(f, refuse(field.Forbidden(p, fmt.Sprintf(
		"the Deployment is being deleted and the guard's cleanup steps %v (now %v) have not all run; deployguard removes each finalizer when its step is done. "+
			"To skip them, set the annotation %s=true on the Deployment, or ask a member of a break-glass group",
		before, after, vocab.AnnotationSkipCleanup)), reasonFinalizers))
}

// CheckQuarantine refuses (or warns about) an update that brings back a pod
// template whose rollout failed (its deadline, or fail-fast). The quarantine list is
// read from the stored object, which the requesting user cannot rewrite in the
// same request.
func CheckQuarantine(d, old *appsv1.Deployment, mode string) Findings {
	if old == nil || mode == QuarantineOff {
		return nil
	}
	hash := vocab.TemplateHash(&d.Spec.Template)
	if hash == vocab.TemplateHash(&old.Spec.Template) || !slices.Contains(vocab.QuarantinedTemplates(old), hash) {
		return nil
	}
	if d.Annotations[vocab.AnnotationAllowTemplate] == hash {
		return Findings{warn(reasonQuarantine, specPath.Child("template"), fmt.Sprintf(
			"bringing back quarantined pod template %s deliberately (annotation %s)", hash, vocab.AnnotationAllowTemplate))}
	}
	msg := quarantined(hash, "bring this exact template back")
	if q := vocab.QuarantinedTemplates(old); q[len(q)-1] == hash && old.Annotations[vocab.AnnotationRolledBackTo] != "" &&
		old.Annotations[vocab.AnnotationRollbackStatus] != "" {
		// The rollback of this very template still stands: say why it
		// failed, for a GitOps tool that shows only this message.
		msg += " (deployguard: " + old.Annotations[vocab.AnnotationRollbackStatus] + ")"
	}
	return quarantineFinding(msg, mode)
}

// checkStoredQuarantine judges a stored Deployment: its current pod template
// is on its own quarantine list, so it runs a template whose rollout failed
// before and that the webhook would refuse to bring back.
func checkStoredQuarantine(d *appsv1.Deployment, mode string) Findings {
	hash := vocab.TemplateHash(&d.Spec.Template)
	if mode == QuarantineOff || !slices.Contains(vocab.QuarantinedTemplates(d), hash) || d.Annotations[vocab.AnnotationAllowTemplate] == hash {
		return nil
	}
	return quarantineFinding(quarantined(hash, "keep this exact template"), mode)
}

func quarantined(hash, deliberately string) string {
	return fmt.Sprintf("this pod template (hash %s) failed its rollout before and deployguard rolled it back; change the template to fix the failure, "+
		"or to %s deliberately set the annotation %s=%s", hash, deliberately, vocab.AnnotationAllowTemplate, hash)
}

func quarantineFinding(msg, mode string) Findings {
	if mode == QuarantineWarn {
		return Findings{warn(reasonQuarantine, specPath.Child("template"), msg)}
	}
	return Findings{refuse(field.Forbidden(specPath.Child("template"), msg), reasonQuarantine)}
}

// CheckDelete refuses the deletion of a protected Deployment.
func CheckDelete(d *appsv1.Deployment) Findings {
	if d.Annotations[vocab.AnnotationProtected] != "true" {
		return nil
	}
	return Findings{refuse(field.Forbidden(field.NewPath("metadata", "annotations").Key(vocab.AnnotationProtected), fmt.Sprintf(
		"Deployment %s/%s is protected from deletion; to delete it, first lift the protection with: kubectl annotate deployment %s -n %s %s-",
		d.Namespace, d.Name, d.Name, d.Namespace, vocab.AnnotationProtected)), reasonProtected)}
}
