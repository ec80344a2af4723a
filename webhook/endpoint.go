package webhook

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/deployguard/deployguard/webhook/bodylimit"
)

// Endpoint serves one webhook over HTTP as controller-runtime's
// admission.Webhook does, with one pass less over each request: an
// admission.k8s.io/v1 AdmissionReview sent as JSON, the only kind the API
// server sends the guard (admissionReviewVersions: [v1]), is decoded
// directly, in one pass (decodeReview), with its objects for the handlers of
// Deployments. The Webhook's universal deserializer first reads the whole
// body once more to find its kind, about a tenth of the guard's CPU per
// admission under load. Anything else (another version, another content
// type, a JSON object that does not decode) goes to the Webhook as it came,
// so that its error answers are the Webhook's own. Two it gets no more: a
// body of the size limit or more, and one that is not a JSON object at all,
// are answered here as the Webhook answers them (413 and 400), without its
// second reading of the body. The Webhook decodes a body that does not start
// with '{' as YAML: 1 MiB of it cost 190 ms and 71 MB of allocations, where a
// good review of that size costs a tenth of it.
type Endpoint struct {
	*admission.Webhook
	// Deployments decodes the review's object and oldObject as apps/v1
	// Deployments in the same pass (runtime.RawExtension's Object, beside
	// Raw; decodeDeployment takes it): decoding the review and then the
	// object read every byte of the object twice.
	Deployments bool
	// SkipCreatePodSpec, with Deployments, leaves the pod spec
	// (spec.template.spec) of a CREATE's object undecoded: it is checked as
	// JSON, not built. The validating webhook reads a create's pod template
	// only through its labels and through the Rego policies' input, which is
	// built from the object's bytes; the pod spec is most of a Deployment
	// (its containers and their env): building it was an eighth of the
	// validating webhook's CPU per create (BenchmarkValidatingDefaultInstall).
	// An UPDATE decodes it: the quarantine hashes the templates
	// and the native policies compare them. The API server sends objects it
	// decoded itself, so a pod spec of the wrong types comes only from
	// another client; it is then read by the policies as it is.
	SkipCreatePodSpec bool
	// SkipManagedFields, with Deployments, leaves the objects'
	// metadata.managedFields undecoded (checked as JSON): the server-side
	// apply bookkeeping, which the validating webhook never reads, and which
	// is a third of a Deployment written by kubectl apply or a controller
	// (decoding it was 18 µs of the 320 µs the validating webhook spends on
	// a create, BenchmarkValidatingDefaultInstall). Those of the pod template
	// are decoded: the template's hash covers them.
	// Not for a webhook that answers with a patch of the object: the patch
	// would remove them.
	SkipManagedFields bool
	// BodyTimeout bounds how long a request's body may take to arrive once
	// its headers have; zero is DefaultBodyTimeout.
	BodyTimeout time.Duration
	// MaxBodyBytes refuses a body of that size or more (413); zero, or more
	// than MaxReviewBytes, is MaxReviewBytes. Only tests lower it.
	MaxBodyBytes int64
}

// DefaultBodyTimeout is how long a webhook request's body may take to
// arrive. The API server writes it at once and gives up on the call after
// the webhook's timeoutSeconds (at most 30 s); only a broken or hostile
// client is slower, and without a bound each such connection would hold a
// goroutine and the body's buffer (up to maxPresized) for as long as it
// liked. The server's own ReadHeaderTimeout bounds only the headers.
const DefaultBodyTimeout = 10 * time.Second

// MaxReviewBytes is the most a webhook request's body may hold, less one
// byte (bodylimit.Max says why).
const MaxReviewBytes = bodylimit.Max

// maxPresized bounds the buffer allocated for a body from its announced
// length: a review of a Deployment is tens of KB.
const maxPresized = 256 * 1024

var reviewV1 = admissionv1.SchemeGroupVersion.WithKind("AdmissionReview")

func (e *Endpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	setBodyDeadline(w, r, e.BodyTimeout)
	if r.Body == nil || r.Body == http.NoBody || r.Header.Get("Content-Type") != "application/json" {
		e.Webhook.ServeHTTP(w, r)
		return
	}
	limit := e.MaxBodyBytes
	if limit <= 0 || limit > MaxReviewBytes {
		limit = MaxReviewBytes
	}
	body, err := readBody(io.LimitReader(r.Body, limit), min(r.ContentLength, limit))
	var ar admissionv1.AdmissionReview
	ok := false
	switch {
	case err != nil:
	case int64(len(body)) >= limit:
		// The Webhook's answer, without reading the body once more.
		bodylimit.Refuse(w, http.StatusRequestEntityTooLarge, bodylimit.TooLarge(limit),
			"unable to read the body from the incoming request; limit reached")
		return
	default:
		if ar, ok = decodeReview(body, e.Deployments, skips{createPodSpec: e.SkipCreatePodSpec, managedFields: e.SkipManagedFields}); !ok && bodylimit.NotJSONObject(body) {
			bodylimit.Refuse(w, http.StatusBadRequest, bodylimit.ErrNotJSONObject, "unable to decode the request")
			return
		}
	}
	if !ok {
		// Replayed, with whatever was not read yet, or the error the read
		// ended with: the Webhook refuses a body of its limit or more.
		orig, rest := r.Body, r.Body
		if err != nil {
			rest = io.NopCloser(failingReader{err})
			// HTTP/1.1: the rest of the body is still on the connection,
			// or the connection broke; the next request cannot be read
			// from it. (HTTP/2 frames each stream: its connection carries
			// on, and a Connection header would close it for every stream.)
			if r.ProtoMajor == 1 {
				w.Header().Set("Connection", "close")
			}
		}
		r.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(body), rest), r.Body}
		e.Webhook.ServeHTTP(w, r)
		// The server looks at the request's own body once the handler
		// returns, to tell whether the connection can be read on (a body
		// over the limit was not read to its end).
		r.Body = orig
		return
	}
	_ = r.Body.Close()
	ctx := r.Context()
	if e.WithContextFunc != nil {
		ctx = e.WithContextFunc(ctx, r)
	}
	resp := e.Handle(ctx, admission.Request{AdmissionRequest: *ar.Request})
	out := admissionv1.AdmissionReview{Response: &resp.AdmissionResponse}
	out.SetGroupVersionKind(reviewV1)
	if err := json.NewEncoder(w).Encode(out); err != nil {
		// The connection failed: the API server sees it as such.
		ctrl.Log.WithName("admission").Error(err, "unable to write the admission response")
	}
}

// decodeReview decodes body if it is an admission.k8s.io/v1 AdmissionReview
// with a request, in one pass (decodeDeployment says why v2's decoder), its
// objects as Deployments too when deployments is set, without what skip
// leaves out. A body whose object does not decode as a Deployment is not
// decoded here: the Webhook's own decoding gives the handler the bytes, and
// the handler its answer.
func decodeReview(body []byte, deployments bool, skip skips) (admissionv1.AdmissionReview, bool) {
	if deployments {
		return decodeDeploymentReview(body, skip)
	}
	var ar admissionv1.AdmissionReview
	if jsonv2.Unmarshal(body, &ar, v1Semantics) != nil || ar.GroupVersionKind() != reviewV1 || ar.Request == nil {
		return admissionv1.AdmissionReview{}, false
	}
	return ar, true
}

// skips are what decoding a review's Deployments leaves out, its JSON only
// checked: a CREATE's pod spec (Endpoint.SkipCreatePodSpec), the managed
// fields (Endpoint.SkipManagedFields).
type skips struct{ createPodSpec, managedFields bool }

// deploymentReview is an AdmissionReview whose objects decode as
// Deployments as they are read.
type deploymentReview struct {
	metav1.TypeMeta `json:",inline"`
	Request         requestMember `json:"request"`
}

// requestMember is the review's request, decoded as the pointer of
// admissionv1.AdmissionReview is: none until a request member is read, none
// again after a null one, and a repeated member decoded into the first.
type requestMember struct {
	body []byte // the whole review, which the decoder reads
	skip skips
	req  *deploymentRequest
}

func (m *requestMember) UnmarshalJSONFrom(dec *jsontext.Decoder) error {
	if dec.PeekKind() == 'n' {
		_, err := dec.ReadToken()
		m.req = nil
		return err
	}
	if m.req == nil {
		m.req = &deploymentRequest{}
		m.req.Object = deploymentObject{body: m.body, req: m.req, skip: m.skip}
		m.req.OldObject = deploymentObject{body: m.body, req: m.req, skip: skips{managedFields: m.skip.managedFields}}
	}
	return jsonv2.UnmarshalDecode(dec, m.req, v1Semantics)
}

type deploymentRequest struct {
	admissionv1.AdmissionRequest `json:",inline"`
	Object                       deploymentObject `json:"object"`
	OldObject                    deploymentObject `json:"oldObject"`
}

// deploymentObject is one object of the review: its bytes, as
// RawExtension's UnmarshalJSON keeps them (a null member changes nothing),
// and the Deployment they decode to.
type deploymentObject struct {
	body []byte // the whole review, which the decoder reads
	req  *deploymentRequest
	skip skips
	// podSpecSkipped: the pod spec was left out, the request read so far
	// being a CREATE (the API server writes the operation before the
	// object).
	podSpecSkipped bool
	raw            runtime.RawExtension
}

func (o *deploymentObject) UnmarshalJSONFrom(dec *jsontext.Decoder) error {
	if dec.PeekKind() == 'n' {
		_, err := dec.ReadToken()
		return err
	}
	start := dec.InputOffset()
	d := &appsv1.Deployment{}
	o.podSpecSkipped = o.skip.createPodSpec && o.req.Operation == admissionv1.Create
	if err := jsonv2.UnmarshalDecode(dec, d, decodeOptions[skips{createPodSpec: o.podSpecSkipped, managedFields: o.skip.managedFields}]); err != nil {
		return err
	}
	// From the end of the member's name: the separator, then the value.
	o.raw = runtime.RawExtension{Raw: bytes.TrimLeft(o.body[start:dec.InputOffset()], " \t\r\n:"), Object: d}
	return nil
}

var (
	skipPodSpec = jsonv2.UnmarshalFromFunc(func(dec *jsontext.Decoder, _ *corev1.PodSpec) error { return dec.SkipValue() })
	// Only ObjectMeta.ManagedFields has this type, but a Deployment has two:
	// its own, skipped, and its pod template's, decoded (errors.ErrUnsupported:
	// as without this function), since the template's hash covers them.
	skipManagedFields = jsonv2.UnmarshalFromFunc(func(dec *jsontext.Decoder, _ *[]metav1.ManagedFieldsEntry) error {
		if !objectManagedFields(dec.StackPointer()) {
			return errors.ErrUnsupported
		}
		return dec.SkipValue()
	})
	// decodeOptions decode as v1Semantics, but for what they skip, whose
	// JSON is only checked (createPodSpec: the pod spec, whatever the
	// operation).
	decodeOptions = map[skips]jsonv2.Options{
		{}:                    v1Semantics,
		{managedFields: true}: jsonv2.JoinOptions(v1Semantics, jsonv2.WithUnmarshalers(skipManagedFields)),
		{createPodSpec: true}: jsonv2.JoinOptions(v1Semantics, jsonv2.WithUnmarshalers(skipPodSpec)),
		{createPodSpec: true, managedFields: true}: jsonv2.JoinOptions(v1Semantics,
			jsonv2.WithUnmarshalers(jsonv2.JoinUnmarshalers(skipPodSpec, skipManagedFields))),
	}
)

// objectManagedFields: p, where a review's decoder stands, is the managed
// fields of the review's object or oldObject themselves, or of a Deployment
// decoded alone (the fallback of decodeDeploymentReview), not of a pod
// template within one.
func objectManagedFields(p jsontext.Pointer) bool {
	s := string(p)
	return s == "/metadata/managedFields" || strings.HasSuffix(s, "/object/metadata/managedFields") ||
		strings.HasSuffix(s, "/oldObject/metadata/managedFields")
}

func decodeDeploymentReview(body []byte, skip skips) (admissionv1.AdmissionReview, bool) {
	dr := deploymentReview{Request: requestMember{body: body, skip: skip}}
	if jsonv2.Unmarshal(body, &dr, v1Semantics) != nil || dr.GroupVersionKind() != reviewV1 || dr.Request.req == nil {
		return admissionv1.AdmissionReview{}, false
	}
	r := dr.Request.req
	if o := &r.Object; o.podSpecSkipped && r.Operation != admissionv1.Create {
		// The operation changed after the object (a repeated member): the
		// object is decoded whole after all (but what skip.managedFields
		// leaves out).
		d := &appsv1.Deployment{}
		if err := jsonv2.Unmarshal(o.raw.Raw, d, decodeOptions[skips{managedFields: skip.managedFields}]); err != nil {
			return admissionv1.AdmissionReview{}, false
		}
		o.raw.Object = d
	}
	req := r.AdmissionRequest
	req.Object, req.OldObject = r.Object.raw, r.OldObject.raw
	return admissionv1.AdmissionReview{TypeMeta: dr.TypeMeta, Request: &req}, true
}

// readBody reads r to its end as io.ReadAll does, into a buffer of size
// bytes to start with: the API server says how long its request is, and
// io.ReadAll's doubling from 512 bytes allocates about twice a review's
// size in copies. At most maxPresized bytes are allocated before they
// arrive: a client that only announces a large body must not make the
// guard hold that much memory for it.
func readBody(r io.Reader, size int64) ([]byte, error) {
	if size < 0 {
		size = 512
	}
	size = min(size, maxPresized)
	b := make([]byte, 0, size+1) // +1: the read that sees the end needs room
	for {
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
	}
}

// WithBodyTimeout bounds how long a request's body may take to arrive, for
// a handler on the webhook port that is not an Endpoint (which bounds its
// own): d zero is DefaultBodyTimeout.
func WithBodyTimeout(d time.Duration, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		setBodyDeadline(w, r, d)
		next.ServeHTTP(w, r)
	})
}

// setBodyDeadline sets the connection's read deadline d (zero:
// DefaultBodyTimeout) from now when the request has a body. Go's server
// lifts it once the body has been read to its end (its background read
// starts there, and an HTTP/2 stream's timer does nothing after it), so the
// handling after the body is not bounded by it. Without a body the
// background read has already begun, and a deadline met there would cancel
// the request's context: none is set. The error is ErrNotSupported only
// where there is no connection to bound (a test's recorder).
func setBodyDeadline(w http.ResponseWriter, r *http.Request, d time.Duration) {
	if r.Body == nil || r.Body == http.NoBody {
		return
	}
	if d <= 0 {
		d = DefaultBodyTimeout
	}
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(d))
}

// failingReader fails every read with err.
type failingReader struct{ err error }

func (f failingReader) Read([]byte) (int, error) { return 0, f.err }
