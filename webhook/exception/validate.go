package exception

import (
	"fmt"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/deployguard/deployguard/webhook/origin"
)

// Checks are the spec checks an exception may name: bounds a platform team
// sets, which break no rollout, and the drain check (a singleton that is
// meant to be drained by hand).
var Checks = []string{origin.RevisionHistory, origin.ProgressDeadline, origin.DisruptionBudget}

// Invariants are the checks no exception covers, and why.
var Invariants = map[string]string{
	origin.Selector:   "an empty or mismatched selector cannot be run",
	origin.Strategy:   "a rollout that takes every replica down is an outage",
	origin.Overlap:    "two Deployments selecting the same pods fight over them",
	origin.Quarantine: "it has its own override, the annotation deployguard.io/allow-template",
	origin.Finalizers: "the guard's cleanup must run",
	origin.Size:       "it bounds what the guard keeps of every Deployment in memory, and the API server enforces it itself",
	origin.Protected:  "lift the protection with kubectl annotate instead",
}

// Limits are what the guard's configuration allows of an exception.
type Limits struct {
	// MaxDuration is how far ahead ExpiresAt may be.
	MaxDuration time.Duration
	// Namespace is the one namespace exceptions are honoured in.
	Namespace string
	// Policies are the names of the policies an exception may name; nil
	// skips that test (no policy set loaded).
	Policies []string
	// AllowExpired accepts an exception whose expiry has passed (it applies
	// to nothing): `deployguard check` reads exceptions kept in Git.
	AllowExpired bool
}

// Validate says what is wrong with e at now, each with what to change.
func Validate(e *PolicyException, now time.Time, l Limits) field.ErrorList {
	var errs field.ErrorList
	spec := field.NewPath("spec")
	if l.Namespace != "" && e.Namespace != l.Namespace {
		errs = append(errs, field.Forbidden(field.NewPath("metadata", "namespace"), fmt.Sprintf(
			"PolicyExceptions are honoured only in namespace %s, where only the platform team may write them: create it there", l.Namespace)))
	}
	m := spec.Child("match")
	if e.Spec.Match.Namespace == "" {
		errs = append(errs, field.Required(m.Child("namespace"), "name the namespace of the Deployments it covers: an exception never covers the whole cluster"))
	}
	if sel := e.Spec.Match.Selector; sel != nil {
		if len(sel.MatchLabels) == 0 && len(sel.MatchExpressions) == 0 {
			errs = append(errs, field.Invalid(m.Child("selector"), "{}", "an empty selector selects every Deployment: leave it out to cover the whole namespace, or give labels"))
		} else if _, err := metav1.LabelSelectorAsSelector(sel); err != nil {
			errs = append(errs, field.Invalid(m.Child("selector"), sel, err.Error()))
		}
		if len(e.Spec.Match.Names) > 0 {
			errs = append(errs, field.Invalid(m, "names and selector", "give names or a selector, not both"))
		}
	}
	for i, n := range e.Spec.Match.Names {
		if n == "" {
			errs = append(errs, field.Required(m.Child("names").Index(i), "a Deployment's name"))
		}
	}
	if len(e.Spec.Policies) == 0 && len(e.Spec.Checks) == 0 {
		errs = append(errs, field.Required(spec, "name what it exempts: spec.policies (Rego policies by name) or spec.checks ("+strings.Join(Checks, ", ")+")"))
	}
	for i, c := range e.Spec.Checks {
		p := spec.Child("checks").Index(i)
		switch why, invariant := Invariants[c]; {
		case invariant:
			errs = append(errs, field.Forbidden(p, fmt.Sprintf("%s is an invariant that no exception covers: %s", c, why)))
		case !slices.Contains(Checks, c):
			errs = append(errs, field.NotSupported(p, c, Checks))
		}
	}
	if l.Policies != nil {
		for i, name := range e.Spec.Policies {
			if !slices.Contains(l.Policies, name) {
				errs = append(errs, field.NotSupported(spec.Child("policies").Index(i), name, l.Policies))
			}
		}
	}
	exp := spec.Child("expiresAt")
	switch at := e.Spec.ExpiresAt.Time; {
	case at.IsZero():
		errs = append(errs, field.Required(exp, "every exception expires: give a date, at most "+days(l.MaxDuration)+" ahead"))
	case !at.After(now) && !l.AllowExpired:
		errs = append(errs, field.Invalid(exp, at.UTC().Format(time.RFC3339), "already passed: give a date in the future"))
	case l.MaxDuration > 0 && at.Sub(now) > l.MaxDuration && (!l.AllowExpired || e.CreationTimestamp.IsZero()):
		errs = append(errs, field.Invalid(exp, at.UTC().Format(time.RFC3339), fmt.Sprintf(
			"more than %s ahead (exceptions.maxDuration): give a date before %s, and renew it then if it is still needed",
			days(l.MaxDuration), now.Add(l.MaxDuration).UTC().Format(time.RFC3339))))
	}
	if strings.TrimSpace(e.Spec.Owner) == "" {
		errs = append(errs, field.Required(spec.Child("owner"), "who answers for this exception, e.g. a team"))
	}
	if strings.TrimSpace(e.Spec.Reason) == "" {
		errs = append(errs, field.Required(spec.Child("reason"), "why it is needed, with a ticket"))
	}
	return errs
}

func days(d time.Duration) string {
	if d%(24*time.Hour) == 0 {
		return fmt.Sprintf("%d days", int(d/(24*time.Hour)))
	}
	return d.String()
}
