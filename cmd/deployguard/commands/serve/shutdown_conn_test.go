package serve

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A client keeps its connection while the guard runs, and is told to close it
// once the stop signal has come: the next request goes out on a new one.
func TestCloseConnectionsOnceStopping(t *testing.T) {
	g := &gracefulStop{}
	srv := httptest.NewServer(g.CloseConnections(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok")
	})))
	defer srv.Close()

	// get answers the status and whether the client was told to close.
	get := func() (int, bool) {
		t.Helper()
		resp, err := srv.Client().Get(srv.URL)
		require.NoError(t, err)
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, resp.Close
	}
	for _, tc := range []struct {
		stopping  bool
		wantClose bool
	}{
		{stopping: false, wantClose: false},
		{stopping: true, wantClose: true},
	} {
		g.stopping.Store(tc.stopping)
		code, closed := get()
		assert.Equal(t, http.StatusOK, code)
		assert.Equal(t, tc.wantClose, closed, "stopping=%v: the client is told to close the connection", tc.stopping)
	}
}
