package review

import (
	"context"
	"fmt"
	"math"
	"slices"

	admissionv1 "k8s.io/api/admission/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/webhook/native"
	"github.com/deployguard/deployguard/webhook/origin"
)

// The Go checks of a review are named steps of a chain, in the manner of
// cert-manager's certificate policies: each Check reads what was gathered
// for one request (Input) and says what it found, and a Chain runs them in
// order. The guard's rules that need only the object are its native
// policies (native_rules.go), which the chains read; the rules that need
// the guard's state (the quarantine, the overlaps, the disruption budgets)
// are the Checks here.

// RefusedBy is the check a refusal made of errs is counted under: the
// check of the first, that is of the first check that refused in the order
// the checks run (a request refused by a Go check and a policy counts once,
// as the Go check). A field error says which check made it in its Origin;
// an internal error is the guard's own failure whichever check met it
// (origin.Internal), and an error that names no known check is counted as
// internal too, rather than given a name outside the fixed set. "" when
// errs is empty.
func RefusedBy(errs field.ErrorList) string {
	if len(errs) == 0 {
		return ""
	}
	e := errs[0]
	if e.Type == field.ErrorTypeInternal || !slices.Contains(origin.Checks(), e.Origin) {
		return origin.Internal
	}
	return e.Origin
}

// Input is what the checks read: the request, the guard's options, the
// indexes of the cluster, and the native policies' findings, evaluated once
// before the chain runs.
type Input struct {
	Request Request
	Options *Options
	// Overlaps finds the Deployments an overlap may be with; nil skips the
	// overlap checks.
	Overlaps OverlapSource
	// Budgets finds the PodDisruptionBudgets over a Deployment's pods; nil
	// skips the drain checks.
	Budgets BudgetSource
	// Native is what the native policies found about the request.
	Native NativeFindings
}

// NativeFindings are the native policies' findings about one request:
// those of deployguard-refusals, and those of the warnings and bounds.
type NativeFindings struct {
	Refusals, Advice Findings
}

// A Check judges one thing about a write (or a stored Deployment) and
// returns what it found, nothing when all is well.
type Check func(ctx context.Context, in Input) Findings

// A Chain of Checks, run in order.
type Chain []Check

// Run runs every check of the chain on in, and returns their findings in
// the chain's order. Unlike cert-manager's chains, it does not stop at the
// first check that finds something: the user sees every problem of a request
// at once.
func (c Chain) Run(ctx context.Context, in Input) Findings {
	var f Findings
	for _, check := range c {
		f = append(f, check(ctx, in)...)
	}
	return f
}

// guardRules hold for every write, whoever sends it and whatever it
// changes: they protect the guard's own state.
var guardRules = Chain{
	NativeRefusalsApply,
	BringsBackAQuarantinedTemplate,
}

// specRules judge what a write does to the spec. The API server's own
// validation, which the offline check and the mutating webhook see first,
// is the selector and the progress deadline; the guard's other rules that
// need only the object are the native policies'. A missing readiness probe
// is the built-in probes policy's to report, so that one problem gives one
// warning.
var specRules = Chain{
	SelectorIsInvalid,
	ProgressDeadlineIsTooShort,
	NativeAdviceApplies,
	StartsAnOverlap,
	BlocksNodeDrains,
}

// storedRules judge a Deployment as it is stored (the audit), as if it were
// created now: every spec rule runs although nothing changed, and what
// admission refuses only where it starts (an overlap) warns.
var storedRules = Chain{
	SelectorIsInvalid,
	ProgressDeadlineIsTooShort,
	NativeSpecRulesApply,
	RunsAQuarantinedTemplate,
	OverlapsAnotherDeployment,
	KeepsNodesUndrainable,
}

// specChecks are the checks of the spec: specRules' selector and progress
// deadline, and the native policies' (the size bounds judge the metadata
// too: what is stored may be over them).
var specChecks = []string{origin.Selector, origin.Strategy, origin.RevisionHistory, origin.ProgressDeadline, origin.Size}

// check runs the checks on a CREATE (old nil) or an UPDATE, or, at the
// Stored stage, on what is stored.
func (w *Reviewer) check(ctx context.Context, req Request, stage Stage, exempt bool, r *Result) Findings {
	o := w.Options
	in := Input{Request: req, Options: o, Overlaps: w.Overlaps, Budgets: w.Budgets}
	if stage.Stored {
		if o.Quarantine != QuarantineOff {
			r.Checked = append(r.Checked, origin.Quarantine)
		}
		if exempt {
			return RunsAQuarantinedTemplate(ctx, in)
		}
		r.Checked = append(r.Checked, specChecks...)
		if w.Overlaps != nil {
			r.Checked = append(r.Checked, origin.Overlap)
		}
		if w.Budgets != nil && o.DisruptionBudgets != BudgetsOff {
			r.Checked = append(r.Checked, origin.DisruptionBudget)
		}
		// What is stored is judged as if it were created now.
		stored := Request{Operation: admissionv1.Create, Object: req.Object, UserInfo: req.UserInfo}
		in.Native = o.nativeFindings(ctx, stored, true, true)
		return storedRules.Run(ctx, in)
	}
	// deployguard-refusals: its finalizer rules hold for everyone; its spec
	// rule skips what the gate below skips. Where the API server enforces
	// it, it judges a create only when deployguard-selector labelled it:
	// one that comes here unlabelled (changed by a mutating webhook after
	// that policy, or the policy failed) is judged here, while the guard is
	// up; its match condition leaves the others out cheaply.
	refusals := stage.Native || req.Operation == admissionv1.Create
	// The guard's own writes (rollback to a known-good template, drain, finalizer
	// removal) must never be refused by a rule added after the Deployment was
	// created: that would leave a failed rollout in place or a deletion stuck.
	// An update that leaves the spec as it was cannot make the spec worse, so
	// metadata-only changes (lifting a protection, annotating) always pass.
	gated := exempt || o.isGuard(req.UserInfo) || (req.OldObject != nil && apiequality.Semantic.DeepEqual(req.OldObject.Spec, req.Object.Spec))
	in.Native = o.nativeFindings(ctx, req, refusals, !gated)
	f := guardRules.Run(ctx, in)
	if gated {
		return f
	}
	return append(f, specRules.Run(ctx, in)...)
}

// NativeRefusalsApply: deployguard-refusals refuses the write (its
// finalizer rules, the deletion protection, every replica down at once, an
// empty selector that could not be repaired), as the API server does where
// it enforces the policy.
func NativeRefusalsApply(_ context.Context, in Input) Findings {
	return in.Native.Refusals
}

// NativeAdviceApplies: the native warnings find something to say about the
// spec, or a value is outside the bounds (a refusal when they are
// enforced).
func NativeAdviceApplies(_ context.Context, in Input) Findings {
	return in.Native.Advice
}

// NativeSpecRulesApply: a stored Deployment breaks a spec rule of the
// native policies. The audit judges no finalizer rule: those judge writes.
func NativeSpecRulesApply(_ context.Context, in Input) Findings {
	var out Findings
	for _, f := range slices.Concat(in.Native.Refusals, in.Native.Advice) {
		if f.Origin != origin.Finalizers && f.Origin != origin.Protected {
			out = append(out, f)
		}
	}
	return out
}

var specPath = field.NewPath("spec")

// SelectorIsInvalid: the selector is empty (the API server refuses it too,
// but the offline check and the mutating webhook see it first), or does not
// select the template's own pods.
func SelectorIsInvalid(_ context.Context, in Input) Findings {
	d := in.Request.Object
	p := specPath.Child("selector")
	if emptySelector(d.Spec.Selector) {
		return Findings{refuse(field.Required(p,
			"an empty selector would select every pod in the namespace: set spec.selector.matchLabels to the template's stable labels, for example app.kubernetes.io/name"),
			origin.Selector)}
	}
	if refusedSelector(d) {
		// Created while deployguard-selector was bound without
		// deployguard-refusals (a create with it is refused before this):
		// the audit says so, and so does every update.
		return Findings{warn(origin.Selector, p, "the selector is "+native.LabelEmptySelector+"="+native.EmptySelectorRefused+
			", the mark of an empty selector that could not be repaired: this Deployment was created while the native refusals were not enforced, "+
			"and every such Deployment of the namespace selects the same pods. A selector cannot be changed: recreate it with spec.selector.matchLabels set to labels its template carries")}
	}
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil {
		return Findings{refuse(field.Invalid(p, d.Spec.Selector, err.Error()), origin.Selector)}
	}
	if !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
		return Findings{refuse(field.Invalid(specPath.Child("template", "metadata", "labels"), d.Spec.Template.Labels,
			fmt.Sprintf("the selector %q does not select the template's labels: add the selector's labels to spec.template.metadata.labels", sel.String())),
			origin.Selector)}
	}
	return nil
}

// ProgressDeadlineIsTooShort: the deadline is not above minReadySeconds,
// which the API server refuses too.
func ProgressDeadlineIsTooShort(_ context.Context, in Input) Findings {
	d := in.Request.Object
	p := specPath.Child("progressDeadlineSeconds")
	if d.Spec.ProgressDeadlineSeconds == nil || *d.Spec.ProgressDeadlineSeconds == math.MaxInt32 {
		return nil
	}
	if v := *d.Spec.ProgressDeadlineSeconds; v <= d.Spec.MinReadySeconds {
		return Findings{refuse(field.Invalid(p, v, fmt.Sprintf(
			"must be greater than spec.minReadySeconds (%d), or no rollout could ever complete in time", d.Spec.MinReadySeconds)), origin.ProgressDeadline)}
	}
	return nil
}

// BringsBackAQuarantinedTemplate: an update brings back a pod template
// whose rollout failed (its deadline, or fail-fast); refused, or a warning
// in warn mode. The quarantine list is read from the stored object, which
// the requesting user cannot rewrite in the same request.
func BringsBackAQuarantinedTemplate(_ context.Context, in Input) Findings {
	d, old, mode := in.Request.Object, in.Request.OldObject, in.Options.Quarantine
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
		return Findings{warn(origin.Quarantine, specPath.Child("template"), fmt.Sprintf(
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

// RunsAQuarantinedTemplate: a stored Deployment's current pod template is
// on its own quarantine list, so it runs a template whose rollout failed
// before and that the webhook would refuse to bring back.
func RunsAQuarantinedTemplate(_ context.Context, in Input) Findings {
	d, mode := in.Request.Object, in.Options.Quarantine
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
		return Findings{warn(origin.Quarantine, specPath.Child("template"), msg)}
	}
	return Findings{refuse(field.Forbidden(specPath.Child("template"), msg), origin.Quarantine)}
}
