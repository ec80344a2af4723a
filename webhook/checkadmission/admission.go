// Package checkadmission is the validating webhook of the metric checks
// (ClusterDeploymentCheck and DeploymentCheck, deployguard.io/v1alpha1): it
// refuses at `kubectl apply` what the CRDs' schemas cannot know, with every
// problem at its field path. The judging is package checks' (the reconciler
// runs the same code on what it selects); this package only translates it
// into an admission answer.
package checkadmission

import (
	"context"
	"fmt"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	kjson "sigs.k8s.io/json"

	"github.com/deployguard/deployguard/reconciler/analysis/checks"
)

// WebhookPath is where the guard serves the webhook of both kinds
// (config/webhook/manifests.yaml, validate.deploymentchecks.deployguard.io).
const WebhookPath = "/validate-deployguard-io-v1alpha1-deploymentchecks"

// Validator refuses a check that checks.CompileCluster or
// checks.CompileNamespaced finds wrong: a condition or a query that does not
// parse, a tenant's query that names another namespace, a selector that does
// not parse, a metric with no condition, Argo's count and limit rules, a
// query, condition or name past its length limit (the CRDs' schemas refuse
// those first; the webhook refuses them too when a schema is older).
type Validator struct{}

var _ admission.Handler = Validator{}

// Handle implements admission.Handler.
func (Validator) Handle(_ context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return admission.Allowed("")
	}
	kind := req.Kind.Kind
	switch kind {
	case checks.ClusterKind:
		c, old := &checks.ClusterDeploymentCheck{}, &checks.ClusterDeploymentCheck{}
		oldDecoded, err := decode(req, c, old)
		if err != nil {
			return admission.Errored(http.StatusBadRequest, fmt.Errorf("cannot decode the object as a %s: %w", kind, err))
		}
		if oldDecoded && equality.Semantic.DeepEqual(c.Spec, old.Spec) {
			return admission.Allowed("")
		}
		_, errs := checks.CompileCluster(c)
		return verdict(kind, c.Name, errs)
	case checks.NamespacedKind:
		c, old := &checks.DeploymentCheck{}, &checks.DeploymentCheck{}
		oldDecoded, err := decode(req, c, old)
		if err != nil {
			return admission.Errored(http.StatusBadRequest, fmt.Errorf("cannot decode the object as a %s: %w", kind, err))
		}
		if oldDecoded && equality.Semantic.DeepEqual(c.Spec, old.Spec) {
			return admission.Allowed("")
		}
		// A create's manifest may leave the namespace out: the API server
		// sends it beside the object.
		if c.Namespace == "" {
			c.Namespace = req.Namespace
		}
		_, errs := checks.CompileNamespaced(c)
		return verdict(kind, c.Name, errs)
	}
	return admission.Errored(http.StatusBadRequest, fmt.Errorf("this webhook judges %s and %s only, not %q: the webhook configuration's rules must send it those alone",
		checks.ClusterKind, checks.NamespacedKind, kind))
}

// decode decodes the request's object into obj and, for an update, its old
// object into old, reporting whether it could. An update that leaves the
// spec as it was is allowed unjudged: everything judged is in the spec (and
// the namespace, which never changes), and a check stored before the
// webhook judged it, or before a guard that judges more strictly, must
// still take a label or lose a finalizer. The reconciler reports such a
// check invalid and measures nothing of it.
func decode(req admission.Request, obj, old any) (oldDecoded bool, err error) {
	if err := kjson.UnmarshalCaseSensitivePreserveInts(req.Object.Raw, obj); err != nil {
		return false, err
	}
	if req.Operation != admissionv1.Update || len(req.OldObject.Raw) == 0 {
		return false, nil
	}
	return kjson.UnmarshalCaseSensitivePreserveInts(req.OldObject.Raw, old) == nil, nil
}

// verdict refuses with every problem at its field path, as the API server's
// own validation does, so that kubectl prints each one.
func verdict(kind, name string, errs field.ErrorList) admission.Response {
	if len(errs) == 0 {
		return admission.Allowed("")
	}
	st := apierrors.NewInvalid(checks.GroupVersion.WithKind(kind).GroupKind(), name, errs).Status()
	return admission.Response{AdmissionResponse: admissionv1.AdmissionResponse{Allowed: false, Result: &st}}
}
