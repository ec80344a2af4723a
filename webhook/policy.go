package webhook

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/util/validation/field"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/deployguard/deployguard/policy"
)

// RegoPolicies runs the cluster's Rego policies (policy.Engine) for the
// validating webhook and the offline check alike, so both give the same
// verdict with the same words.
type RegoPolicies struct {
	Engine *policy.Engine
}

var _ PolicyEvaluator = RegoPolicies{}

// EvaluateDeployment evaluates the active policy set. Denials become field
// errors at the rule's field path; warnings become admission warnings; audit
// findings are only logged (and counted by the engine).
func (p RegoPolicies) EvaluateDeployment(ctx context.Context, in PolicyInput) PolicyVerdict {
	req := policy.Request{
		Operation: in.Operation, Namespace: in.Namespace, NamespaceLabels: in.NamespaceLabels,
		UserInfo: policy.UserInfo{Username: in.UserInfo.Username, UID: in.UserInfo.UID, Groups: in.UserInfo.Groups},
		DryRun:   in.DryRun,
	}
	if in.Object != nil {
		req.Object, req.Name = in.Object, in.Object.Name
		if len(in.ObjectRaw) > 0 {
			req.Object = in.ObjectRaw
		}
	}
	if in.OldObject != nil {
		req.OldObject = in.OldObject
		if len(in.OldObjectRaw) > 0 {
			req.OldObject = in.OldObjectRaw
		}
		if req.Name == "" {
			req.Name = in.OldObject.Name
		}
	}
	d, err := p.Engine.EvaluateRequest(ctx, req)
	if err != nil {
		// An object the policies cannot read is refused: an enforce policy
		// would otherwise be skipped silently.
		return PolicyVerdict{Denials: field.ErrorList{field.InternalError(field.NewPath("metadata"),
			fmt.Errorf("the policies could not read this Deployment: %w", err))}}
	}
	var v PolicyVerdict
	for _, f := range d.Denied {
		path := f.Field
		if path == "" {
			path = "spec"
		}
		v.Denials = append(v.Denials, &field.Error{
			Type: field.ErrorTypeForbidden, Field: path, BadValue: "",
			Detail: fmt.Sprintf("[policy %s] %s", f.Policy, f.Message),
		})
	}
	v.Warnings = policy.Lines(d.Warnings)
	if len(d.Audited) > 0 {
		ctrl.LoggerFrom(ctx).Info("audit-mode policy findings", "reason", "PolicyAudit",
			"namespace", in.Namespace, "name", req.Name, "findings", policy.Lines(d.Audited))
	}
	return v
}
