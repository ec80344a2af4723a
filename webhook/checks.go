package webhook

import (
	"fmt"
	"math"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/webhook/native"
)

var specPath = field.NewPath("spec")

// checkSpec runs the spec checks that are the API server's own validation,
// which the offline check and the mutating webhook see first: the selector,
// and a progress deadline not above minReadySeconds. The guard's other spec
// rules are its native policies (native_rules.go). A missing readiness probe
// is the built-in probes policy's to report, so that one problem gives one
// warning.
func checkSpec(d *appsv1.Deployment) Findings {
	return append(checkSelector(d), checkProgressDeadline(d)...)
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
	if refusedSelector(d) {
		// Created while deployguard-selector was bound without
		// deployguard-refusals (a create with it is refused before this):
		// the audit says so, and so does every update.
		return Findings{warn(reasonSelector, p, "the selector is "+native.LabelEmptySelector+"="+native.EmptySelectorRefused+
			", the mark of an empty selector that could not be repaired: this Deployment was created while the native refusals were not enforced, "+
			"and every such Deployment of the namespace selects the same pods. A selector cannot be changed: recreate it with spec.selector.matchLabels set to labels its template carries")}
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

func replicasOf(d *appsv1.Deployment) int32 {
	if d.Spec.Replicas == nil {
		return 1
	}
	return *d.Spec.Replicas
}

// checkProgressDeadline refuses a deadline not above minReadySeconds, as
// the API server does.
func checkProgressDeadline(d *appsv1.Deployment) Findings {
	p := specPath.Child("progressDeadlineSeconds")
	if d.Spec.ProgressDeadlineSeconds == nil || *d.Spec.ProgressDeadlineSeconds == math.MaxInt32 {
		return nil
	}
	if v := *d.Spec.ProgressDeadlineSeconds; v <= d.Spec.MinReadySeconds {
		return Findings{refuse(field.Invalid(p, v, fmt.Sprintf(
			"must be greater than spec.minReadySeconds (%d), or no rollout could ever complete in time", d.Spec.MinReadySeconds)), reasonProgressDeadline)}
	}
	return nil
}

// CheckQuarantine refuses (or warns about) an update that brings back a pod
// template whose rollout failed (its deadline, or fail-fast). The quarantine list is
// read from the stored object, which the requesting user cannot rewrite in the
// same request.
func CheckQuarantine(d, old *appsv1.Deployment, mode string) Findings {
	if old == nil || mode == QuarantineOff {
		return nil
	}
	q := vocab.QuarantinedTemplates(old)
	if len(q) == 0 {
		// Most updates: nothing to hash the templates for.
		return nil
	}
	hash := vocab.TemplateHash(&d.Spec.Template)
	if hash == vocab.TemplateHash(&old.Spec.Template) || !slices.Contains(q, hash) {
		return nil
	}
	if d.Annotations[vocab.AnnotationAllowTemplate] == hash {
		return Findings{warn(reasonQuarantine, specPath.Child("template"), fmt.Sprintf(
			"bringing back quarantined pod template %s deliberately (annotation %s)", hash, vocab.AnnotationAllowTemplate))}
	}
	msg := quarantined(hash, "bring this exact template back")
	if q[len(q)-1] == hash && old.Labels[vocab.LabelRolledBack] != "" &&
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
	q := vocab.QuarantinedTemplates(d)
	if mode == QuarantineOff || len(q) == 0 {
		return nil
	}
	hash := vocab.TemplateHash(&d.Spec.Template)
	if !slices.Contains(q, hash) || d.Annotations[vocab.AnnotationAllowTemplate] == hash {
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
