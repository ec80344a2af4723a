package config

import (
	"github.com/deployguard/deployguard/policy"
	"github.com/deployguard/deployguard/reconciler"
	"github.com/deployguard/deployguard/webhook/exception"
	"github.com/deployguard/deployguard/webhook/review"
)

// WebhookOptions are the admission knobs of this configuration; guardUser is the
// guard's own service account user, who alone may remove its finalizers.
func (c Config) WebhookOptions(guardUser string) *review.Options {
	surge, unavailable := c.Defaults.Strategy.IntOrString()
	return &review.Options{
		StableLabelKeys:         c.Selector.StableLabelKeys,
		MaxSurge:                surge,
		MaxUnavailable:          unavailable,
		RevisionHistoryLimit:    c.Defaults.RevisionHistoryLimit,
		ProgressDeadlineSeconds: c.Defaults.ProgressDeadlineSeconds,
		CleanupFinalizers:       c.CleanupFinalizers(),
		RevisionHistoryBounds:   review.Range{Min: c.Bounds.RevisionHistoryLimit.Min, Max: c.Bounds.RevisionHistoryLimit.Max},
		ProgressDeadlineBounds:  review.Range{Min: c.Bounds.ProgressDeadlineSeconds.Min, Max: c.Bounds.ProgressDeadlineSeconds.Max},
		BoundsEnforce:           c.Bounds.Enforce,
		GuardUsername:           guardUser,
		BreakGlassGroups:        c.Finalizers.BreakGlassGroups,
		Quarantine:              c.Rollback.Quarantine,
		DisruptionBudgets:       c.DisruptionBudgets.Mode,
		ExemptNamespaces:        c.Exemptions.Namespaces,
		ExemptUsernames:         c.Exemptions.Usernames,
		ExemptGroups:            c.Exemptions.Groups,
		NativeInAPIServer:       c.NativePolicies.Installed,
		NativeProbeNamespace:    c.NativePolicies.ProbeNamespace,
	}
}

// PolicyOptions are the policy engine's options of this configuration. The
// file was validated, so the modes parse.
func (c Config) PolicyOptions() (policy.Options, error) {
	opts := policy.Options{
		EvalTimeout: c.Policy.EvalTimeout.Duration,
		Disabled:    c.Policy.DisableBuiltins,
		Exempt: policy.Exemptions{
			Namespaces: c.Exemptions.Namespaces, Usernames: c.Exemptions.Usernames, Groups: c.Exemptions.Groups,
		},
		PolicyModes: map[string]policy.Mode{},
	}
	var err error
	if opts.FailureMode, err = policy.ParseFailureMode(c.Policy.FailureMode); err != nil {
		return opts, err
	}
	if c.Policy.ModeOverride != "" {
		if opts.ForceMode, err = policy.ParseMode(c.Policy.ModeOverride); err != nil {
			return opts, err
		}
	}
	for name, m := range c.Policy.Modes {
		if opts.PolicyModes[name], err = policy.ParseMode(m); err != nil {
			return opts, err
		}
	}
	return opts, nil
}

// FailFastOptions are the reconciler's fail-fast settings of this
// configuration.
func (c Config) FailFastOptions() reconciler.FailFastOptions {
	ff := c.Rollback.FailFast
	o := reconciler.DefaultFailFastOptions()
	o.Enabled = ff.Enabled
	o.Window = ff.Window.Duration
	o.TransientWindow = ff.TransientWindow.Duration
	o.Reasons = ff.Reasons
	o.RestartThreshold = ff.RestartThreshold
	o.UnschedulableAfter = ff.UnschedulableAfter.Duration
	o.MinFailingPods = ff.MinFailingPods
	return o
}

// RecordBudget is the budget of the records one namespace's deletions keep
// in the guard's namespace.
func (c Config) RecordBudget() reconciler.RecordBudget {
	return reconciler.RecordBudget{
		Records:     c.Cleanup.RecordsPerNamespace,
		Bytes:       c.Cleanup.RecordBytesPerNamespace,
		RecordBytes: c.Cleanup.MaxRecordBytes,
	}
}

// ExceptionsNamespace is the namespace PolicyExceptions are honoured in:
// exceptions.namespace, or the guard's own.
func (c Config) ExceptionsNamespace(guardNamespace string) string {
	if c.Exceptions.Namespace != "" {
		return c.Exceptions.Namespace
	}
	return guardNamespace
}

// ExceptionLimits are the limits of PolicyExceptions of this configuration;
// policies are the names an exception may name.
func (c Config) ExceptionLimits(guardNamespace string, policies []string) exception.Limits {
	return exception.Limits{MaxDuration: c.Exceptions.MaxDuration.Duration, Namespace: c.ExceptionsNamespace(guardNamespace), Policies: policies}
}

// PolicyNames are the names of the loaded policies, which an exception may
// name.
func PolicyNames(eng *policy.Engine) []string {
	names := []string{}
	for _, p := range eng.Policies() {
		names = append(names, p.Name)
	}
	return names
}
