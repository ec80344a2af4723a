package webhook

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	kjson "sigs.k8s.io/json"
)

// validator serves the validating webhook with the admission.Validator
// methods of Deployment. It is controller-runtime's validator handler but for
// the decoding: the object is decoded straight into an apps/v1 Deployment
// (the request's kind is checked before), without the scheme's decoder,
// which first reads the whole object once more to find its kind.
type validator struct{ w *Deployment }

func (v validator) Handle(ctx context.Context, req admission.Request) admission.Response {
	ctx = admission.NewContextWithRequest(ctx, req)
	var (
		warnings admission.Warnings
		err      error
	)
	switch req.Operation {
	case admissionv1.Create:
		d, derr := decodeDeployment(req.Object)
		if derr != nil {
			return admission.Errored(http.StatusBadRequest, fmt.Errorf("cannot decode the object as an apps/v1 Deployment: %w", derr))
		}
		warnings, err = v.w.ValidateCreate(ctx, d)
	case admissionv1.Update:
		d, derr := decodeDeployment(req.Object)
		if derr != nil {
			return admission.Errored(http.StatusBadRequest, fmt.Errorf("cannot decode the object as an apps/v1 Deployment: %w", derr))
		}
		old, derr := decodeDeployment(req.OldObject)
		if derr != nil {
			return admission.Errored(http.StatusBadRequest, fmt.Errorf("cannot decode oldObject as an apps/v1 Deployment: %w", derr))
		}
		warnings, err = v.w.ValidateUpdate(ctx, old, d)
	case admissionv1.Delete:
		old, derr := decodeDeployment(req.OldObject)
		if derr != nil {
			return admission.Errored(http.StatusBadRequest, fmt.Errorf("cannot decode oldObject as an apps/v1 Deployment: %w", derr))
		}
		warnings, err = v.w.ValidateDelete(ctx, old)
	default:
		return admission.Allowed("")
	}
	if err != nil {
		var st apierrors.APIStatus
		if errors.As(err, &st) {
			status := st.Status()
			return admission.Response{AdmissionResponse: admissionv1.AdmissionResponse{Allowed: false, Result: &status}}.WithWarnings(warnings...)
		}
		return admission.Denied(err.Error()).WithWarnings(warnings...)
	}
	return admission.Allowed("").WithWarnings(warnings...)
}

// decodeDeployment decodes an admission request's object as the API server
// sent it: JSON, case-sensitive, integers kept, unknown fields ignored, as
// the API machinery's own decoder does.
func decodeDeployment(raw runtime.RawExtension) (*appsv1.Deployment, error) {
	if len(raw.Raw) == 0 {
		return nil, errors.New("no object")
	}
	d := &appsv1.Deployment{}
	if err := kjson.UnmarshalCaseSensitivePreserveInts(raw.Raw, d); err != nil {
		return nil, err
	}
	return d, nil
}
