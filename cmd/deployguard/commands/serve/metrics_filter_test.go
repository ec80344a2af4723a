package serve

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
)

// fakeAuthn stands for the TokenReview: it counts the tokens sent to it,
// knows "reader", "nobody" and "broken", and, for "slow", says it was
// entered and waits for release.
type fakeAuthn struct {
	calls   atomic.Int32
	entered chan struct{}
	release chan struct{}
}

func (a *fakeAuthn) AuthenticateRequest(req *http.Request) (*authenticator.Response, bool, error) {
	a.calls.Add(1)
	token := strings.TrimPrefix(req.Header.Get("Authorization"), "Bearer ")
	switch token {
	case "reader", "nobody", "broken":
		return &authenticator.Response{User: &user.DefaultInfo{Name: token}}, true, nil
	case "slow":
		a.entered <- struct{}{}
		<-a.release
	}
	return nil, false, nil
}

// fakeAuthz lets "reader" GET /metrics, fails for "broken", denies the rest.
var fakeAuthz = authorizer.AuthorizerFunc(func(_ context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
	switch {
	case a.GetUser().GetName() == "broken":
		return authorizer.DecisionNoOpinion, "", errors.New("SubjectAccessReview failed")
	case a.GetUser().GetName() == "reader" && a.GetVerb() == "get" && a.GetPath() == "/metrics":
		return authorizer.DecisionAllow, "", nil
	}
	return authorizer.DecisionNoOpinion, "no role", nil
})

func newFilteredMetrics(t *testing.T, authn *fakeAuthn, slots int) http.Handler {
	t.Helper()
	h, err := metricsFilter(authn, fakeAuthz, slots)(logr.Discard(), http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "metrics")
	}))
	require.NoError(t, err)
	return h
}

func TestMetricsFilter(t *testing.T) {
	tests := []struct {
		name          string
		authorization string
		wantCode      int
		wantReviews   int32 // tokens sent to the API server
	}{
		{name: "no token", wantCode: http.StatusUnauthorized, wantReviews: 1},
		{name: "a token the API server rejects", authorization: "Bearer forged", wantCode: http.StatusUnauthorized, wantReviews: 1},
		{name: "a 16 KiB token never reaches the API server", authorization: "Bearer " + strings.Repeat("a", 16<<10), wantCode: http.StatusUnauthorized},
		{name: "an 8 KiB header does", authorization: "Bearer " + strings.Repeat("a", 8<<10-len("Bearer ")), wantCode: http.StatusUnauthorized, wantReviews: 1},
		{name: "a caller without the role", authorization: "Bearer nobody", wantCode: http.StatusForbidden, wantReviews: 1},
		{name: "the authorization fails", authorization: "Bearer broken", wantCode: http.StatusInternalServerError, wantReviews: 1},
		{name: "a reader", authorization: "Bearer reader", wantCode: http.StatusOK, wantReviews: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			authn := &fakeAuthn{}
			req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
			if tt.authorization != "" {
				req.Header.Set("Authorization", tt.authorization)
			}
			rec := httptest.NewRecorder()
			newFilteredMetrics(t, authn, metricsAuthSlots).ServeHTTP(rec, req)
			assert.Equal(t, tt.wantCode, rec.Code, rec.Body.String())
			assert.Equal(t, tt.wantReviews, authn.calls.Load(), "authentications")
			if tt.wantCode == http.StatusOK {
				assert.Equal(t, "metrics", rec.Body.String())
				assert.Empty(t, rec.Header().Get("Connection"))
			} else {
				assert.Equal(t, "close", rec.Header().Get("Connection"), "a refusal ends the connection")
			}
		})
	}
}

// With every slot taken by an authentication under way, a request is 429
// at once, without an authentication of its own; once they end, it is
// served again.
func TestMetricsFilterShedsPastItsSlots(t *testing.T) {
	const slots = 2
	authn := &fakeAuthn{entered: make(chan struct{}), release: make(chan struct{})}
	h := newFilteredMetrics(t, authn, slots)
	get := func(token string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	var wg sync.WaitGroup
	for range slots {
		wg.Go(func() { get("slow") })
		<-authn.entered
	}

	tests := []struct {
		name     string
		before   func()
		wantCode int
		wantCall int32
	}{
		{name: "every slot taken", wantCode: http.StatusTooManyRequests, wantCall: slots},
		{name: "the slots freed", before: func() { close(authn.release); wg.Wait() }, wantCode: http.StatusOK, wantCall: slots + 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.before != nil {
				tt.before()
			}
			rec := get("reader")
			assert.Equal(t, tt.wantCode, rec.Code, rec.Body.String())
			assert.Equal(t, tt.wantCall, authn.calls.Load(), "authentications")
			if tt.wantCode == http.StatusTooManyRequests {
				assert.Equal(t, "1", rec.Header().Get("Retry-After"))
				assert.Equal(t, "close", rec.Header().Get("Connection"))
			}
		})
	}
}

// A caller that declares a body and stalls gets its refusal and the
// connection closed at once, not a goroutine held while Go's server waits,
// with no deadline, for the rest of the body.
func TestMetricsRefusalDoesNotWaitForTheBody(t *testing.T) {
	ts := httptest.NewServer(newFilteredMetrics(t, &fakeAuthn{}, metricsAuthSlots))
	t.Cleanup(ts.Close)
	tests := []struct {
		name          string
		authorization string
	}{
		{name: "no token"},
		{name: "a token too long", authorization: "Authorization: Bearer " + strings.Repeat("a", 16<<10) + "\r\n"},
		{name: "a caller without the role", authorization: "Authorization: Bearer nobody\r\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", ts.Listener.Addr().String())
			require.NoError(t, err)
			defer conn.Close()
			// The test's own bound: reaching it is the failure.
			require.NoError(t, conn.SetDeadline(time.Now().Add(5*time.Second)))
			_, err = io.WriteString(conn, "POST /metrics HTTP/1.1\r\nHost: metrics\r\n"+tt.authorization+"Content-Length: 1000\r\n\r\n0123456789")
			require.NoError(t, err)

			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			require.NoError(t, err, "the refusal must not wait for the body")
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			require.NoError(t, err)
			assert.Contains(t, []int{http.StatusUnauthorized, http.StatusForbidden}, resp.StatusCode)
			assert.True(t, resp.Close, "the answer says the connection ends")

			_, err = br.ReadByte()
			var ne net.Error
			require.False(t, errors.As(err, &ne) && ne.Timeout(), "the server must close the connection, not wait for the body: %v", err)
			assert.ErrorIs(t, err, io.EOF)
		})
	}
}
