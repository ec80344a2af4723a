package webhook

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

var deploymentGK = appsv1.SchemeGroupVersion.WithKind("Deployment").GroupKind()

// PolicyEvaluator runs the cluster's Rego policies on an admission request. The
// webhook only needs its verdict; policy/ owns how it is reached.
type PolicyEvaluator interface {
	EvaluateDeployment(ctx context.Context, in PolicyInput) PolicyVerdict
}

// PolicyInput is what the webhook knows about a request.
type PolicyInput struct {
	Operation string
	Object    *appsv1.Deployment
	OldObject *appsv1.Deployment
	// ObjectRaw and OldObjectRaw, when set, are the same objects as the API
	// server sent them; the policies read them without encoding Object again.
	ObjectRaw       []byte
	OldObjectRaw    []byte
	Namespace       string
	NamespaceLabels map[string]string
	UserInfo        authenticationv1.UserInfo
	DryRun          bool
}

// PolicyVerdict is what the policies decided: denials refuse the request,
// warnings reach the client.
type PolicyVerdict struct {
	Denials  field.ErrorList
	Warnings []string
}

// Deployment is the admission webhook pair for apps/v1 Deployments.
type Deployment struct {
	Options *Options
	// Overlaps finds the namespace's Deployments the overlap check compares
	// with; nil skips the check.
	Overlaps OverlapSource
	// Policy, when set, runs the Rego policies after the Go checks.
	Policy PolicyEvaluator
	// NamespaceLabels, when set, gives policies the namespace's labels.
	NamespaceLabels func(ctx context.Context, namespace string) (map[string]string, error)
}

// validateDelete refuses the deletion of a protected Deployment. The namespace
// controller is let through, so that deleting a namespace always completes.
func (w *Deployment) validateDelete(req admission.Request, d *appsv1.Deployment) Findings {
	if req.UserInfo.Username == namespaceControllerUser {
		return Findings{}
	}
	return CheckDelete(d)
}

const namespaceControllerUser = "system:serviceaccount:kube-system:namespace-controller"

// validate runs the Go checks, then the policies, on a CREATE (old nil) or an
// UPDATE.
func (w *Deployment) validate(ctx context.Context, req admission.Request, d, old *appsv1.Deployment) Findings {
	f := Validate(ctx, d, old, req.UserInfo, w.Options, w.Overlaps)
	// Policies run even when a Go check failed: the user sees every problem of
	// the request at once.
	if w.Policy != nil && !w.Options.exempt(d.Namespace, req.UserInfo) && !w.Options.isGuard(req.UserInfo) {
		in := PolicyInput{
			Operation: string(req.Operation), Object: d, OldObject: old,
			ObjectRaw: req.Object.Raw, OldObjectRaw: req.OldObject.Raw,
			Namespace: d.Namespace, UserInfo: req.UserInfo, DryRun: req.DryRun != nil && *req.DryRun,
		}
		if w.NamespaceLabels != nil {
			// Without the labels, rules that need them see none; the request is
			// not refused for a cache miss.
			in.NamespaceLabels, _ = w.NamespaceLabels(ctx, d.Namespace)
		}
		v := w.Policy.EvaluateDeployment(ctx, in)
		// Whatever the evaluator denies, the policies denied.
		f.Errs = append(f.Errs, v.Denials.WithOrigin(reasonPolicy)...)
		f.Warnings = append(f.Warnings, v.Warnings...)
	}
	return f
}

// Validate runs the Go checks of the validating webhook; old is nil on CREATE.
// overlaps may be nil, which skips the overlap check.
func Validate(ctx context.Context, d, old *appsv1.Deployment, user authenticationv1.UserInfo, o *Options, overlaps OverlapSource) Findings {
	var f Findings
	f.merge(CheckFinalizers(d, old, o.mayManageFinalizers(user)))
	f.merge(CheckQuarantine(d, old, o.Quarantine))
	// The guard's own writes (rollback to a known-good template, drain, finalizer
	// removal) must never be refused by a rule added after the Deployment was
	// created: that would leave a failed rollout in place or a deletion stuck.
	// An update that leaves the spec as it was cannot make the spec worse, so
	// metadata-only changes (lifting a protection, annotating) always pass.
	if o.exempt(d.Namespace, user) || o.isGuard(user) || (old != nil && apiequality.Semantic.DeepEqual(old.Spec, d.Spec)) {
		return f
	}
	f.merge(CheckSpec(d, o))
	if overlaps != nil && overlapMayChange(d, old) {
		others, err := overlaps.OverlapCandidates(ctx, d)
		if err != nil {
			f.Errs = append(f.Errs, field.InternalError(specPath.Child("selector"),
				fmt.Errorf("could not look up the namespace's Deployments to check for overlapping selectors, try again: %w", err)))
			return f
		}
		now := CheckOverlap(d, others)
		if old != nil && len(now.Errs) > 0 && len(checkOverlapOf(ctx, old, overlaps).Errs) > 0 {
			// The overlap predates this update; refusing it would block
			// unrelated changes such as a rollback.
			now = Findings{Warnings: []string{OverlapWarning(now.Errs[0])}}
		}
		f.merge(now)
	}
	return f
}

// OverlapWarning is the warning that replaces an overlap refusal when the
// overlap predates the update; the audit reports a stored Deployment's
// overlaps with it too.
func OverlapWarning(e *field.Error) string {
	return "spec.selector: this Deployment's pods overlap with another Deployment's; " + e.Detail
}

// checkOverlapOf checks the stored object's overlaps: an overlap that
// predates an update only warns.
func checkOverlapOf(ctx context.Context, old *appsv1.Deployment, overlaps OverlapSource) Findings {
	others, err := overlaps.OverlapCandidates(ctx, old)
	if err != nil {
		return Findings{}
	}
	return CheckOverlap(old, others)
}

// overlapMayChange: the selector is immutable, so only a new object or new
// template labels can create an overlap.
func overlapMayChange(d, old *appsv1.Deployment) bool {
	if old == nil {
		return true
	}
	if len(d.Spec.Template.Labels) != len(old.Spec.Template.Labels) {
		return true
	}
	for k, v := range d.Spec.Template.Labels {
		if old.Spec.Template.Labels[k] != v {
			return true
		}
	}
	return false
}
