package webhook

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	goruntime "runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/deployguard/deployguard/policy"
	"github.com/deployguard/deployguard/test/harness"
	"github.com/deployguard/deployguard/webhook/bodylimit"
	"github.com/deployguard/deployguard/webhook/review"
	"github.com/deployguard/deployguard/webhook/review/reviewtest"
)

// TestEndpointAnswersAsTheWebhook: the one-pass decoding changes nothing a
// client sees. Every JSON object, well-formed or not, of the one version the
// API server sends or another, and a body over the limit, get the same
// status and the same bytes from the Endpoint as from the controller-runtime
// Webhook it wraps. (What is not a JSON object is answered by the Endpoint
// in its own words: TestNotJSONIsRefusedWithoutTheWebhook.)
func TestEndpointAnswersAsTheWebhook(t *testing.T) {
	mutating, validating := servers(t)
	d := reviewtest.Stored()
	bad := d.DeepCopy()
	bad.Spec.Selector = nil
	bad.Spec.Template.Labels = map[string]string{"version": "1"}
	v1 := reviewBody(t, admissionv1.Create, d, nil)
	bodies := map[string][]byte{
		"create":                 v1,
		"update":                 reviewBody(t, admissionv1.Update, d, reviewtest.Guarded()),
		"delete":                 reviewBody(t, admissionv1.Delete, nil, reviewtest.Guarded()),
		"refused":                reviewBody(t, admissionv1.Create, bad, nil),
		"v1beta1":                bytes.Replace(v1, []byte(`"apiVersion":"admission.k8s.io/v1"`), []byte(`"apiVersion":"admission.k8s.io/v1beta1"`), 1),
		"no kind":                bytes.Replace(v1, []byte(`"kind":"AdmissionReview",`), nil, 1),
		"no request":             []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`),
		"empty":                  nil,
		"only spaces":            []byte(" \n"),
		"object of another kind": []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"1","operation":"CREATE","object":{"kind":"Deployment","apiVersion":"apps/v1","spec":null}}}`),
		// The Webhook's limit: a body of that size or more is refused.
		"at the limit":    append(bytes.Repeat([]byte(" "), MaxReviewBytes-len(v1)), v1...),
		"under the limit": append(bytes.Repeat([]byte(" "), MaxReviewBytes-1-len(v1)), v1...),
	}
	same := func(what string, h *Endpoint, contentType string, body func() io.Reader) {
		t.Helper()
		send := func(s http.Handler) *httptest.ResponseRecorder {
			r := httptest.NewRequest(http.MethodPost, "/", body())
			r.Header.Set("Content-Type", contentType)
			w := httptest.NewRecorder()
			s.ServeHTTP(w, r)
			return w
		}
		got, want := send(h), send(h.Webhook)
		assert.Equal(t, want.Code, got.Code, "%s, %s", what, contentType)
		assert.Equal(t, want.Body.String(), got.Body.String(), "%s, %s", what, contentType)
	}
	for name, body := range bodies {
		for _, h := range []*Endpoint{mutating.(*Endpoint), validating.(*Endpoint)} {
			for _, contentType := range []string{"application/json", "application/yaml"} {
				same(name, h, contentType, func() io.Reader { return bytes.NewReader(body) })
			}
		}
	}
	same("a read that fails half-way", validating.(*Endpoint), "application/json", func() io.Reader {
		return io.MultiReader(bytes.NewReader(v1[:100]), failingReader{errors.New("connection reset by peer")})
	})
}

// TestNotJSONIsRefusedWithoutTheWebhook: a body that is not a JSON object is
// refused as the Webhook refuses it (400), without the Webhook's decoding,
// which reads it as YAML at many times the cost of a review of its size;
// a body of the limit or more (413) is refused without reading it again.
func TestNotJSONIsRefusedWithoutTheWebhook(t *testing.T) {
	v1 := reviewBody(t, admissionv1.Create, reviewtest.Stored(), nil)
	tests := []struct {
		name     string
		body     []byte
		limit    int64
		wantCode int32
		wantMsg  string
	}{
		{name: "YAML", body: []byte(`apiVersion: admission.k8s.io/v1`), wantCode: http.StatusBadRequest, wantMsg: bodylimit.ErrNotJSONObject.Error()},
		{name: "a YAML flow mapping", body: []byte(`{apiVersion: admission.k8s.io/v1}`), wantCode: http.StatusBadRequest, wantMsg: bodylimit.ErrNotJSONObject.Error()},
		{name: "truncated JSON", body: v1[:len(v1)/2], wantCode: http.StatusBadRequest, wantMsg: bodylimit.ErrNotJSONObject.Error()},
		{name: "a JSON array", body: []byte(` [1, 2, 3]`), wantCode: http.StatusBadRequest, wantMsg: bodylimit.ErrNotJSONObject.Error()},
		{name: "1 MiB of YAML", body: append([]byte("a: ["), bytes.Repeat([]byte("1, "), 350000)...), wantCode: http.StatusBadRequest, wantMsg: bodylimit.ErrNotJSONObject.Error()},
		{name: "a review at a lower limit", body: v1, limit: int64(len(v1)), wantCode: http.StatusRequestEntityTooLarge,
			wantMsg: fmt.Sprintf("request entity is too large; limit is %d bytes", len(v1))},
		{name: "a review under a lower limit", body: v1, limit: int64(len(v1)) + 1, wantCode: 0},
	}
	_, validating := servers(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ep := *validating.(*Endpoint)
			ep.MaxBodyBytes = tt.limit
			w := post(&ep, tt.body)
			require.Equal(t, http.StatusOK, w.Code)
			resp := decodeResponse(t, w)
			if tt.wantCode == 0 { // judged: the review refuses it (an overlap), not the size
				require.NotNil(t, resp.Result)
				assert.Equal(t, int32(http.StatusUnprocessableEntity), resp.Result.Code, resp.Result.Message)
				return
			}
			require.NotNil(t, resp.Result)
			assert.Equal(t, tt.wantCode, resp.Result.Code)
			assert.Equal(t, tt.wantMsg, resp.Result.Message)
			if tt.limit == 0 {
				// The Webhook refuses it too, with the same code.
				assert.Equal(t, tt.wantCode, decodeResponse(t, post(ep.Webhook, tt.body)).Result.Code)
			}
		})
	}
}

// TestValidatingReadsNoPodSpecOfACreate: the validating webhook leaves a
// CREATE's pod spec undecoded (Endpoint.SkipCreatePodSpec), and every
// object's managed fields (Endpoint.SkipManagedFields), so nothing it
// answers may depend on the typed pod spec of a create, nor on typed managed
// fields. Every Deployment of the corpora, with the managed fields the API
// server records, created, and updated to a new image, gets the same status
// and bytes from the Endpoint as from the Webhook it wraps, which decodes
// the whole object: with the built-in Rego policies, an overlap index that
// holds some of them (overlaps refused), the native policies evaluated in
// process or left to the API server.
func TestValidatingReadsNoPodSpecOfACreate(t *testing.T) {
	eng, err := policy.New(policy.Options{})
	require.NoError(t, err)
	require.NoError(t, eng.Load(context.Background(), policy.Builtins()))
	corpus := corpusDeployments(t)
	var others []*appsv1.Deployment
	for _, b := range corpus {
		if len(others) == 20 {
			break
		}
		d, err := decodeDeployment(runtime.RawExtension{Raw: b})
		require.NoError(t, err)
		d.Name, d.Namespace = "other-"+d.Name, "shop"
		others = append(others, d)
	}
	refused := 0
	for _, inAPIServer := range []bool{false, true} {
		w := &review.Reviewer{Options: reviewtest.Options(), Overlaps: reviewtest.Index(others...), Policies: review.RegoPolicies{Engine: eng}}
		w.Options.NativeInAPIServer = inAPIServer
		_, validating := (&Hooks{Reviewer: w}).Handlers(nil)
		no := false
		validating.RecoverPanic = &no
		require.True(t, validating.SkipCreatePodSpec)
		require.True(t, validating.SkipManagedFields)
		for name, b := range corpus {
			d, err := decodeDeployment(runtime.RawExtension{Raw: b})
			require.NoError(t, err)
			d.Namespace = "shop"
			d = withManagedFields(t, d)
			updated := d.DeepCopy()
			for i := range updated.Spec.Template.Spec.Containers {
				updated.Spec.Template.Spec.Containers[i].Image += "-2"
			}
			updated = withManagedFields(t, updated)
			for op, body := range map[admissionv1.Operation][]byte{
				admissionv1.Create: reviewBody(t, admissionv1.Create, d, nil),
				admissionv1.Update: reviewBody(t, admissionv1.Update, updated, d),
			} {
				got, want := post(validating, body), post(validating.Webhook, body)
				assert.Equal(t, want.Code, got.Code, name)
				assert.Equal(t, want.Body.String(), got.Body.String(), "%s, %s (native policies in the API server: %v)", name, op, inAPIServer)
				if !strings.Contains(got.Body.String(), `"allowed":true`) {
					refused++
				}
			}
		}
	}
	assert.Positive(t, refused, "some creates are refused (overlaps, the refusals)")
}

// BenchmarkEndpointDecoding: what the one-pass decoding saves on a
// production-sized Deployment's CREATE, against the Webhook alone.
func BenchmarkEndpointDecoding(b *testing.B) {
	w := &review.Reviewer{Options: reviewtest.Options()}
	_, validating := (&Hooks{Reviewer: w}).Handlers(nil)
	d := realistic()
	body := reviewBody(b, admissionv1.Create, d, nil)
	for name, h := range map[string]http.Handler{"endpoint": validating, "webhook": validating.Webhook} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				if w := post(h, body); w.Code != http.StatusOK {
					b.Fatal(w.Code)
				}
			}
		})
	}
}

// TestReadBody: the body is read whole whatever length the request
// announces, and an announced length allocates at most maxPresized before
// the bytes arrive.
func TestReadBody(t *testing.T) {
	body := bytes.Repeat([]byte("x"), 3000)
	for _, announced := range []int64{-1, 0, 10, 3000, 3001, MaxReviewBytes + 1} {
		b, err := readBody(bytes.NewReader(body), announced)
		assert.NoError(t, err, "announced %d", announced)
		assert.Equal(t, body, b, "announced %d", announced)
	}
	b, err := readBody(bytes.NewReader(body), MaxReviewBytes-1)
	assert.NoError(t, err)
	assert.LessOrEqual(t, cap(b), maxPresized+1, "a large announced length is not allocated up front")
	_, err = readBody(io.MultiReader(bytes.NewReader(body), failingReader{errors.New("reset")}), 3000)
	assert.Error(t, err)
}

// TestStalledBodyIsCutOff: a client that sends a review's headers and then
// stops (a broken client, or one that means harm: anyone who reaches the
// port can) has its request ended once the body timeout passes, while
// another connection is answered as usual in the meantime. Through Go's
// HTTP server over TLS, as the guard serves.
func TestStalledBodyIsCutOff(t *testing.T) {
	_, validating := servers(t)
	ep := validating.(*Endpoint)
	ep.BodyTimeout = 200 * time.Millisecond
	srv := httptest.NewTLSServer(ep)
	defer srv.Close()

	conn, err := harness.StallRequest(srv.Listener.Addr().String(), "/")
	require.NoError(t, err)
	defer conn.Close()

	// Another client is served while the first one stalls.
	resp, err := srv.Client().Post(srv.URL, "application/json", bytes.NewReader(reviewBody(t, admissionv1.Create, reviewtest.Stored(), nil)))
	require.NoError(t, err)
	out, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "%s", out)
	assert.Contains(t, string(out), "also selects the pods of Deployment", "the other client's answer: the overlap with the index's Deployment")

	// The stalled request ends: an error answer, then the connection
	// closes, though the 100 KB that were announced never arrive. The
	// deadline here only stops the test from hanging.
	rest, err := harness.ReadUntilClosed(conn, time.Now().Add(20*time.Second))
	require.NoError(t, err)
	assert.Contains(t, rest, "Connection: close")
	assert.Contains(t, rest, `"allowed":false`)
	assert.Contains(t, rest, "i/o timeout")
}

// TestHandlingOutlastsTheBodyDeadline: the body's deadline ends with the
// body. A request whose handling takes longer than the body timeout (a slow
// Rego policy within its budget) keeps its context: Go's server reads on in
// the background once the body is in, and a deadline still set there would
// cancel the context (the server lifts it as that read starts).
func TestHandlingOutlastsTheBodyDeadline(t *testing.T) {
	const timeout = 500 * time.Millisecond
	ep := &Endpoint{BodyTimeout: timeout, Webhook: &admission.Webhook{Handler: admission.HandlerFunc(
		func(ctx context.Context, _ admission.Request) admission.Response {
			select {
			case <-ctx.Done():
				return admission.Denied("the request's context ended: " + context.Cause(ctx).Error())
			case <-time.After(3 * timeout):
				return admission.Allowed("")
			}
		})}}
	srv := httptest.NewTLSServer(ep)
	defer srv.Close()
	resp, err := srv.Client().Post(srv.URL, "application/json", bytes.NewReader(reviewBody(t, admissionv1.Create, reviewtest.Stored(), nil)))
	require.NoError(t, err)
	out, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	assert.Contains(t, string(out), `"allowed":true`)
}

// TestStalledBodyIsCutOffOverHTTP2: the same over HTTP/2 (serve's --http2),
// where the deadline is the stream's: the stalled stream is answered, and
// the connection carries on for the others.
func TestStalledBodyIsCutOffOverHTTP2(t *testing.T) {
	_, validating := servers(t)
	ep := validating.(*Endpoint)
	ep.BodyTimeout = 200 * time.Millisecond
	srv := httptest.NewUnstartedServer(ep)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()

	stalled, feed := io.Pipe()
	defer feed.Close()
	go func() { _, _ = feed.Write([]byte(`{"kind":`)) }() // and nothing more
	req, err := http.NewRequest(http.MethodPost, srv.URL, stalled)
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.ContentLength = 100000
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // only stops the test from hanging
	defer cancel()
	resp, err := srv.Client().Do(req.WithContext(ctx))
	require.NoError(t, err, "the stalled request gets no answer")
	out, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	assert.Equal(t, 2, resp.ProtoMajor)
	assert.Contains(t, string(out), `"allowed":false`)
	assert.Contains(t, string(out), "i/o timeout")
	assert.Empty(t, resp.Header.Get("Connection"))

	// The same connection serves the next request.
	var reused bool
	trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }}
	next, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), http.MethodPost, srv.URL, bytes.NewReader(reviewBody(t, admissionv1.Create, reviewtest.Stored(), nil)))
	require.NoError(t, err)
	next.Header.Set("Content-Type", "application/json")
	resp, err = srv.Client().Do(next)
	require.NoError(t, err)
	out, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	assert.Contains(t, string(out), "also selects the pods of Deployment")
	assert.True(t, reused, "the next request opened a new connection")
}

// TestMalformedCostsNoMoreThanAGoodReview: whoever reaches the port can send
// anything; what the guard cannot read allocates no more than a good review
// of the same size (a production-sized CREATE) costs it.
func TestMalformedCostsNoMoreThanAGoodReview(t *testing.T) {
	_, validating := servers(t)
	good := reviewBody(t, admissionv1.Create, realistic(), nil)
	pad := strings.Repeat("x", len(good)/2)
	tests := []struct {
		name string
		body []byte
	}{
		{name: "a junk operation", body: bytes.Replace(good, []byte(`"operation":"CREATE"`), []byte(`"operation":"`+pad+`"`), 1)},
		{name: "a junk kind", body: bytes.Replace(good, []byte(`"kind":"Deployment"},`), []byte(`"kind":"`+pad+`"},`), 1)},
		{name: "an object that does not decode", body: bytes.Replace(good, []byte(`"replicas":3`), []byte(`"replicas":"3"`), 1)},
		{name: "YAML", body: append([]byte("a: ["), bytes.Repeat([]byte("1, "), len(good)/3)...)},
		{name: "truncated JSON", body: good[:len(good)-3]},
		{name: "not JSON", body: append([]byte("x"), good...)},
	}
	allocated := func(body []byte) uint64 {
		var before, after goruntime.MemStats
		post(validating, body) // warm
		goruntime.ReadMemStats(&before)
		for range 20 {
			post(validating, body)
		}
		goruntime.ReadMemStats(&after)
		return (after.TotalAlloc - before.TotalAlloc) / 20
	}
	want := allocated(good)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.InDelta(t, len(good), len(tt.body), float64(len(good))/2, "about the size of the good review")
			assert.LessOrEqual(t, allocated(tt.body), want, "bytes allocated per request, against %d for a good review", want)
		})
	}
}
