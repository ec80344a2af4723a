package policy

import "strings"

// Finding is one message of one policy about one request.
type Finding struct {
	// Policy is the policy's name: its package path without "deployguard.".
	Policy string
	// Message says what is wrong and what to change.
	Message string
	// Field is the path of the offending field, e.g.
	// "spec.template.spec.containers[0].image"; empty when the rule gave none.
	Field string
	// Mode is the mode the policy ran in.
	Mode Mode
	// Rule is the rule that produced the finding, "deny" or "warn"; empty for
	// an evaluation failure. The audit reports a deny as "fail" whatever the
	// mode, so that switching a policy's mode does not change its report.
	Rule string
	// EvalFailed marks a finding that reports a failed evaluation (error or
	// time-out) rather than a rule's message.
	EvalFailed bool
}

// String renders the finding as one human line, e.g.
// `[policy images] spec.template.spec.containers[0].image: image "nginx:latest" …`.
func (f Finding) String() string {
	var b strings.Builder
	b.WriteString("[policy ")
	b.WriteString(f.Policy)
	b.WriteString("] ")
	if f.Field != "" {
		b.WriteString(f.Field)
		b.WriteString(": ")
	}
	b.WriteString(f.Message)
	return b.String()
}

// Decision is the outcome of evaluating the policy set on one request.
type Decision struct {
	// Denied holds deny findings of enforce-mode policies and evaluation
	// failures under FailureDeny. Any entry refuses the request.
	Denied []Finding
	// Warnings holds warn findings, deny findings of warn-mode policies and
	// evaluation failures that do not refuse; they become admission warnings.
	Warnings []Finding
	// Audited holds the findings of audit-mode policies: logged and counted only.
	Audited []Finding
	// Exempt is true when the request skipped evaluation; ExemptReason says why.
	Exempt       bool
	ExemptReason string
}

// Allowed reports whether the request may proceed.
func (d Decision) Allowed() bool {
	return len(d.Denied) == 0
}

// Lines renders findings one per line, in order, for an admission response
// or a terminal.
func Lines(findings []Finding) []string {
	if len(findings) == 0 {
		return nil
	}
	lines := make([]string, len(findings))
	for i, f := range findings {
		lines[i] = f.String()
	}
	return lines
}
