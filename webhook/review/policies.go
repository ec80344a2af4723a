package review

import (
	"context"
	"fmt"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/deployguard/deployguard/policy"
	"github.com/deployguard/deployguard/webhook/origin"
)

// Policies evaluates the Rego policies on one request.
type Policies interface {
	Evaluate(ctx context.Context, r policy.Request) (policy.Decision, error)
}

// RegoPolicies evaluates the engine's active set.
type RegoPolicies struct{ Engine *policy.Engine }

func (p RegoPolicies) Evaluate(ctx context.Context, r policy.Request) (policy.Decision, error) {
	return p.Engine.EvaluateRequest(ctx, r)
}

// policies runs the stage's Rego policies on req, unless r.Exempt says the
// request is exempt or the guard itself sends it, and adds their findings to
// r.
func (w *Reviewer) policies(ctx context.Context, req Request, stage Stage, r *Result) {
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

// evaluatePolicies runs the policies and turns their decision into findings:
// denials refuse at the rule's field path, warnings warn, audit-mode findings
// are recorded. An object the policies cannot read is refused: an enforce
// policy would otherwise be skipped silently.
func (w *Reviewer) evaluatePolicies(ctx context.Context, p Policies, req Request) (Findings, string) {
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
		return Findings{{Origin: origin.Policy, Rule: "evaluation", Severity: SeverityError, Field: e.Field, Message: e.ErrorBody(), Err: e.WithOrigin(origin.Policy)}}, ""
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
			Detail: fmt.Sprintf("[policy %s] %s", x.Policy, x.Message)}).WithOrigin(origin.Policy)
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
	return Finding{Origin: origin.Policy, Policy: x.Policy, Rule: rule, Mode: x.Mode, Severity: s, Field: x.Field, Message: x.Message, Err: e}
}
