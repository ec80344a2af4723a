package health

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestProbesSayWhy(t *testing.T) {
	var certErr error
	note := ""
	pr := &Probes{}
	require.NoError(t, pr.AddHealthzCheck("ping", func(*http.Request) error { return nil }))
	require.NoError(t, pr.AddReadyzCheck("webhook", func(*http.Request) error { return nil }))
	require.NoError(t, pr.AddReadyzCheck("serving-certificate", func(*http.Request) error { return certErr }))
	pr.AddReadyzNote("audit", func() string { return note })
	srv := httptest.NewServer(pr.handler())
	defer srv.Close()
	get := func(path string) (int, string) {
		resp, err := http.Get(srv.URL + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}

	tests := []struct {
		name     string
		certErr  error
		note     string
		path     string
		wantCode int
		wantBody string
	}{
		{name: "ready", path: "/readyz", wantCode: 200, wantBody: "ok"},
		{name: "ready, verbose", path: "/readyz?verbose", wantCode: 200,
			wantBody: "[+]webhook ok\n[+]serving-certificate ok\nreadyz check passed\n"},
		{name: "a note shows in the detail and keeps the guard ready", note: "the PolicyReport CRD is not installed", path: "/readyz?verbose", wantCode: 200,
			wantBody: "[+]webhook ok\n[+]serving-certificate ok\n[+]audit ok, note: the PolicyReport CRD is not installed\nreadyz check passed\n"},
		{name: "a failing check says why", certErr: errors.New("the caBundle does not trust the served certificate"), path: "/readyz", wantCode: 500,
			wantBody: "[+]webhook ok\n[-]serving-certificate failed: the caBundle does not trust the served certificate\nreadyz check failed\n"},
		{name: "one check", path: "/readyz/webhook", wantCode: 200, wantBody: "ok"},
		{name: "one failing check", certErr: errors.New("expired"), path: "/readyz/serving-certificate", wantCode: 500,
			wantBody: "serving-certificate check failed: expired\n"},
		{name: "no such check", path: "/readyz/nothing", wantCode: 404, wantBody: "no readyz check named \"nothing\"\n"},
		{name: "liveness ignores readiness", certErr: errors.New("expired"), path: "/healthz", wantCode: 200, wantBody: "ok"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			certErr, note = tt.certErr, tt.note
			code, body := get(tt.path)
			assert.Equal(t, tt.wantCode, code)
			assert.Equal(t, tt.wantBody, body)
		})
	}
}
