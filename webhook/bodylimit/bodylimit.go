// Package bodylimit bounds what an admission request's body may cost the
// guard before any handler reads it: its size, and a decoding of anything
// but JSON. controller-runtime's admission.Webhook reads up to 7 MiB and
// decodes a body that does not start with '{' as YAML, which costs many
// times a JSON review of the same size (1 MiB of YAML: 190 ms and 71 MB of
// allocations). The API server sends JSON objects only.
package bodylimit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/go-json-experiment/json/jsontext"
	admissionv1 "k8s.io/api/admission/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/deployguard/deployguard/webhook/boundedlog"
)

// Max is the most a webhook request's body may hold, less one byte:
// controller-runtime's admission.Webhook's own limit (7 MiB), which the
// guard keeps. The API server sends at most two objects of its own request
// limit (3 MiB each: object and oldObject of an UPDATE) and an envelope; a
// body that size costs the guard about twice its size in memory while it is
// read and decoded, and nothing once answered.
const Max = 7 * 1024 * 1024

// ErrNotJSONObject answers a body that is not a JSON object.
var ErrNotJSONObject = errors.New("the body is not a JSON object: an admission.k8s.io/v1 AdmissionReview is sent as JSON")

// Handler reads a request's body for next, a controller-runtime
// admission.Webhook, and refuses it first, as the Webhook would (413 or
// 400), when it holds Max bytes or more or is not a JSON object.
func Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody {
			next.ServeHTTP(w, r)
			return
		}
		orig := r.Body
		body, err := io.ReadAll(io.LimitReader(r.Body, Max))
		switch {
		case err != nil:
			Refuse(w, http.StatusBadRequest, err, "unable to read the body from the incoming request")
			return
		case len(body) >= Max:
			Refuse(w, http.StatusRequestEntityTooLarge, TooLarge(Max), "unable to read the body from the incoming request; limit reached")
			return
		case NotJSONObject(body):
			Refuse(w, http.StatusBadRequest, ErrNotJSONObject, "unable to decode the request")
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		next.ServeHTTP(w, r)
		r.Body = orig
	})
}

// TooLarge is the Webhook's error for a body of limit bytes or more.
func TooLarge(limit int64) error {
	return fmt.Errorf("request entity is too large; limit is %d bytes", limit)
}

// NotJSONObject reports whether body holds something other than a JSON
// object (duplicate names and invalid UTF-8 allowed, as the guard's
// decoding allows them): the Webhook would read it as YAML. An empty body
// costs the Webhook nothing and is not refused here.
func NotJSONObject(body []byte) bool {
	v := jsontext.Value(bytes.TrimLeft(body, " \t\r\n"))
	return len(v) > 0 && (v[0] != '{' || !v.IsValid(jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true)))
}

// Refuse answers as the Webhook answers what it cannot read (an
// AdmissionReview with the error's status and no request ID), and logs why
// as it does, bounded.
func Refuse(w http.ResponseWriter, code int32, err error, why string) {
	log := boundedlog.Logger(ctrl.Log.WithName("admission"))
	log.Error(err, why)
	resp := admission.Errored(code, err)
	if err := json.NewEncoder(w).Encode(admissionv1.AdmissionReview{Response: &resp.AdmissionResponse}); err != nil {
		log.Error(err, "unable to write the admission response")
	}
}
