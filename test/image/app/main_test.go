package main

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/deployguard/deployguard/test/image"
)

// env is an environment, and files a file system, for configure.
func env(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }

func files(kv map[string]string) func(string) ([]byte, error) {
	return func(p string) ([]byte, error) {
		if b, ok := kv[p]; ok {
			return []byte(b), nil
		}
		return nil, fs.ErrNotExist
	}
}

// tagEnv is the environment a tag of the image bakes into its config.
func tagEnv(t *testing.T, tag string) map[string]string {
	for _, at := range image.AppTags() {
		if at.Tag != tag {
			continue
		}
		kv := map[string]string{}
		for _, e := range at.Env {
			k, v, ok := strings.Cut(e, "=")
			require.True(t, ok, e)
			kv[k] = v
		}
		return kv
	}
	require.FailNowf(t, "no tag", "no tag %q in image.AppTags", tag)
	return nil
}

func TestEachTagBehavesAsItsPurposeSays(t *testing.T) {
	for _, tc := range []struct {
		tag       string
		exits     string // the start-up error; empty: it serves
		readyCode int
	}{
		{tag: "v1", readyCode: http.StatusOK},
		{tag: "v2", readyCode: http.StatusOK},
		{tag: "crash", exits: "APP_BEHAVIOUR=crash: crashing on start, as asked"},
		{tag: "badconfig", exits: `bad configuration: APP_CONFIG is "bad", want "good"`},
		{tag: "never-ready", readyCode: http.StatusServiceUnavailable},
		// Their first answer of / is a success (the errors are spread).
		{tag: "errors", readyCode: http.StatusOK},
		{tag: "latency", readyCode: http.StatusOK},
		{tag: "degrades", readyCode: http.StatusOK},
	} {
		t.Run(tc.tag, func(t *testing.T) {
			kv := tagEnv(t, tc.tag)
			if tc.exits != "" {
				var stderr bytes.Buffer
				code := run(context.Background(), env(kv), files(nil), &stderr)
				assert.Equal(t, 1, code)
				assert.Equal(t, "testapp: "+tc.exits+"\n", stderr.String())
				return
			}
			a, err := configure(env(kv), files(nil))
			require.NoError(t, err)
			a.wait = func(context.Context, time.Duration) {}
			h := a.handler()
			for p, want := range map[string]int{"/healthz": http.StatusOK, "/readyz": tc.readyCode, "/": http.StatusOK} {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, p, nil))
				assert.Equal(t, want, rec.Code, p)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
			assert.Equal(t, "testapp "+tc.tag+"\n", rec.Body.String(), "/ names the revision")
		})
	}
}

// The pause tag holds no port (every container of the pod shares its
// network) and exits 0 on SIGTERM, as the sandbox's image must: run on a
// port this test holds, it would fail to listen and exit 1.
func TestPauseHoldsNothingAndStopsOnSignal(t *testing.T) {
	held, err := net.Listen("tcp", ":0")
	require.NoError(t, err)
	defer held.Close()
	kv := tagEnv(t, "pause")
	kv["PORT"] = strconv.Itoa(held.Addr().(*net.TCPAddr).Port)
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // SIGTERM already came
	var stderr bytes.Buffer
	assert.Equal(t, 0, run(ctx, env(kv), files(nil), &stderr))
	assert.Empty(t, stderr.String())
}

func TestConfigFromAFile(t *testing.T) {
	for _, tc := range []struct {
		name  string
		env   map[string]string
		files map[string]string
		err   string
	}{
		{name: "no setting anywhere serves"},
		{name: "good in the default file", files: map[string]string{"/etc/testapp/config": "good\n"}},
		{name: "bad in the default file", files: map[string]string{"/etc/testapp/config": "bad\n"},
			err: `bad configuration: APP_CONFIG (from /etc/testapp/config) is "bad", want "good"`},
		{name: "bad in a file APP_CONFIG_FILE names", env: map[string]string{"APP_CONFIG_FILE": "/config/app"}, files: map[string]string{"/config/app": "bad"},
			err: `bad configuration: APP_CONFIG (from /config/app) is "bad", want "good"`},
		{name: "the environment wins over the file", env: map[string]string{"APP_CONFIG": "good"}, files: map[string]string{"/etc/testapp/config": "bad"}},
		{name: "an unknown behaviour", env: map[string]string{"APP_BEHAVIOUR": "sleep"}, err: `APP_BEHAVIOUR="sleep": want serve, crash, never-ready or pause`},
		{name: "an error share past 1", env: map[string]string{"APP_ERRORS": "30"}, err: `APP_ERRORS="30": want a share of the requests from 0 to 1, such as 0.3`},
		{name: "a latency without a unit", env: map[string]string{"APP_LATENCY": "300"}, err: `APP_LATENCY="300": want a Go duration such as 300ms or 60s`},
		{name: "a negative degrade-after", env: map[string]string{"APP_DEGRADE_AFTER": "-1s"}, err: `APP_DEGRADE_AFTER="-1s": want a Go duration such as 300ms or 60s`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := configure(env(tc.env), files(tc.files))
			if tc.err == "" {
				assert.NoError(t, err)
			} else {
				assert.EqualError(t, err, tc.err)
			}
		})
	}
}

// clock is the app's time as a test moves it: an answer's wait advances it.
type clock struct{ t time.Time }

func (c *clock) now() time.Time                          { return c.t }
func (c *clock) wait(_ context.Context, d time.Duration) { c.t = c.t.Add(d) }

// A degraded tag's answers of /, 100 requests after a given time since
// start, and what /metrics then says about them: the share of 500s Prometheus
// would compute, and the requests the histogram counts above 250ms.
func TestDegradedTagsAsAMetricCheckSeesThem(t *testing.T) {
	for _, tc := range []struct {
		tag      string
		after    time.Duration // since start
		want500  int
		wantSlow int // answered in more than 250ms
	}{
		{tag: "v1", after: time.Hour, want500: 0, wantSlow: 0},
		{tag: "errors", after: 0, want500: 30, wantSlow: 0},
		{tag: "latency", after: 0, want500: 0, wantSlow: 100},
		{tag: "degrades", after: 59 * time.Second, want500: 0, wantSlow: 0},
		{tag: "degrades", after: 60 * time.Second, want500: 30, wantSlow: 0},
	} {
		t.Run(fmt.Sprintf("%s %s after start", tc.tag, tc.after), func(t *testing.T) {
			a, err := configure(env(tagEnv(t, tc.tag)), files(nil))
			require.NoError(t, err)
			c := &clock{t: time.Unix(1000, 0)}
			a.start, a.now, a.wait = c.t, c.now, c.wait
			c.t = c.t.Add(tc.after)
			h := a.handler()
			codes := map[int]int{}
			for range 100 {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
				codes[rec.Code]++
			}
			assert.Equal(t, tc.want500, codes[http.StatusInternalServerError], "500s of 100")
			assert.Equal(t, 100-tc.want500, codes[http.StatusOK], "200s of 100")
			// The probes are not the app's traffic: they pass, uncounted.
			for _, p := range []string{"/healthz", "/readyz"} {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, p, nil))
				assert.Equal(t, http.StatusOK, rec.Code, p)
			}

			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
			require.Equal(t, http.StatusOK, rec.Code)
			p := expfmt.NewTextParser(model.UTF8Validation)
			fams, err := p.TextToMetricFamilies(rec.Body)
			require.NoError(t, err, "the text format Prometheus scrapes")
			byCode := map[string]float64{}
			for _, m := range fams["http_requests_total"].GetMetric() {
				byCode[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
			}
			assert.Equal(t, map[string]float64{"200": float64(100 - tc.want500), "500": float64(tc.want500)}, byCode,
				"both codes exported, at 0 when none was served")
			hist := fams["http_request_duration_seconds"].GetMetric()[0].GetHistogram()
			assert.Equal(t, uint64(100), hist.GetSampleCount())
			var upTo250ms uint64
			for _, b := range hist.GetBucket() {
				if b.GetUpperBound() == 0.25 {
					upTo250ms = b.GetCumulativeCount()
				}
			}
			assert.Equal(t, uint64(100-tc.wantSlow), upTo250ms, "answered within 250ms")
		})
	}
}
