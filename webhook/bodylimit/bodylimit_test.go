package bodylimit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, errors.New("connection reset by peer") }

func TestHandler(t *testing.T) {
	review := []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"1","operation":"CREATE"}}`)
	tests := []struct {
		name       string
		body       io.Reader
		wantCalled bool
		wantCode   int32 // of the answer's status; 0: allowed
		wantMsg    string
	}{
		{name: "a review reaches the Webhook", body: bytes.NewReader(review), wantCalled: true},
		{name: "YAML is refused before", body: bytes.NewReader([]byte("request:\n  uid: 1\n")), wantCode: http.StatusBadRequest, wantMsg: ErrNotJSONObject.Error()},
		{name: "invalid JSON is refused before", body: bytes.NewReader(review[:40]), wantCode: http.StatusBadRequest, wantMsg: ErrNotJSONObject.Error()},
		{name: "a body of the limit is refused before", body: io.MultiReader(bytes.NewReader(review), bytes.NewReader(bytes.Repeat([]byte(" "), Max))),
			wantCode: http.StatusRequestEntityTooLarge, wantMsg: TooLarge(Max).Error()},
		{name: "a body under the limit reaches the Webhook", body: io.MultiReader(bytes.NewReader(review), bytes.NewReader(bytes.Repeat([]byte(" "), Max-1-len(review)))), wantCalled: true},
		{name: "a read that fails", body: io.MultiReader(bytes.NewReader(review[:10]), failingReader{}), wantCode: http.StatusBadRequest, wantMsg: "connection reset by peer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			called := false
			h := Handler(&admission.Webhook{Handler: admission.HandlerFunc(func(context.Context, admission.Request) admission.Response {
				called = true
				return admission.Allowed("")
			})})
			r := httptest.NewRequest(http.MethodPost, "/", tt.body)
			r.Header.Set("Content-Type", "application/json")
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			assert.Equal(t, tt.wantCalled, called)
			var out admissionv1.AdmissionReview
			require.NoError(t, json.Unmarshal(w.Body.Bytes(), &out), w.Body.String())
			require.NotNil(t, out.Response)
			if tt.wantCode == 0 {
				assert.True(t, out.Response.Allowed)
				return
			}
			assert.Equal(t, tt.wantCode, out.Response.Result.Code)
			assert.Equal(t, tt.wantMsg, out.Response.Result.Message)
		})
	}
}
