package policy

import "fmt"

// Mode says what a policy's deny set does to a request.
type Mode string

const (
	// ModeEnforce refuses a request that a deny rule matches.
	ModeEnforce Mode = "enforce"
	// ModeWarn turns deny into an admission warning; the request goes through.
	ModeWarn Mode = "warn"
	// ModeAudit only logs and counts; the user sees nothing.
	ModeAudit Mode = "audit"
)

// ParseMode accepts the spelling used in policy metadata and in Options.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeEnforce, ModeWarn, ModeAudit:
		return m, nil
	}
	return "", fmt.Errorf("unknown mode %q: want %q, %q or %q", s, ModeEnforce, ModeWarn, ModeAudit)
}

// FailureMode says what an evaluation that errors or runs out of time means for
// an enforce-mode policy.
type FailureMode string

const (
	// FailureDeny refuses the request: a broken rule must not let everything in.
	FailureDeny FailureMode = "deny"
	// FailureAllow lets the request through with a warning naming the policy.
	FailureAllow FailureMode = "allow"
)

// ParseFailureMode accepts "deny" or "allow".
func ParseFailureMode(s string) (FailureMode, error) {
	switch f := FailureMode(s); f {
	case FailureDeny, FailureAllow:
		return f, nil
	}
	return "", fmt.Errorf("unknown failure mode %q: want %q or %q", s, FailureDeny, FailureAllow)
}
