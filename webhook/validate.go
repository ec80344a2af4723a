package webhook

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	jsonv1 "github.com/go-json-experiment/json/v1"
	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/deployguard/deployguard/webhook/review"
)

// validator serves the validating webhook. It is not an admission.Validator:
// the object is decoded straight into an apps/v1 Deployment (the request's
// kind is checked before), without the scheme's decoder, which first reads
// the whole object once more to find its kind; and it keeps the findings,
// whose first problem is the refusal's reason (refusalReason).
type validator struct{ reviewer *review.Reviewer }

func (v validator) handle(ctx context.Context, req admission.Request) (admission.Response, string) {
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update && req.Operation != admissionv1.Delete {
		return admission.Allowed(""), reasonNone
	}
	ctx = admission.NewContextWithRequest(ctx, req)
	r, name, resp, reason := decodeRequest(req)
	if r.Object == nil && r.OldObject == nil {
		return resp, reason
	}
	stage := review.Validating
	stage.Native = !v.reviewer.Options.NativeEnforced()
	rev := v.reviewer.Review(ctx, r, stage)
	if audited := auditedLines(rev.Findings); len(audited) > 0 {
		ctrl.LoggerFrom(ctx).Info("audit-mode policy findings", "reason", "PolicyAudit",
			"namespace", req.Namespace, "name", name, "findings", audited)
	}
	if errs := rev.Findings.Refusals(); len(errs) > 0 {
		return invalid(name, errs, rev.Findings.Warnings())
	}
	return admission.Allowed("").WithWarnings(rev.Findings.Warnings()...), reasonNone
}

// auditedLines are the findings of audit-mode policies, which are only logged.
func auditedLines(f review.Findings) []string {
	var out []string
	for _, x := range f {
		if x.Severity == review.SeverityInfo {
			out = append(out, x.Line())
		}
	}
	return out
}

// decodeRequest reads an admission request for a review: the object on
// CREATE and UPDATE, the stored object on UPDATE and DELETE. A request that
// cannot be read gets no objects, and the response that answers it.
func decodeRequest(req admission.Request) (r review.Request, name string, resp admission.Response, reason string) {
	r = review.Request{Operation: req.Operation, UserInfo: req.UserInfo, DryRun: req.DryRun != nil && *req.DryRun}
	var err error
	if req.Operation != admissionv1.Delete {
		if r.Object, err = decodeDeployment(req.Object); err != nil {
			resp, reason = malformed(fmt.Errorf("cannot decode the object as an apps/v1 Deployment: %w", err))
			return review.Request{}, "", resp, reason
		}
		r.ObjectRaw, name = req.Object.Raw, r.Object.Name
	}
	if req.Operation != admissionv1.Create {
		if r.OldObject, err = decodeDeployment(req.OldObject); err != nil {
			resp, reason = malformed(fmt.Errorf("cannot decode oldObject as an apps/v1 Deployment: %w", err))
			return review.Request{}, "", resp, reason
		}
		r.OldObjectRaw = req.OldObject.Raw
		if name == "" {
			name = r.OldObject.Name
		}
	}
	return r, name, resp, reason
}

var deploymentGK = appsv1.SchemeGroupVersion.WithKind("Deployment").GroupKind()

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
// sent it: JSON, case-sensitive, unknown fields ignored, as the API
// machinery's own decoder does (sigs.k8s.io/json; a Deployment has no
// untyped field whose integers it would keep). It decodes with
// encoding/json/v2's implementation, which reads the object in one pass
// where v1 validates it first and then decodes it: the typed decode was the
// largest single cost of an admission (about 1.8 times faster).
func decodeDeployment(raw runtime.RawExtension) (*appsv1.Deployment, error) {
	if len(raw.Raw) == 0 {
		return nil, errors.New("no object")
	}
	if d, ok := raw.Object.(*appsv1.Deployment); ok {
		return d, nil // decoded with the review (Endpoint.Deployments)
	}
	d := &appsv1.Deployment{}
	if err := jsonv2.Unmarshal(raw.Raw, d, v1Semantics); err != nil {
		return nil, err
	}
	return d, nil
}

// v1Semantics are the choices where encoding/json/v2 differs from the API
// machinery's decoder by default: a duplicate member is decoded into what
// the first one set (merged, as v1 does), a null leaves a value that is not
// a pointer, slice or map as it was, and invalid UTF-8 is replaced, not
// refused. Names match case-sensitively in both. The API server sends none
// of these; FuzzDecoding holds the two decoders to the same answers.
var v1Semantics = jsonv2.JoinOptions(jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true),
	jsonv1.MergeWithLegacySemantics(true))
