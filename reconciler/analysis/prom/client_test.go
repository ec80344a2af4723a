package prom

import (
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"

	"github.com/deployguard/deployguard/reconciler/analysis"
)

// fakePrometheus answers /api/v1/query with body and status, after checking
// the bearer token; it records the last request's form.
type fakePrometheus struct {
	*httptest.Server
	mu    sync.Mutex
	token string
	form  map[string]string
	auth  []string
}

func startFake(t *testing.T, status int, body string) *fakePrometheus {
	t.Helper()
	f := &fakePrometheus{token: "tok-1"}
	f.Server = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.auth = append(f.auth, r.Header.Get("Authorization"))
		want := "Bearer " + f.token
		f.mu.Unlock()
		if r.URL.Path != "/api/v1/query" || r.Method != http.MethodPost {
			http.NotFound(w, r)
			return
		}
		if r.Header.Get("Authorization") != want {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		_ = r.ParseForm()
		f.mu.Lock()
		f.form = map[string]string{"query": r.PostForm.Get("query"), "time": r.PostForm.Get("time"), "timeout": r.PostForm.Get("timeout")}
		f.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(f.Close)
	return f
}

// caFile writes the test server's certificate, its own CA, to a file.
func caFile(t *testing.T, srv *httptest.Server) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "ca.crt")
	require.NoError(t, os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600))
	return p
}

func tokenFileWith(t *testing.T, tok string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(p, []byte(tok+"\n"), 0o600))
	return p
}

func newClient(t *testing.T, f *fakePrometheus, timeout time.Duration) *Client {
	t.Helper()
	c, err := New(Config{URL: f.URL, CAFile: caFile(t, f.Server), BearerTokenFile: tokenFileWith(t, "tok-1"), Timeout: timeout})
	require.NoError(t, err)
	return c
}

func TestQuery(t *testing.T) {
	big := `{"status":"success","data":{"resultType":"scalar","result":[1,"1"]},"pad":"` + strings.Repeat("x", MaxBodyBytes) + `"}`
	tests := []struct {
		name   string
		status int
		body   string
		want   analysis.Value
		isNaN  bool
		kind   ErrorKind
		errHas []string
	}{
		{name: "scalar", status: 200, body: `{"status":"success","data":{"resultType":"scalar","result":[1700000000,"0.5"]}}`, want: analysis.Scalar(0.5)},
		{name: "vector", status: 200, body: `{"status":"success","data":{"resultType":"vector","result":[{"metric":{"code":"500"},"value":[1,"3"]},{"metric":{"code":"200"},"value":[1,"97"]}]}}`, want: analysis.Vector([]float64{3, 97})},
		{name: "empty vector", status: 200, body: `{"status":"success","data":{"resultType":"vector","result":[]}}`, want: analysis.Vector([]float64{})},
		{name: "NaN", status: 200, body: `{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"NaN"]}]}}`, isNaN: true},
		{name: "matrix refused", status: 200, body: `{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":[[1,"1"]]}]}}`, kind: KindDecode, errHas: []string{"range vector", "must return a scalar or an instant vector"}},
		{name: "API error", status: 400, body: `{"status":"error","errorType":"bad_data","error":"1:5: parse error: unexpected <EOF>` + strings.Repeat("!", 1000) + `"}`, kind: KindAPI, errHas: []string{"HTTP 400", "bad_data: 1:5: parse error"}},
		{name: "HTTP 503", status: 503, body: `<html>upstream connect error</html>`, kind: KindHTTP, errHas: []string{"HTTP 503"}},
		{name: "body over the limit", status: 200, body: big, kind: KindDecode, errHas: []string{"response over 1 MiB"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := startFake(t, tt.status, tt.body)
			c := newClient(t, f, 5*time.Second)
			at := time.UnixMilli(1700000000123)
			v, err := c.Query(context.Background(), `sum(rate(x[1m]))`, at)
			if tt.kind != "" {
				var e *Error
				require.ErrorAs(t, err, &e)
				assert.Equal(t, tt.kind, e.Kind)
				for _, s := range tt.errHas {
					assert.Contains(t, e.Error(), s)
				}
				assert.NotContains(t, e.Error(), "upstream connect error", "no response body in the error")
				assert.Less(t, len(e.Error()), 512, "the API error text is cut")
				return
			}
			require.NoError(t, err)
			if tt.isNaN {
				assert.Equal(t, "[NaN]", v.String())
			} else {
				assert.Equal(t, tt.want, v)
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			assert.Equal(t, map[string]string{"query": `sum(rate(x[1m]))`, "time": "1700000000.123", "timeout": "5"}, f.form)
		})
	}
}

func TestQueryNaNScalarIsNaN(t *testing.T) {
	f := startFake(t, 200, `{"status":"success","data":{"resultType":"scalar","result":[1,"NaN"]}}`)
	v, err := newClient(t, f, time.Second).Query(context.Background(), "x", time.Time{})
	require.NoError(t, err)
	assert.Equal(t, "NaN", v.String())
	f.mu.Lock()
	defer f.mu.Unlock()
	assert.Empty(t, f.form["time"], "no time: Prometheus's now")
}

// A rotated token file is read again; the old token is never sent after.
func TestQueryTokenRotation(t *testing.T) {
	f := startFake(t, 200, `{"status":"success","data":{"resultType":"scalar","result":[1,"1"]}}`)
	tokPath := tokenFileWith(t, "tok-1")
	c, err := New(Config{URL: f.URL, CAFile: caFile(t, f.Server), BearerTokenFile: tokPath})
	require.NoError(t, err)
	_, err = c.Query(context.Background(), "x", time.Time{})
	require.NoError(t, err)

	f.mu.Lock()
	f.token = "tok-2"
	f.mu.Unlock()
	// A Secret mount swaps the file; its modification time moves.
	require.NoError(t, os.WriteFile(tokPath, []byte("tok-2"), 0o600))
	later := time.Now().Add(time.Minute)
	require.NoError(t, os.Chtimes(tokPath, later, later))
	_, err = c.Query(context.Background(), "x", time.Time{})
	require.NoError(t, err)

	f.mu.Lock()
	defer f.mu.Unlock()
	assert.Equal(t, []string{"Bearer tok-1", "Bearer tok-2"}, f.auth)
}

func TestQueryWrongTokenIsHTTP401(t *testing.T) {
	f := startFake(t, 200, `{}`)
	c, err := New(Config{URL: f.URL, CAFile: caFile(t, f.Server), BearerTokenFile: tokenFileWith(t, "wrong-secret")})
	require.NoError(t, err)
	_, err = c.Query(context.Background(), "x", time.Time{})
	var e *Error
	require.ErrorAs(t, err, &e)
	assert.Equal(t, KindHTTP, e.Kind)
	assert.Contains(t, e.Error(), "HTTP 401 (check bearerTokenFile")
	assert.NotContains(t, e.Error(), "wrong-secret")
}

func TestQueryTokenFileGone(t *testing.T) {
	f := startFake(t, 200, `{}`)
	tokPath := tokenFileWith(t, "tok-1")
	c, err := New(Config{URL: f.URL, CAFile: caFile(t, f.Server), BearerTokenFile: tokPath})
	require.NoError(t, err)
	require.NoError(t, os.Remove(tokPath))
	_, err = c.Query(context.Background(), "x", time.Time{})
	var e *Error
	require.ErrorAs(t, err, &e)
	assert.Equal(t, KindToken, e.Kind)
}

func TestQueryUnreachable(t *testing.T) {
	// A port nothing listens on any more.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	refused := "http://" + l.Addr().String()
	require.NoError(t, l.Close())

	// Answers nothing until the test ends (cleanups run last first: release,
	// then Close).
	release := make(chan struct{})
	hang := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(hang.Close)
	t.Cleanup(func() { close(release) })
	untrusted := startFake(t, 200, `{}`)

	tests := []struct {
		name   string
		cfg    Config
		errHas string
		isCtx  error
	}{
		{name: "connection refused", cfg: Config{URL: refused}, errHas: "connection refused"},
		{name: "time-out", cfg: Config{URL: hang.URL, Timeout: 100 * time.Millisecond}, errHas: "did not answer within 100ms", isCtx: context.DeadlineExceeded},
		{name: "unknown CA", cfg: Config{URL: untrusted.URL}, errHas: "certificate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := New(tt.cfg)
			require.NoError(t, err)
			_, err = c.Query(context.Background(), "x", time.Time{})
			var e *Error
			require.ErrorAs(t, err, &e)
			assert.Equal(t, KindUnreachable, e.Kind)
			assert.Contains(t, e.Error(), tt.errHas)
			if tt.isCtx != nil {
				assert.True(t, errors.Is(err, tt.isCtx))
			}
		})
	}
}

func TestNewRefusesBadFiles(t *testing.T) {
	notPEM := filepath.Join(t.TempDir(), "ca.crt")
	require.NoError(t, os.WriteFile(notPEM, []byte("hello"), 0o600))
	empty := tokenFileWith(t, "")
	tests := []struct {
		name   string
		cfg    Config
		errHas string
	}{
		{name: "CA not PEM", cfg: Config{URL: "https://p", CAFile: notPEM}, errHas: "holds no PEM certificate"},
		{name: "CA missing", cfg: Config{URL: "https://p", CAFile: filepath.Join(t.TempDir(), "nope")}, errHas: "caFile"},
		{name: "token empty", cfg: Config{URL: "https://p", BearerTokenFile: empty}, errHas: "is empty: put the token in it"},
		{name: "token missing", cfg: Config{URL: "https://p", BearerTokenFile: filepath.Join(t.TempDir(), "nope")}, errHas: "bearer token file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.cfg)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.errHas)
		})
	}
}

func TestReserve(t *testing.T) {
	c, err := New(Config{URL: "http://p", QPS: 1, Burst: 1})
	require.NoError(t, err)
	assert.Equal(t, time.Duration(0), c.Reserve("a"), "the first query may go")
	d := c.Reserve("b")
	assert.Greater(t, d, time.Duration(0))
	assert.LessOrEqual(t, d, time.Second)
	// Asking again keeps b's turn: the delay is not pushed further out.
	assert.LessOrEqual(t, c.Reserve("b"), d)
	// c comes after b.
	assert.Greater(t, c.Reserve("c"), d)
}

// Under concurrency no more than Burst queries go at once.
func TestReserveConcurrent(t *testing.T) {
	c, err := New(Config{URL: "http://p", QPS: 0.001, Burst: 5})
	require.NoError(t, err)
	var wg sync.WaitGroup
	var mu sync.Mutex
	zeros := 0
	for i := range 100 {
		wg.Go(func() {
			if c.Reserve(fmt.Sprint(i)) == 0 {
				mu.Lock()
				zeros++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	assert.Equal(t, 5, zeros)
}

// Callers waiting at once are served in the order they asked, each once
// its turn comes, and a turn is claimed once.
func TestTurnsFirstComeFirstServed(t *testing.T) {
	t0 := time.Now()
	tu := newTurns(rate.NewLimiter(10, 1)) // a token every 100ms
	assert.Zero(t, tu.take("first", t0), "the burst")
	var due []time.Duration
	for _, k := range []string{"a", "b", "c"} {
		due = append(due, tu.take(k, t0))
	}
	assert.Equal(t, []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 300 * time.Millisecond}, due)
	assert.Equal(t, 3, tu.len())
	// Asking early takes nothing and keeps the place in the queue.
	assert.Equal(t, 150*time.Millisecond, tu.take("b", t0.Add(50*time.Millisecond)))
	assert.Zero(t, tu.take("b", t0.Add(200*time.Millisecond)), "b's turn")
	assert.Equal(t, 2, tu.len(), "claimed, forgotten")
	// A new caller queues after c, not before it: c's token is kept for c.
	assert.Equal(t, 200*time.Millisecond, tu.take("d", t0.Add(200*time.Millisecond)))
	assert.Zero(t, tu.take("a", t0.Add(300*time.Millisecond)))
	assert.Zero(t, tu.take("c", t0.Add(300*time.Millisecond)))
}

// A turn never claimed is forgotten a minute after it came.
func TestTurnsForgetsUnclaimed(t *testing.T) {
	t0 := time.Now()
	tu := newTurns(rate.NewLimiter(1, 1))
	tu.take("burst", t0)
	tu.take("gone", t0) // due at t0+1s, never claimed
	assert.Equal(t, 1, tu.len())
	tu.take("later", t0.Add(2*time.Minute)) // the burst refilled: goes at once
	tu.take("waits", t0.Add(2*time.Minute))
	assert.Equal(t, 1, tu.len(), "gone is forgotten, waits kept")
}
func TestURL(t *testing.T) {
	c, err := New(Config{URL: "https://mon.example/prometheus/"})
	require.NoError(t, err)
	assert.Equal(t, "https://mon.example/prometheus", c.URL())
	assert.Equal(t, "https://mon.example/prometheus/api/v1/query", c.endpoint)
}
