package review

import (
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/deployguard/deployguard/policy"
	"github.com/deployguard/deployguard/webhook/exception"
)

// Severity says what a finding does to an admission request.
type Severity string

const (
	// SeverityError refuses the request.
	SeverityError Severity = "error"
	// SeverityWarning reaches the client as an admission warning.
	SeverityWarning Severity = "warning"
	// SeverityInfo is recorded only: an audit-mode policy's finding.
	SeverityInfo Severity = "info"
)

// Finding is one thing a review found about one request: the one result type
// of admission, which the webhooks, `deployguard check` and the audit each
// translate (an AdmissionResponse; text, JSON, SARIF, JUnit; a PolicyReport).
type Finding struct {
	// Origin is the check that found it, one of the refusal reasons
	// (selector, overlap, strategy, …, policy).
	Origin string
	// Policy and Rule name the Rego policy and its rule ("deny", "warn", or
	// "evaluation" for a failed evaluation) when Origin is policy; Policy is
	// empty when no policy could read the request at all.
	Policy, Rule string
	// Mode is the mode the check ran in: a policy's, or for a Go check
	// enforce when it refuses and warn when it only warns.
	Mode     policy.Mode
	Severity Severity
	// Field is the path of the field it is about, e.g. "spec.selector".
	Field string
	// Message says what is wrong and what to change, without the field.
	Message string
	// Err is the refusal as the API server lists it in its Invalid status;
	// set when Severity is SeverityError.
	Err *field.Error
	// Exception, when set, is the active PolicyException that covers the
	// finding: a refusal it covers only warns, naming it.
	Exception *exception.Exception
	// Native says the finding is one of the guard's native policies', whose
	// message the API server gives as it is: "field: message".
	Native bool
}

// Line renders f as one line for a user: the API server's rendering of a
// refusal, "[policy p] field: message" for a policy, "field: message" for a
// warning.
func (f Finding) Line() string {
	if f.Exception != nil {
		return f.line() + " [excepted by " + f.Exception.String() + "]"
	}
	return f.line()
}

func (f Finding) line() string {
	switch {
	case f.Policy != "":
		return policy.Finding{Policy: f.Policy, Field: f.Field, Message: f.Message}.String()
	case f.Native:
		return f.Field + ": " + f.Message
	case f.Err != nil:
		return f.Err.Error()
	case f.Field == "":
		return f.Message
	}
	return f.Field + ": " + f.Message
}

// Findings is what a review found, in the order the checks ran.
type Findings []Finding

// Refusals are the findings that refuse the request, as field errors whose
// Origin names the check (the admission metrics count by it).
func (fs Findings) Refusals() field.ErrorList {
	var errs field.ErrorList
	for _, f := range fs {
		if f.Severity == SeverityError {
			errs = append(errs, f.Err)
		}
	}
	return errs
}

// Warnings are the admission warnings, one line each.
func (fs Findings) Warnings() []string {
	var out []string
	for _, f := range fs {
		if f.Severity == SeverityWarning {
			out = append(out, f.Line())
		}
	}
	return out
}

// refuse is a Go check's refusal.
func refuse(e *field.Error, check string) Finding {
	e = e.WithOrigin(check)
	return Finding{Origin: check, Mode: policy.ModeEnforce, Severity: SeverityError, Field: e.Field, Message: e.ErrorBody(), Err: e}
}

// warn is a Go check's warning about the field at path.
func warn(check string, path *field.Path, message string) Finding {
	return Finding{Origin: check, Mode: policy.ModeWarn, Severity: SeverityWarning, Field: path.String(), Message: message}
}
