package review

import (
	"context"
	"fmt"
	"slices"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/authentication/user"

	"github.com/deployguard/deployguard/policy"
	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/webhook/native"
	"github.com/deployguard/deployguard/webhook/origin"
)

// The guard's rules that need only the object are ValidatingAdmissionPolicies
// (config/native/policies.yaml), which the API server enforces itself. The
// guard evaluates the same policies in process where the API server does
// not: in `deployguard check`, in the audit, in its webhook when it does not
// enforce the refusals (Options.NativeEnforced false), and for the
// warnings and bounds, which are not bound in the API server.

// NativeSettings are the params the guard's policies read for o: what the
// guard writes into their params ConfigMap.
func (o *Options) NativeSettings() native.Settings {
	return native.Settings{
		GuardUsername: o.GuardUsername, BreakGlassGroups: o.BreakGlassGroups,
		ExemptNamespaces: o.ExemptNamespaces, ExemptUsernames: o.ExemptUsernames, ExemptGroups: o.ExemptGroups,
		RevisionHistoryMin: o.RevisionHistoryBounds.Min, RevisionHistoryMax: o.RevisionHistoryBounds.Max,
		ProgressDeadlineMin: o.ProgressDeadlineBounds.Min, ProgressDeadlineMax: o.ProgressDeadlineBounds.Max,
		StableLabelKeys: o.StableLabelKeys,
	}
}

// NativeChecks evaluates the named policies on req in process and turns what
// failed into findings, as the API server would answer: a refusal of
// deployguard-refusals refuses, a warning warns, and a bound refuses when the
// bounds are enforced. A policy that cannot be evaluated refuses where its
// failurePolicy is Fail (the refusals) and is skipped where it is Ignore.
func (o *Options) NativeChecks(ctx context.Context, req Request, policies ...string) Findings {
	var f Findings
	for _, g := range o.nativeChecksByPolicy(ctx, req, policies...) {
		f = append(f, g...)
	}
	return f
}

// nativeFindings evaluates, once, the native policies a chain reads: the
// refusals when refusals is set, the warnings and bounds when advice is.
func (o *Options) nativeFindings(ctx context.Context, req Request, refusals, advice bool) NativeFindings {
	switch {
	case refusals && advice:
		// One evaluation for both (the warnings' and bounds' run joins the
		// refusals' match condition), each policy's findings in their place.
		by := o.nativeChecksByPolicy(ctx, req, native.Refusals, native.Warnings, native.Bounds)
		return NativeFindings{Refusals: by[0], Advice: append(by[1], by[2]...)}
	case refusals:
		return NativeFindings{Refusals: o.NativeChecks(ctx, req, native.Refusals)}
	case advice:
		return NativeFindings{Advice: o.NativeChecks(ctx, req, native.Warnings, native.Bounds)}
	}
	return NativeFindings{}
}

// nativeChecksByPolicy is NativeChecks, the findings of each policy apart
// (in the order of policies), from one evaluation: a caller that places
// them apart pays for one.
func (o *Options) nativeChecksByPolicy(ctx context.Context, req Request, policies ...string) []Findings {
	out := make([]Findings, len(policies))
	rules, err := native.Load()
	if err != nil {
		out[0] = Findings{refuse(field.InternalError(field.NewPath("metadata"), err), origin.Internal)}
		return out
	}
	for _, x := range rules.Evaluate(ctx, nativeRequest(req), o.NativeSettings().Params(), policies...) {
		i := slices.Index(policies, x.Policy)
		if i < 0 {
			i = 0
		}
		f := &out[i]
		check := nativeOrigin(x.Field, x.Message)
		switch {
		case x.Error && x.Policy == native.Refusals:
			*f = append(*f, refuse(field.InternalError(field.NewPath("metadata"), fmt.Errorf("policy %s could not be evaluated: %s", x.Policy, x.Message)), origin.Internal))
		case x.Error:
		case x.Policy == native.Refusals || x.Policy == native.Bounds && o.BoundsEnforce:
			t := field.ErrorTypeInvalid
			if x.Reason == metav1.StatusReasonForbidden {
				t = field.ErrorTypeForbidden
			}
			r := refuse(&field.Error{Type: t, Field: x.Field, BadValue: field.OmitValueType{}, Detail: x.Message}, check)
			r.Message, r.Native = x.Message, true
			*f = append(*f, r)
		default:
			*f = append(*f, Finding{Origin: check, Mode: policy.ModeWarn, Severity: SeverityWarning, Field: x.Field, Message: x.Message, Native: true})
		}
	}
	return out
}

// FloorProbeRefusal is the line deployguard-refusals refuses a dry-run
// create of d by the guard itself with, as this guard evaluates it with its
// own params: what the API server must say to the floor probe
// (floor.ProbeDeployment) when it enforces the policy as this guard would. ""
// when the guard would admit d.
func (o *Options) FloorProbeRefusal(ctx context.Context, d *appsv1.Deployment) string {
	req := Request{Operation: admissionv1.Create, Object: d, DryRun: true,
		UserInfo: authenticationv1.UserInfo{Username: o.GuardUsername}}
	rules, err := native.Load()
	if err != nil {
		return ""
	}
	for _, f := range rules.Evaluate(ctx, nativeRequest(req), o.NativeSettings().Params(), native.Refusals) {
		if !f.Error {
			return f.Line()
		}
	}
	return ""
}

// nativeRequest is req as the native policies read it.
func nativeRequest(req Request) native.Request {
	in := native.Request{
		Operation: admission.Operation(req.Operation),
		Object:    req.Object, OldObject: req.OldObject,
		User:   &user.DefaultInfo{Name: req.UserInfo.Username, UID: req.UserInfo.UID, Groups: req.UserInfo.Groups},
		DryRun: req.DryRun,
	}
	if d := req.Object; d != nil {
		in.Namespace, in.Name = d.Namespace, d.Name
	} else if d := req.OldObject; d != nil {
		in.Namespace, in.Name = d.Namespace, d.Name
	}
	return in
}

// nativeOrigin is the check a policy's finding is about, from its field (and
// for the size bounds, which share fields with other rules, its message).
func nativeOrigin(f, message string) string {
	switch {
	case strings.HasSuffix(message, native.SizeBoundSuffix):
		return origin.Size
	case f == "spec.selector":
		return origin.Selector
	case strings.HasPrefix(f, "spec.strategy"):
		return origin.Strategy
	case f == "spec.revisionHistoryLimit":
		return origin.RevisionHistory
	case f == "spec.progressDeadlineSeconds":
		return origin.ProgressDeadline
	case strings.Contains(f, vocab.AnnotationProtected), f == "metadata.ownerReferences":
		return origin.Protected
	}
	// The finalizer rules, and the other rules of the metadata that judge
	// writes alone (deprecated.deployment.rollback.to).
	return origin.Finalizers
}
