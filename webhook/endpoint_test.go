package webhook

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	admissionv1 "k8s.io/api/admission/v1"
)

// TestEndpointAnswersAsTheWebhook: the one-pass decoding changes nothing a
// client sees. Every body, well-formed or not, of the one version the API
// server sends or another, gets the same status and the same bytes from the
// Endpoint as from the controller-runtime Webhook it wraps.
func TestEndpointAnswersAsTheWebhook(t *testing.T) {
	mutating, validating := servers(t)
	d := stored()
	bad := d.DeepCopy()
	bad.Spec.Selector = nil
	bad.Spec.Template.Labels = map[string]string{"version": "1"}
	v1 := review(t, admissionv1.Create, d, nil)
	bodies := map[string][]byte{
		"create":                 v1,
		"update":                 review(t, admissionv1.Update, d, guarded()),
		"delete":                 review(t, admissionv1.Delete, nil, guarded()),
		"refused":                review(t, admissionv1.Create, bad, nil),
		"v1beta1":                bytes.Replace(v1, []byte(`"apiVersion":"admission.k8s.io/v1"`), []byte(`"apiVersion":"admission.k8s.io/v1beta1"`), 1),
		"no kind":                bytes.Replace(v1, []byte(`"kind":"AdmissionReview",`), nil, 1),
		"no request":             []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`),
		"not JSON":               []byte(`apiVersion: admission.k8s.io/v1`),
		"truncated":              v1[:len(v1)/2],
		"empty":                  nil,
		"object of another kind": []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"1","operation":"CREATE","object":{"kind":"Deployment","apiVersion":"apps/v1","spec":null}}}`),
		// The Webhook's limit: a body of that size or more is refused.
		"at the limit":    append(bytes.Repeat([]byte(" "), maxReviewBytes-len(v1)), v1...),
		"under the limit": append(bytes.Repeat([]byte(" "), maxReviewBytes-1-len(v1)), v1...),
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

// BenchmarkEndpointDecoding: what the one-pass decoding saves on a
// production-sized Deployment's CREATE, against the Webhook alone.
func BenchmarkEndpointDecoding(b *testing.B) {
	w := &Deployment{Options: testOptions()}
	_, validating := w.Handlers(nil)
	d := realistic()
	body := review(b, admissionv1.Create, d, nil)
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
	for _, announced := range []int64{-1, 0, 10, 3000, 3001, maxReviewBytes + 1} {
		b, err := readBody(bytes.NewReader(body), announced)
		assert.NoError(t, err, "announced %d", announced)
		assert.Equal(t, body, b, "announced %d", announced)
	}
	b, err := readBody(bytes.NewReader(body), maxReviewBytes-1)
	assert.NoError(t, err)
	assert.LessOrEqual(t, cap(b), maxPresized+1, "a large announced length is not allocated up front")
	_, err = readBody(io.MultiReader(bytes.NewReader(body), failingReader{errors.New("reset")}), 3000)
	assert.Error(t, err)
}
