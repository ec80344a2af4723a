package policy

import (
	"fmt"
	"slices"
	"time"
)

// DefaultEvalTimeout is the time budget of one policy's evaluation when
// Options.EvalTimeout is zero.
const DefaultEvalTimeout = 250 * time.Millisecond

// Options configure an Engine. They are fixed for the Engine's life; cmd builds
// them from flags and the config file.
type Options struct {
	// EvalTimeout is the time budget of each policy's evaluation; zero means
	// DefaultEvalTimeout. The caller's context bounds the whole request.
	EvalTimeout time.Duration
	// FailureMode applies to enforce-mode policies whose evaluation errors or
	// times out; empty means FailureDeny.
	FailureMode FailureMode
	// ForceMode, when set, overrides the mode of every policy: set it to
	// ModeAudit or ModeWarn to roll a new policy set out dry.
	ForceMode Mode
	// PolicyModes overrides the mode of single policies by name, and wins over
	// ForceMode.
	PolicyModes map[string]Mode
	// Disabled names policies that are compiled (so the set stays valid) but
	// never evaluated.
	Disabled []string
	// Exempt lists who and where policies do not apply.
	Exempt Exemptions
}

// Exemptions skip policy evaluation for a request. They come from the guard's
// configuration only, never from the object, so a user cannot exempt himself.
type Exemptions struct {
	// Namespaces whose requests are exempt.
	Namespaces []string
	// Usernames that are exempt, e.g. "system:serviceaccount:argocd:argocd-application-controller".
	Usernames []string
	// Groups whose members are exempt, e.g. "system:serviceaccounts:kube-system".
	Groups []string
}

// withDefaults fills zero values and checks the rest.
func (o Options) withDefaults() (Options, error) {
	if o.EvalTimeout < 0 {
		return o, fmt.Errorf("eval timeout %v: must not be negative", o.EvalTimeout)
	}
	if o.EvalTimeout == 0 {
		o.EvalTimeout = DefaultEvalTimeout
	}
	if o.FailureMode == "" {
		o.FailureMode = FailureDeny
	}
	if _, err := ParseFailureMode(string(o.FailureMode)); err != nil {
		return o, err
	}
	if o.ForceMode != "" {
		if _, err := ParseMode(string(o.ForceMode)); err != nil {
			return o, fmt.Errorf("force mode: %w", err)
		}
	}
	for name, m := range o.PolicyModes {
		if _, err := ParseMode(string(m)); err != nil {
			return o, fmt.Errorf("mode of policy %q: %w", name, err)
		}
	}
	return o, nil
}

// effectiveMode is the mode a policy runs in: Options win over its metadata.
func (o Options) effectiveMode(name string, declared Mode) Mode {
	if m, ok := o.PolicyModes[name]; ok {
		return m
	}
	if o.ForceMode != "" {
		return o.ForceMode
	}
	return declared
}

func (o Options) disabled(name string) bool {
	return slices.Contains(o.Disabled, name)
}
