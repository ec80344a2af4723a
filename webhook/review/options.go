package review

import (
	"slices"

	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Quarantine modes: what the validating webhook does with an update that brings
// back a pod template whose rollout failed.
const (
	QuarantineEnforce = "enforce"
	QuarantineWarn    = "warn"
	QuarantineOff     = "off"
)

// Options are the guard's admission knobs, filled from the config file in cmd/.
type Options struct {
	// StableLabelKeys are the template labels a missing selector is repaired
	// from, in order; version-like labels are never among them.
	StableLabelKeys []string

	// Defaults applied where the user did not choose (see Defaults). With the
	// API server's own values (25%/25%, 10, 600) the guard changes nothing.
	MaxSurge                intstr.IntOrString
	MaxUnavailable          intstr.IntOrString
	RevisionHistoryLimit    int32
	ProgressDeadlineSeconds int32
	// CleanupFinalizers are the guard's finalizers (vocab.ParseCleanupSteps) of
	// a Deployment without the deployguard.io/cleanup annotation; none by
	// default, so that deleting a Deployment is what it is without the guard.
	CleanupFinalizers []string

	// Bounds the validating webhook checks; BoundsEnforce refuses a value
	// outside them, otherwise it is a warning. Bounds are the platform team's
	// opinion: a value outside them breaks no rollout.
	RevisionHistoryBounds  Range
	ProgressDeadlineBounds Range
	BoundsEnforce          bool

	// GuardUsername is the guard's own service account user
	// (system:serviceaccount:NS:NAME): it alone may remove or reorder the guard's
	// finalizers, besides BreakGlassGroups.
	GuardUsername    string
	BreakGlassGroups []string

	// NativeInAPIServer says the guard's native policies (config/native)
	// are installed, so the API server enforces them and the webhook does
	// not evaluate them again. Native, when set, says whether the last check
	// found them enforced (NativeEnforced reads both).
	NativeInAPIServer bool
	Native            *NativeEnforcement
	// NativeProbeNamespace is where the floor probe is dry-run created
	// (floor.Probe); "" is "default".
	NativeProbeNamespace string

	// Quarantine is one of QuarantineEnforce, QuarantineWarn, QuarantineOff.
	Quarantine string

	// DisruptionBudgets is one of BudgetsWarn, BudgetsEnforce, BudgetsOff:
	// what admission does with a PodDisruptionBudget that allows no eviction
	// of a Deployment's pods at its replicas. Empty is BudgetsWarn.
	DisruptionBudgets string

	// ExemptNamespaces, ExemptUsernames and ExemptGroups skip the safety checks
	// and policies (not the finalizer and quarantine rules, which protect the
	// guard itself). They come from the config file only.
	ExemptNamespaces []string
	ExemptUsernames  []string
	ExemptGroups     []string
}

// Range is an inclusive [Min, Max].
type Range struct{ Min, Max int32 }

// exemption says why the spec checks and policies skip a request in
// namespace from user, or "" when they do not.
func (o *Options) exemption(namespace string, user authenticationv1.UserInfo) string {
	return o.exemptionOf(namespace, user.Username, user.Groups)
}

func (o *Options) exemptionOf(namespace, username string, groups []string) string {
	if slices.Contains(o.ExemptNamespaces, namespace) {
		return "namespace " + namespace + " is exempt from deployguard's checks"
	}
	if slices.Contains(o.ExemptUsernames, username) {
		return "user " + username + " is exempt from deployguard's checks"
	}
	for _, g := range groups {
		if slices.Contains(o.ExemptGroups, g) {
			return "group " + g + " of user " + username + " is exempt from deployguard's checks"
		}
	}
	return ""
}

// isGuard reports whether the request comes from the guard itself.
func (o *Options) isGuard(user authenticationv1.UserInfo) bool {
	return o.GuardUsername != "" && user.Username == o.GuardUsername
}

// mayManageFinalizers reports whether user may remove or reorder the guard's
// finalizers.
func (o *Options) mayManageFinalizers(user authenticationv1.UserInfo) bool {
	if o.isGuard(user) {
		return true
	}
	for _, g := range user.Groups {
		if slices.Contains(o.BreakGlassGroups, g) {
			return true
		}
	}
	return false
}
