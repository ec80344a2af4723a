package webhook

import (
	"context"
	"fmt"
	"slices"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/deployguard/deployguard/policy"
	"github.com/deployguard/deployguard/webhook/exception"
	"github.com/deployguard/deployguard/webhook/native"
)

// Request is what a review knows about one admission request.
type Request struct {
	Operation admissionv1.Operation
	// Object is the Deployment after the request (nil on DELETE); the
	// defaults are written into it. OldObject is the stored one (nil on
	// CREATE). At the validating webhook a CREATE's Object has no pod spec
	// (Endpoint.SkipCreatePodSpec): read it from ObjectRaw, or decode it
	// there (TestValidatingReadsNoPodSpecOfACreate).
	Object, OldObject *appsv1.Deployment
	// ObjectRaw and OldObjectRaw, when set, are the same objects as the API
	// server sent them; the policies read them without encoding them again.
	ObjectRaw, OldObjectRaw []byte
	UserInfo                authenticationv1.UserInfo
	DryRun                  bool
}

// Stage chooses what a review runs.
type Stage struct {
	// Defaults runs the mutating webhook's defaults on Object.
	Defaults bool
	// Checks runs the validating webhook's Go checks: the finalizer rules,
	// the quarantine, the spec checks and the overlaps; on DELETE, the
	// deletion protection.
	Checks bool
	// Policies runs the Rego policies, on DELETE too (with OldObject: the
	// policy engine evaluates the policies that can tell a DELETE).
	Policies bool
	// Stored judges Object as it is stored rather than a change to it (the
	// audit): the spec checks run even though nothing changed, an overlap
	// predates the request and warns, and the quarantine asks whether the
	// current template is quarantined.
	Stored bool
	// With, when set, evaluates in place of the reviewer's Policies: the
	// audit re-judges with a newly loaded set.
	With Policies
	// Native evaluates deployguard-refusals (native_rules.go) in process
	// too. The webhook leaves it to the API server where it is installed
	// (Options.NativeEnforced); the warnings and bounds are the webhook's
	// always.
	Native bool
}

// The stages of the callers.
var (
	Mutating   = Stage{Defaults: true}
	Validating = Stage{Checks: true, Policies: true}
	// Offline is the whole chain, as `deployguard check` runs it on a manifest.
	Offline = Stage{Defaults: true, Checks: true, Policies: true, Native: true}
	// Audit judges what is stored.
	Audit = Stage{Checks: true, Policies: true, Stored: true, Native: true}
)

// Review is what a review found.
type Review struct {
	Findings Findings
	// Defaulted lists the fields the defaults set on Object.
	Defaulted []string
	// Exempt says why the spec checks and the policies skipped the request
	// (the guard's exempt namespaces, users and groups); empty when they ran.
	Exempt string
	// Checked lists the Go checks that ran, so that a caller that reports
	// passes (the audit) knows which passed.
	Checked []string
	// PoliciesRan is true when the policies were evaluated.
	PoliciesRan bool
	// PoliciesExempt says why the policy engine skipped the request (its
	// own exemptions).
	PoliciesExempt string
}

// Policies evaluates the Rego policies on one request.
type Policies interface {
	Evaluate(ctx context.Context, r policy.Request) (policy.Decision, error)
}

// RegoPolicies evaluates the engine's active set.
type RegoPolicies struct{ Engine *policy.Engine }

func (p RegoPolicies) Evaluate(ctx context.Context, r policy.Request) (policy.Decision, error) {
	return p.Engine.EvaluateRequest(ctx, r)
}

// Review runs the stage of admission on one request: the defaults, the Go
// checks, the quarantine, the finalizer rules and the policies, in the order
// the API server calls them; on a DELETE, the deletion protection and the
// policies, on the Deployment being deleted. It is the one pipeline of the
// guard; callers only translate its findings.
func (w *Deployment) Review(ctx context.Context, req Request, stage Stage) Review {
	var r Review
	if req.Operation == admissionv1.Delete {
		if stage.Checks && stage.Native {
			// Deletion protection; the namespace controller is let
			// through, so that deleting a namespace always completes.
			r.Findings = w.Options.nativeChecks(ctx, req, native.Refusals)
		}
		// The policies judge the Deployment being deleted (oldObject);
		// the spec checks have nothing to say about a deletion.
		if req.OldObject == nil {
			return r
		}
		r.Exempt = w.Options.exemption(req.OldObject.Namespace, req.UserInfo)
		w.policies(ctx, req, stage, &r)
		w.except(req.OldObject, r.Findings)
		return r
	}
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return r
	}
	d, old := req.Object, req.OldObject
	o := w.Options
	if stage.Defaults {
		changed, errs := Default(d, old, o, o.mayManageFinalizers(req.UserInfo))
		if len(errs) > 0 {
			for _, e := range errs {
				r.Findings = append(r.Findings, refuse(e, e.Origin))
			}
			return r
		}
		r.Defaulted = changed
		r.Findings = append(r.Findings, defaultingWarnings(d, changed)...)
	}
	exempt := o.exemption(d.Namespace, req.UserInfo)
	r.Exempt = exempt
	if stage.Checks {
		r.Findings = append(r.Findings, w.check(ctx, req, stage, exempt != "", &r)...)
	}
	// Policies run even when a Go check failed: the user sees every problem of
	// the request at once.
	w.policies(ctx, req, stage, &r)
	w.except(d, r.Findings)
	return r
}

// policies runs the stage's Rego policies on req, unless r.Exempt says the
// request is exempt or the guard itself sends it, and adds their findings to
// r.
func (w *Deployment) policies(ctx context.Context, req Request, stage Stage, r *Review) {
	p := stage.With
	if p == nil {
		p = w.Policies
	}
	if !stage.Policies || p == nil || r.Exempt != "" || w.Options.isGuard(req.UserInfo) {
		return
	}
	r.PoliciesRan = true
	fs, why := w.evaluatePolicies(ctx, p, req)
	r.Findings, r.PoliciesExempt = append(r.Findings, fs...), why
}

// except applies the active PolicyExceptions that cover d to its findings: a
// covered refusal becomes a warning, and every covered finding names the
// exception. The index is asked only when a finding could be covered, so a
// request with nothing to exempt costs no lookup.
func (w *Deployment) except(d *appsv1.Deployment, fs Findings) {
	if w.Exceptions == nil {
		return
	}
	var covering []*exception.Exception
	looked := false
	for i := range fs {
		f := &fs[i]
		if f.Origin == reasonPolicy && f.Policy == "" || f.Origin != reasonPolicy && !slices.Contains(exception.Checks, f.Origin) {
			continue
		}
		if !looked {
			now := time.Now
			if w.Now != nil {
				now = w.Now
			}
			covering, looked = w.Exceptions.Covering(d, now()), true
		}
		for _, e := range covering {
			if e.Exempts(f.Policy, f.Origin) {
				f.Exception = e
				if f.Severity == SeverityError {
					f.Severity, f.Err = SeverityWarning, nil
				}
				break
			}
		}
	}
}

// check runs the checks on a CREATE (old nil) or an UPDATE.
func (w *Deployment) check(ctx context.Context, req Request, stage Stage, exempt bool, r *Review) Findings {
	d, old, o := req.Object, req.OldObject, w.Options
	var f Findings
	if stage.Stored {
		if o.Quarantine != QuarantineOff {
			r.Checked = append(r.Checked, reasonQuarantine)
		}
		if exempt {
			return checkStoredQuarantine(d, o.Quarantine)
		}
		r.Checked = append(r.Checked, specChecks...)
		// What is stored is judged as if it were created now.
		stored := Request{Operation: admissionv1.Create, Object: d, UserInfo: req.UserInfo}
		f = append(checkSpec(d), specFindings(o.nativeChecks(ctx, stored, native.Refusals, native.Warnings, native.Bounds))...)
		f = append(f, checkStoredQuarantine(d, o.Quarantine)...)
		if w.Overlaps != nil {
			r.Checked = append(r.Checked, reasonOverlap)
			f = append(f, overlapPredates(w.checkOverlap(ctx, d))...)
		}
		if w.Budgets != nil && o.DisruptionBudgets != BudgetsOff {
			r.Checked = append(r.Checked, reasonDisruptionBudget)
			f = append(f, w.checkBudgets(d, nil, true)...)
		}
		return f
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
	gated := exempt || o.isGuard(req.UserInfo) || (old != nil && apiequality.Semantic.DeepEqual(old.Spec, d.Spec))
	// One evaluation for what runs here (the warnings' and bounds' run
	// joins the refusals' match condition), each policy's findings in
	// their place.
	var refused, advice Findings
	switch {
	case refusals && !gated:
		by := o.nativeChecksByPolicy(ctx, req, native.Refusals, native.Warnings, native.Bounds)
		refused, advice = by[0], append(by[1], by[2]...)
	case refusals:
		refused = o.nativeChecks(ctx, req, native.Refusals)
	case !gated:
		advice = o.nativeChecks(ctx, req, native.Warnings, native.Bounds)
	}
	f = append(refused, CheckQuarantine(d, old, o.Quarantine)...)
	if gated {
		return f
	}
	f = append(f, checkSpec(d)...)
	f = append(f, advice...)
	if w.Overlaps != nil && overlapMayChange(d, old) {
		now := w.checkOverlap(ctx, d)
		if old != nil && overlapping(now) && overlapping(w.checkOverlap(ctx, old)) {
			// The overlap predates this update; refusing it would block
			// unrelated changes such as a rollback.
			now = overlapPredates(now)[:1]
		}
		f = append(f, now...)
	}
	if drainMayChange(d, old) {
		f = append(f, w.checkBudgets(d, old, false)...)
	}
	return f
}

// specFindings are the findings of the spec checks: the audit judges no
// finalizer rule.
func specFindings(fs Findings) Findings {
	out := fs[:0]
	for _, f := range fs {
		if f.Origin != reasonFinalizers && f.Origin != reasonProtected {
			out = append(out, f)
		}
	}
	return out
}

// drainMayChange: a new Deployment, new replicas or new template labels may
// bring it under a budget that allows no eviction.
func drainMayChange(d, old *appsv1.Deployment) bool {
	return old == nil || replicasOf(d) != replicasOf(old) || overlapMayChange(d, old)
}

// specChecks are the spec checks: checkSpec and the native policies.
var specChecks = []string{reasonSelector, reasonStrategy, reasonRevisionHistory, reasonProgressDeadline}

// checkOverlap checks d against the candidates of the overlap index.
func (w *Deployment) checkOverlap(ctx context.Context, d *appsv1.Deployment) Findings {
	others, err := w.Overlaps.OverlapCandidates(ctx, d)
	if err != nil {
		f := refuse(field.InternalError(specPath.Child("selector"),
			fmt.Errorf("could not look up the namespace's Deployments to check for overlapping selectors, try again: %w", err)), reasonOverlap)
		f.Message = "could not look up the namespace's Deployments to check for overlapping selectors: " + err.Error()
		return Findings{f}
	}
	return CheckOverlap(d, others)
}

// overlapping reports whether the overlap check found an overlap (not a
// failed lookup).
func overlapping(f Findings) bool {
	for _, x := range f {
		if x.Severity == SeverityError && x.Err.Type != field.ErrorTypeInternal {
			return true
		}
	}
	return false
}

// overlapPredates turns overlap refusals into the warnings of an overlap that
// predates the request: admission refuses an overlap only where it starts.
func overlapPredates(f Findings) Findings {
	out := make(Findings, 0, len(f))
	for _, x := range f {
		if x.Severity == SeverityError && x.Err.Type != field.ErrorTypeInternal {
			x = warn(reasonOverlap, specPath.Child("selector"), "this Deployment's pods overlap with another Deployment's; "+x.Err.Detail)
		}
		out = append(out, x)
	}
	return out
}

// overlapMayChange: the selector is immutable, so only a new object or new
// template labels can create an overlap.
func overlapMayChange(d, old *appsv1.Deployment) bool {
	if old == nil {
		return true
	}
	if len(d.Spec.Template.Labels) != len(old.Spec.Template.Labels) {
		return true
	}
	for k, v := range d.Spec.Template.Labels {
		if old.Spec.Template.Labels[k] != v {
			return true
		}
	}
	return false
}

// evaluatePolicies runs the policies and turns their decision into findings:
// denials refuse at the rule's field path, warnings warn, audit-mode findings
// are recorded. An object the policies cannot read is refused: an enforce
// policy would otherwise be skipped silently.
func (w *Deployment) evaluatePolicies(ctx context.Context, p Policies, req Request) (Findings, string) {
	in := policy.Request{
		Operation: string(req.Operation),
		UserInfo:  policy.UserInfo{Username: req.UserInfo.Username, UID: req.UserInfo.UID, Groups: req.UserInfo.Groups},
		DryRun:    req.DryRun,
	}
	// A DELETE has no object (input.object is null): the policies judge
	// the Deployment being deleted, input.oldObject.
	subject := req.Object
	if subject != nil {
		in.Object = subject
		if len(req.ObjectRaw) > 0 {
			in.Object = req.ObjectRaw
		}
	} else {
		subject = req.OldObject
	}
	in.Namespace, in.Name = subject.Namespace, subject.Name
	if req.OldObject != nil {
		in.OldObject = req.OldObject
		if len(req.OldObjectRaw) > 0 {
			in.OldObject = req.OldObjectRaw
		}
	}
	if w.NamespaceLabels != nil {
		// Without the labels, rules that need them see none; the request is
		// not refused for a cache miss.
		in.NamespaceLabels, _ = w.NamespaceLabels(ctx, in.Namespace)
	}
	dec, err := p.Evaluate(ctx, in)
	if err != nil {
		e := field.InternalError(field.NewPath("metadata"), fmt.Errorf("the policies could not read this Deployment: %w", err))
		return Findings{{Origin: reasonPolicy, Rule: "evaluation", Severity: SeverityError, Field: e.Field, Message: e.ErrorBody(), Err: e.WithOrigin(reasonPolicy)}}, ""
	}
	if dec.Exempt {
		return nil, dec.ExemptReason
	}
	f := make(Findings, 0, len(dec.Denied)+len(dec.Warnings)+len(dec.Audited))
	for _, x := range dec.Denied {
		path := x.Field
		switch {
		case path != "":
		case req.Operation == admissionv1.Delete:
			// Nothing of the spec is at fault in a deletion.
			path = "metadata"
		default:
			path = "spec"
		}
		e := (&field.Error{Type: field.ErrorTypeForbidden, Field: path, BadValue: "",
			Detail: fmt.Sprintf("[policy %s] %s", x.Policy, x.Message)}).WithOrigin(reasonPolicy)
		f = append(f, policyFinding(x, SeverityError, e))
	}
	for _, x := range dec.Warnings {
		f = append(f, policyFinding(x, SeverityWarning, nil))
	}
	for _, x := range dec.Audited {
		f = append(f, policyFinding(x, SeverityInfo, nil))
	}
	return f, ""
}

func policyFinding(x policy.Finding, s Severity, e *field.Error) Finding {
	rule := x.Rule
	if x.EvalFailed {
		rule = "evaluation"
	}
	return Finding{Origin: reasonPolicy, Policy: x.Policy, Rule: rule, Mode: x.Mode, Severity: s, Field: x.Field, Message: x.Message, Err: e}
}
