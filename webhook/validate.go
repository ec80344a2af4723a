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
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	kjson "sigs.k8s.io/json"
)

// validator serves the validating webhook. It is not an admission.Validator:
// the object is decoded straight into an apps/v1 Deployment (the request's
// kind is checked before), without the scheme's decoder, which first reads
// the whole object once more to find its kind; and it keeps the findings,
// whose first problem is the refusal's reason (refusalReason).
type validator struct{ w *Deployment }

func (v validator) handle(ctx context.Context, req admission.Request) (admission.Response, string) {
	ctx = admission.NewContextWithRequest(ctx, req)
	var (
		f    Findings
		name string
	)
	switch req.Operation {
	case admissionv1.Create:
		d, err := decodeDeployment(req.Object)
		if err != nil {
			return malformed(fmt.Errorf("cannot decode the object as an apps/v1 Deployment: %w", err))
		}
		f, name = v.w.validate(ctx, req, d, nil), d.Name
	case admissionv1.Update:
		d, err := decodeDeployment(req.Object)
		if err != nil {
			return malformed(fmt.Errorf("cannot decode the object as an apps/v1 Deployment: %w", err))
		}
		old, err := decodeDeployment(req.OldObject)
		if err != nil {
			return malformed(fmt.Errorf("cannot decode oldObject as an apps/v1 Deployment: %w", err))
		}
		f, name = v.w.validate(ctx, req, d, old), d.Name
	case admissionv1.Delete:
		old, err := decodeDeployment(req.OldObject)
		if err != nil {
			return malformed(fmt.Errorf("cannot decode oldObject as an apps/v1 Deployment: %w", err))
		}
		f, name = v.w.validateDelete(req, old), old.Name
	default:
		return admission.Allowed(""), reasonNone
	}
	if len(f.Errs) > 0 {
		return invalid(name, f.Errs, f.Warnings)
	}
	return admission.Allowed("").WithWarnings(f.Warnings...), reasonNone
}

// invalid refuses a Deployment for errs, all of them in one Invalid status as
// the API server's own validation does, and gives the reason to count it by.
func invalid(name string, errs field.ErrorList, warnings []string) (admission.Response, string) {
	st := apierrors.NewInvalid(deploymentGK, name, errs).Status()
	resp := admission.Response{AdmissionResponse: admissionv1.AdmissionResponse{Allowed: false, Result: &st}}
	return resp.WithWarnings(warnings...), refusalReason(errs)
}

// malformed answers a request the guard cannot read.
func malformed(err error) (admission.Response, string) {
	return admission.Errored(http.StatusBadRequest, err), reasonMalformed
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
