// Package review is deployguard's review of apps/v1 Deployment writes: the
// cluster's defaults and the guard's finalizers (defaults.go), the Go checks
// as named steps of a chain (checks.go), the guard's native policies
// evaluated in process (native_rules.go), the Rego policies and the
// PolicyExceptions, in one pipeline, Reviewer.Review. The admission webhooks
// (package webhook), `deployguard check` and the audit all run it, and each
// only translates its findings: into an AdmissionResponse; into text, JSON,
// SARIF or JUnit; into a PolicyReport. It holds no transport.
package review

import (
	"context"
	"slices"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"

	"github.com/deployguard/deployguard/webhook/exception"
	"github.com/deployguard/deployguard/webhook/native"
	"github.com/deployguard/deployguard/webhook/origin"
)

// Reviewer reviews writes of apps/v1 Deployments: the one review (Review)
// that the webhooks, `deployguard check` and the audit all run.
type Reviewer struct {
	Options *Options
	// Overlaps finds the namespace's Deployments the overlap check compares
	// with; nil skips the check.
	Overlaps OverlapSource
	// Policies, when set, runs the Rego policies after the Go checks.
	Policies Policies
	// NamespaceLabels, when set, gives policies the namespace's labels.
	NamespaceLabels func(ctx context.Context, namespace string) (map[string]string, error)
	// Exceptions, when set, finds the PolicyExceptions that cover a
	// Deployment: what they exempt only warns, naming them.
	Exceptions Exceptions
	// Budgets, when set, finds the PodDisruptionBudgets that select a
	// Deployment's pods, for the drain check and the budgets' own review
	// (ReviewBudget).
	Budgets BudgetSource
	// Now is the clock exceptions expire by; nil is time.Now.
	Now func() time.Time
}

// Exceptions finds the PolicyExceptions active at now that cover d.
type Exceptions interface {
	Covering(d *appsv1.Deployment, now time.Time) []*exception.Exception
}

// Request is what a review knows about one admission request.
type Request struct {
	Operation admissionv1.Operation
	// Object is the Deployment after the request (nil on DELETE); the
	// defaults are written into it. OldObject is the stored one (nil on
	// CREATE). At the validating webhook a CREATE's Object has no pod spec
	// (webhook.Endpoint.SkipCreatePodSpec): read it from ObjectRaw, or
	// decode it there (TestValidatingReadsNoPodSpecOfACreate).
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

// Result is what a review found.
type Result struct {
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

// Review runs the stage of admission on one request: the defaults, the Go
// checks, the quarantine, the finalizer rules and the policies, in the order
// the API server calls them; on a DELETE, the deletion protection and the
// policies, on the Deployment being deleted. It is the one pipeline of the
// guard; callers only translate its findings.
func (w *Reviewer) Review(ctx context.Context, req Request, stage Stage) Result {
	var r Result
	if req.Operation == admissionv1.Delete {
		if stage.Checks && stage.Native {
			// Deletion protection; the namespace controller is let
			// through, so that deleting a namespace always completes.
			r.Findings = w.Options.NativeChecks(ctx, req, native.Refusals)
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
	w.ownersAsDeletion(ctx, req, stage, &r)
	w.except(d, r.Findings)
	return r
}

// except applies the active PolicyExceptions that cover d to its findings: a
// covered refusal becomes a warning, and every covered finding names the
// exception. The index is asked only when a finding could be covered, so a
// request with nothing to exempt costs no lookup.
func (w *Reviewer) except(d *appsv1.Deployment, fs Findings) {
	if w.Exceptions == nil {
		return
	}
	var covering []*exception.Exception
	looked := false
	for i := range fs {
		f := &fs[i]
		if f.Origin == origin.Policy && f.Policy == "" || f.Origin != origin.Policy && !slices.Contains(exception.Checks, f.Origin) {
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
