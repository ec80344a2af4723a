package main

import (
	"bytes"
	"context"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

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
