// Package audit is the background audit: a leader-only controller that
// evaluates the Deployments already stored in the cluster with the validating
// webhook's pipeline (the Go spec checks, every Rego policy in every mode, the
// quarantine) and writes what it finds as one PolicyReport per namespace. It
// is admission applied to what is stored, so it lives with the webhook, as
// Kyverno's background controller lives with its admission code.
package audit

import (
	"context"
	"slices"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/deployguard/deployguard/policy"
	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/webhook/origin"
	"github.com/deployguard/deployguard/webhook/review"
)

// Results of a PolicyReport result, as wgpolicyk8s.io and openreports.io name them.
const (
	ResultPass  = "pass"
	ResultFail  = "fail"
	ResultWarn  = "warn"
	ResultError = "error"
	ResultSkip  = "skip"
)

// Policy names of the Go checks; Rego policies are "deployguard.<name>".
const (
	PolicySpec       = "spec-checks"
	PolicyQuarantine = "quarantine"
)

// AuditUsername is the user an audit evaluation runs as: a policy tells an
// audit from admission by input.userInfo.username == "deployguard:audit".
const AuditUsername = "deployguard:audit"

// RuleOverlap is the rule of the overlap check, under PolicySpec.
const RuleOverlap = origin.Overlap

// Resource names the Deployment a result is about.
type Resource struct {
	Namespace, Name string
	UID             types.UID
}

// Result is one policy rule's verdict on one Deployment.
type Result struct {
	Policy, Rule, Result string
	// Message is the webhook's own line, field path first.
	Message            string
	Field              string
	Severity, Category string
	Resource           Resource
}

// Evaluator runs the validating webhook's checks on a stored Deployment.
type Evaluator struct {
	Options *review.Options
	Engine  *policy.Engine
	// NamespaceLabels, when set, gives policies the namespace's labels.
	NamespaceLabels func(ctx context.Context, namespace string) (map[string]string, error)
	// Overlaps, when set, finds the Deployments a stored one may overlap:
	// the webhook's index, fed by the shared informer, so that a lookup costs
	// its few candidates, never a list of the namespace. Without it overlaps
	// are not audited.
	Overlaps review.OverlapSource
	// Budgets, when set, finds the PodDisruptionBudgets that select a stored
	// Deployment's pods: the drain check. Without it budgets are not audited.
	Budgets review.BudgetSource
	// Exceptions, when set, are the PolicyExceptions admission applies:
	// what they cover is reported as skip, naming them.
	Exceptions review.Exceptions
	// Now is the clock exceptions expire by; nil is time.Now.
	Now func() time.Time
}

// Evaluate judges d as stored: an UPDATE whose oldObject equals object, run
// as AuditUsername. A namespace the webhook exempts gets skip results; one
// whose label deployguard.io/guard=disabled keeps the webhooks away gets none,
// as it is not guarded.
func (e *Evaluator) Evaluate(ctx context.Context, d *appsv1.Deployment) []Result {
	return e.evaluate(ctx, d, e.active(), nil, true)
}

// EvaluatePolicies judges d with only the policies of set that only selects:
// after a new policy set is loaded, the results of the policies it left
// unchanged stand.
func (e *Evaluator) EvaluatePolicies(ctx context.Context, d *appsv1.Deployment, set *policy.Set, only func(name string) bool) []Result {
	return e.evaluate(ctx, d, set, only, false)
}

func (e *Evaluator) active() *policy.Set {
	if e.Engine == nil {
		return nil
	}
	s := e.Engine.Active()
	return &s
}

// evaluate judges d as stored with the webhook's review (its Audit stage):
// the Go checks when checks is set, and the policies of set that only
// selects. It only translates the review's findings into results.
func (e *Evaluator) evaluate(ctx context.Context, d *appsv1.Deployment, set *policy.Set, only func(string) bool, checks bool) []Result {
	if e.NamespaceLabels != nil {
		if ns, _ := e.NamespaceLabels(ctx, d.Namespace); ns[vocab.LabelGuard] == "disabled" {
			return nil
		}
	}
	stage := review.Audit
	stage.Checks = checks
	var policies []policy.PolicyInfo
	if set != nil {
		stage.With = setPolicies{set: set, only: only}
		policies = set.Policies()
		if only != nil {
			policies = slices.DeleteFunc(policies, func(p policy.PolicyInfo) bool { return !only(p.Name) })
		}
	} else {
		stage.Policies = false
	}
	w := review.Reviewer{Options: e.Options, Overlaps: e.Overlaps, Budgets: e.Budgets, NamespaceLabels: e.NamespaceLabels, Exceptions: e.Exceptions, Now: e.Now}
	rev := w.Review(ctx, review.Request{
		Operation: admissionv1.Update, Object: d, OldObject: d,
		UserInfo: authenticationv1.UserInfo{Username: AuditUsername},
	}, stage)
	res := Resource{Namespace: d.Namespace, Name: d.Name, UID: d.UID}
	var out []Result
	if checks {
		out = append(out, checkResults(rev, res)...)
	}
	if set != nil {
		out = append(out, policyResults(policies, rev, res)...)
	}
	return out
}

// setPolicies evaluates a given set's policies that only selects.
type setPolicies struct {
	set  *policy.Set
	only func(string) bool
}

func (p setPolicies) Evaluate(ctx context.Context, r policy.Request) (policy.Decision, error) {
	return p.set.EvaluateRequest(ctx, r, p.only)
}

// checkResults gives every Go check that ran its results: fail for a
// refusal, warn for a warning, error for a lookup that failed, pass for a
// check that found nothing. A namespace the guard exempts gets one skip.
func checkResults(rev review.Result, res Resource) []Result {
	var out []Result
	if rev.Exempt != "" {
		out = append(out, Result{Policy: PolicySpec, Rule: "exempt", Result: ResultSkip, Message: rev.Exempt, Resource: res})
	}
	said := map[string]bool{}
	for _, f := range rev.Findings {
		if f.Origin == origin.Policy {
			continue
		}
		said[f.Origin] = true
		r := Result{Policy: PolicySpec, Rule: f.Origin, Result: ResultWarn, Field: f.Field, Message: f.Line(), Resource: res}
		switch {
		case f.Err != nil && f.Err.Type == field.ErrorTypeInternal:
			r.Result = ResultError
			r.Message = f.Field + ": " + f.Message + "; the audit checks again when this Deployment changes and at the next full pass"
		case f.Severity == review.SeverityError:
			r.Result = ResultFail
		}
		if f.Origin == origin.Quarantine {
			r.Policy, r.Rule = PolicyQuarantine, RuleQuarantinedTemplate
		}
		if f.Exception != nil {
			// Covered by a PolicyException: skip, naming it (f.Line does).
			r.Result = ResultSkip
		}
		out = append(out, r)
	}
	quarantine := false
	for _, c := range rev.Checked {
		quarantine = quarantine || c == origin.Quarantine
		if said[c] {
			continue
		}
		r := Result{Policy: PolicySpec, Rule: c, Result: ResultPass, Resource: res}
		if c == origin.Quarantine {
			r.Policy, r.Rule = PolicyQuarantine, RuleQuarantinedTemplate
		}
		out = append(out, r)
	}
	if !quarantine {
		out = append(out, Result{Policy: PolicyQuarantine, Rule: RuleQuarantinedTemplate, Result: ResultSkip, Message: "the quarantine is off", Resource: res})
	}
	return out
}

// RuleQuarantinedTemplate is the quarantine's rule.
const RuleQuarantinedTemplate = "quarantined-template"

// policyResults gives every policy of the set its results: a deny finding
// fails and a warn finding warns whatever the policy's mode (the mode decides
// what admission does, not what is wrong), an evaluation failure is an error,
// and a policy that found nothing passes. An exempt request skips them all.
func policyResults(policies []policy.PolicyInfo, rev review.Result, res Resource) []Result {
	var out []Result
	findings := map[string][]review.Finding{}
	var unreadable *review.Finding
	for i, f := range rev.Findings {
		switch {
		case f.Origin != origin.Policy:
		case f.Policy == "":
			unreadable = &rev.Findings[i]
		default:
			findings[f.Policy] = append(findings[f.Policy], f)
		}
	}
	skip := rev.PoliciesExempt
	if !rev.PoliciesRan {
		skip = rev.Exempt
	}
	for _, p := range policies {
		base := Result{Policy: "deployguard." + p.Name, Severity: p.Severity, Category: p.Category, Resource: res}
		switch {
		case unreadable != nil:
			r := base
			r.Rule, r.Result, r.Message = "evaluation", ResultError, unreadable.Err.Detail
			out = append(out, r)
			continue
		case skip != "":
			r := base
			r.Rule, r.Result, r.Message = "exempt", ResultSkip, skip
			out = append(out, r)
			continue
		}
		fs := findings[p.Name]
		if len(fs) == 0 {
			r := base
			r.Rule, r.Result = "deny", ResultPass
			out = append(out, r)
			continue
		}
		for _, f := range fs {
			r := base
			r.Rule, r.Field, r.Message = f.Rule, f.Field, f.Line()
			switch {
			case f.Exception != nil:
				r.Result = ResultSkip
			case f.Rule == "evaluation":
				r.Result = ResultError
			case f.Rule == "warn":
				r.Result = ResultWarn
			default:
				r.Result = ResultFail
			}
			out = append(out, r)
		}
	}
	return out
}

func typesUID(s string) types.UID { return types.UID(s) }
