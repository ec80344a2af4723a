package main

import (
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func startServer(t *testing.T) *httptest.Server {
	t.Helper()
	s, err := newServer(t.TempDir())
	require.NoError(t, err)
	srv := httptest.NewServer(s.handler())
	t.Cleanup(func() {
		srv.Close()
		_ = s.close()
	})
	return srv
}

func post(t *testing.T, u, contentType, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(u, contentType, strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

func loadAt(t *testing.T, srv *httptest.Server, text string, at time.Time) {
	t.Helper()
	code, body := post(t, srv.URL+"/load?time="+seconds(at), "text/plain", text)
	require.Equal(t, http.StatusNoContent, code, body)
}

func seconds(at time.Time) string {
	return strconv.FormatFloat(float64(at.UnixMilli())/1000, 'f', 3, 64)
}

func queryAt(t *testing.T, srv *httptest.Server, q string, at time.Time) (int, string) {
	t.Helper()
	return post(t, srv.URL+"/api/v1/query", "application/x-www-form-urlencoded",
		url.Values{"query": {q}, "time": {seconds(at)}, "timeout": {"5"}}.Encode())
}

// Counters loaded a minute back (the latest first: the past is appended out
// of order) give the rate Prometheus computes, in Prometheus's JSON.
func TestServeQuery(t *testing.T) {
	srv := startServer(t)
	now := time.Now().Truncate(time.Second)
	ts := strconv.FormatInt(now.Unix(), 10)
	for _, s := range []struct {
		ago  time.Duration
		a, b int
	}{{0, 60, 120}, {60 * time.Second, 0, 0}, {30 * time.Second, 30, 60}} {
		loadAt(t, srv, "# TYPE x counter\n"+
			`x{pod="a"} `+strconv.Itoa(s.a)+"\n"+
			`x{pod="b"} `+strconv.Itoa(s.b)+"\n", now.Add(-s.ago))
	}

	tests := []struct {
		name  string
		query string
		want  string
	}{
		// Windows are left-open since Prometheus 3: (now-1m, now] holds the
		// samples at now-30s and now, extrapolated to the whole minute.
		{name: "rate", query: `sum(rate(x[1m]))`, want: `{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[` + ts + `,"3"]}]}}`},
		{name: "vector with labels", query: `x{pod="a"}`, want: `{"status":"success","data":{"resultType":"vector","result":[{"metric":{"__name__":"x","pod":"a"},"value":[` + ts + `,"60"]}]}}`},
		{name: "empty vector", query: `x{pod="c"}`, want: `{"status":"success","data":{"resultType":"vector","result":[]}}`},
		{name: "scalar", query: `scalar(sum(x))`, want: `{"status":"success","data":{"resultType":"scalar","result":[` + ts + `,"180"]}}`},
		{name: "NaN", query: `0/0`, want: `{"status":"success","data":{"resultType":"scalar","result":[` + ts + `,"NaN"]}}`},
		{name: "+Inf", query: `1/0`, want: `{"status":"success","data":{"resultType":"scalar","result":[` + ts + `,"+Inf"]}}`},
		{name: "matrix", query: `x{pod="a"}[40s]`, want: `{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"__name__":"x","pod":"a"},"values":[[` +
			strconv.FormatInt(now.Unix()-30, 10) + `,"30"],[` + ts + `,"60"]]}]}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := queryAt(t, srv, tt.query, now)
			assert.Equal(t, http.StatusOK, code)
			assert.JSONEq(t, tt.want, body)
		})
	}

	// GET with the query in the URL answers the same.
	resp, err := http.Get(srv.URL + "/api/v1/query?" + url.Values{"query": {`sum(rate(x[1m]))`}, "time": {ts}}.Encode())
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.JSONEq(t, tests[0].want, string(b))
}

func TestServeErrors(t *testing.T) {
	srv := startServer(t)
	tests := []struct {
		name     string
		form     url.Values
		code     int
		errType  string
		errStart string
	}{
		{name: "parse error", form: url.Values{"query": {"sum("}}, code: 400, errType: "bad_data", errStart: `invalid parameter \"query\": `},
		{name: "bad time", form: url.Values{"query": {"1"}, "time": {"yesterday"}}, code: 400, errType: "bad_data", errStart: `invalid parameter \"time\"`},
		{name: "bad timeout", form: url.Values{"query": {"1"}, "timeout": {"-1"}}, code: 400, errType: "bad_data", errStart: `invalid parameter \"timeout\"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := post(t, srv.URL+"/api/v1/query", "application/x-www-form-urlencoded", tt.form.Encode())
			assert.Equal(t, tt.code, code)
			assert.True(t, strings.HasPrefix(body, `{"status":"error","errorType":"`+tt.errType+`","error":"`+tt.errStart), body)
		})
	}

	code, body := post(t, srv.URL+"/load", "text/plain", "not a { metric\n")
	assert.Equal(t, http.StatusBadRequest, code, body)
}

// While failing, queries answer 503 and readiness still 200.
func TestServeFail(t *testing.T) {
	srv := startServer(t)
	ready := func() int {
		resp, err := http.Get(srv.URL + "/-/ready")
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	now := time.Now()
	code, _ := queryAt(t, srv, "1", now)
	assert.Equal(t, http.StatusOK, code)

	code, _ = post(t, srv.URL+"/-/fail?on=true", "", "")
	require.Equal(t, http.StatusNoContent, code)
	code, body := queryAt(t, srv, "1", now)
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.NotContains(t, body, `"status"`, "a plain 503, not an API error")
	assert.Equal(t, http.StatusOK, ready())

	code, _ = post(t, srv.URL+"/-/fail?on=false", "", "")
	require.Equal(t, http.StatusNoContent, code)
	code, _ = queryAt(t, srv, "1", now)
	assert.Equal(t, http.StatusOK, code)

	code, _ = post(t, srv.URL+"/-/fail?on=maybe", "", "")
	assert.Equal(t, http.StatusBadRequest, code)
}

func TestTimestampAndFloat(t *testing.T) {
	assert.Equal(t, "1435781451.781", timestamp(1435781451781))
	assert.Equal(t, "1435781451.008", timestamp(1435781451008))
	assert.Equal(t, "1435781451", timestamp(1435781451000))
	assert.Equal(t, "-1.500", timestamp(-1500))
	assert.Equal(t, "0.5", formatFloat(0.5))
	assert.Equal(t, "1e-07", formatFloat(1e-7))
	assert.Equal(t, "-Inf", formatFloat(math.Inf(-1)))
}
