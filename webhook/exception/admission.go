package exception

import (
	"context"
	"fmt"
	"net/http"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	kjson "sigs.k8s.io/json"
)

// WebhookPath is where the guard serves the PolicyException webhook.
const WebhookPath = "/validate-deployguard-io-v1alpha1-policyexception"

// Validator refuses a PolicyException that Validate finds wrong: what the
// CRD's schema cannot know (the configured maximum duration and namespace,
// the loaded policies, the clock) with what to change.
type Validator struct {
	// Limits gives the limits at the time of the request: the policy names
	// change with the loaded set.
	Limits func() Limits
	// Now is the clock; nil is time.Now.
	Now func() time.Time
}

// Handle implements admission.Handler.
func (v *Validator) Handle(_ context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return admission.Allowed("")
	}
	pe := &PolicyException{}
	if err := kjson.UnmarshalCaseSensitivePreserveInts(req.Object.Raw, pe); err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("cannot decode the object as a PolicyException: %w", err))
	}
	if pe.Namespace == "" {
		pe.Namespace = req.Namespace
	}
	now := time.Now
	if v.Now != nil {
		now = v.Now
	}
	errs := Validate(pe, now(), v.Limits())
	if len(errs) == 0 {
		return admission.Allowed("")
	}
	st := apierrors.NewInvalid(GroupVersion.WithKind(Kind).GroupKind(), pe.Name, errs).Status()
	return admission.Response{AdmissionResponse: admissionv1.AdmissionResponse{Allowed: false, Result: &st}}
}
