// Command testapp is the real-node tier's workload: one small HTTP server
// whose behaviour each tag of its image chooses through its config's
// environment (test/image.AppTags), so that a Deployment fails on a real
// kubelet the way a bad release does:
//
//	APP_BEHAVIOUR=serve        serve on $PORT (8080); /healthz and /readyz answer 200
//	APP_BEHAVIOUR=crash        exit 1 at once
//	APP_BEHAVIOUR=never-ready  serve, but /readyz always answers 503
//	APP_BEHAVIOUR=pause        serve nothing, wait for SIGTERM: the node's pod sandbox
//	APP_CONFIG                 the app's one setting, read at start: "good" or empty;
//	                           any other value (the badconfig tag bakes "bad") exits 1.
//	                           Unset, it is read from the file $APP_CONFIG_FILE
//	                           (default /etc/testapp/config) when that exists, so that
//	                           a ConfigMap can set it either way.
//	APP_VERSION                shown by / : which revision answered
//	APP_ERRORS                 a share (0 to 1) of the requests to / answered 500,
//	                           evenly spread (0.3: 3 of each 10); the probes still pass
//	APP_LATENCY                a Go duration each answer of / waits first (300ms)
//	APP_DEGRADE_AFTER          a Go duration after start before APP_ERRORS and
//	                           APP_LATENCY apply: a release that degrades once it runs
//
// /metrics is in Prometheus's text format: http_requests_total{code} and
// the histogram http_request_duration_seconds, of the requests to / only
// (a check measures the app's traffic, not the kubelet's probes). Both codes
// are exported at 0 from the start, so that a revision serving no error yet
// has a series whose rate is 0 rather than none.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// The environment the app reads, and the file its setting may come from.
const (
	behaviourEnv      = "APP_BEHAVIOUR"
	configEnv         = "APP_CONFIG"
	configFileEnv     = "APP_CONFIG_FILE"
	defaultConfigFile = "/etc/testapp/config"
	versionEnv        = "APP_VERSION"
	portEnv           = "PORT"
	errorsEnv         = "APP_ERRORS"
	latencyEnv        = "APP_LATENCY"
	degradeAfterEnv   = "APP_DEGRADE_AFTER"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	os.Exit(run(ctx, os.Getenv, os.ReadFile, os.Stderr))
}

// app is what the environment asked for.
type app struct {
	// pause: hold the pod's namespaces and nothing else (the sandbox image).
	pause   bool
	ready   bool
	version string
	addr    string
	// degraded is how the app answers / once degradeAfter has passed
	// since start.
	degraded     degradation
	degradeAfter time.Duration
	// start and now tell how long the app has run; wait is how an answer
	// is slowed (a timer; tests record it instead).
	start time.Time
	now   func() time.Time
	wait  func(context.Context, time.Duration)

	mu     sync.Mutex
	served int // requests to / so far, to spread the errors evenly
}

// degradation is a bad release's behaviour on /.
type degradation struct {
	errors  float64
	latency time.Duration
}

// configure reads the environment and the config file. An error is what the
// app prints before it exits 1.
func configure(getenv func(string) string, readFile func(string) ([]byte, error)) (*app, error) {
	a := &app{version: getenv(versionEnv), addr: ":8080", start: time.Now(), now: time.Now, wait: sleep}
	if p := getenv(portEnv); p != "" {
		a.addr = ":" + p
	}
	if err := a.configureDegradation(getenv); err != nil {
		return nil, err
	}
	switch b := getenv(behaviourEnv); b {
	case "", "serve":
		a.ready = true
	case "never-ready":
	case "pause":
		a.pause = true
		return a, nil
	case "crash":
		return nil, fmt.Errorf("%s=crash: crashing on start, as asked", behaviourEnv)
	default:
		return nil, fmt.Errorf("%s=%q: want serve, crash, never-ready or pause", behaviourEnv, b)
	}
	setting, source := getenv(configEnv), configEnv
	if setting == "" {
		p := getenv(configFileEnv)
		if p == "" {
			p = defaultConfigFile
		}
		b, err := readFile(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			return nil, fmt.Errorf("reading %s from %s: %w", configEnv, p, err)
		default:
			setting, source = strings.TrimSpace(string(b)), configEnv+" (from "+p+")"
		}
	}
	if setting != "" && setting != "good" {
		return nil, fmt.Errorf("bad configuration: %s is %q, want \"good\"", source, setting)
	}
	return a, nil
}

// configureDegradation reads APP_ERRORS, APP_LATENCY and APP_DEGRADE_AFTER.
func (a *app) configureDegradation(getenv func(string) string) error {
	if v := getenv(errorsEnv); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < 0 || f > 1 {
			return fmt.Errorf("%s=%q: want a share of the requests from 0 to 1, such as 0.3", errorsEnv, v)
		}
		a.degraded.errors = f
	}
	for _, d := range []struct {
		env string
		to  *time.Duration
	}{{latencyEnv, &a.degraded.latency}, {degradeAfterEnv, &a.degradeAfter}} {
		v := getenv(d.env)
		if v == "" {
			continue
		}
		dur, err := time.ParseDuration(v)
		if err != nil || dur < 0 {
			return fmt.Errorf("%s=%q: want a Go duration such as 300ms or 60s", d.env, v)
		}
		*d.to = dur
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// failNext says whether the next request to / is one of the share answered
// 500: the n-th request fails when it carries the count of failures past a
// whole number (0.3: the 4th, 7th and 10th of each 10).
func (a *app) failNext(share float64) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.served++
	n := float64(a.served)
	return int(n*share) > int((n-1)*share)
}

// current is how / behaves now: as configured once degradeAfter has
// passed, healthy before.
func (a *app) current() degradation {
	if a.now().Sub(a.start) < a.degradeAfter {
		return degradation{}
	}
	return a.degraded
}

// handler serves / (the version), /healthz (always 200), /readyz (200
// when ready, else 503) and /metrics (the requests to /).
func (a *app) handler() http.Handler {
	reg := prometheus.NewRegistry()
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "http_requests_total", Help: "Requests to / by status code.",
	}, []string{"code"})
	duration := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "http_request_duration_seconds", Help: "Time to answer requests to /.",
		Buckets: []float64{.005, .01, .025, .05, .1, .2, .25, .5, 1, 2.5, 5},
	})
	reg.MustRegister(requests, duration)
	for _, code := range []string{"200", "500"} {
		requests.WithLabelValues(code)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		began := a.now()
		d := a.current()
		if d.latency > 0 {
			a.wait(r.Context(), d.latency)
		}
		if a.failNext(d.errors) {
			requests.WithLabelValues("500").Inc()
			http.Error(w, fmt.Sprintf("testapp %s: failing %g of the requests, as %s asks", a.version, d.errors, errorsEnv), http.StatusInternalServerError)
		} else {
			requests.WithLabelValues("200").Inc()
			fmt.Fprintf(w, "testapp %s\n", a.version)
		}
		duration.Observe(a.now().Sub(began).Seconds())
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !a.ready {
			http.Error(w, "never ready: "+behaviourEnv+"=never-ready", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	return mux
}

// run configures the app and serves until ctx ends; it returns the exit code.
func run(ctx context.Context, getenv func(string) string, readFile func(string) ([]byte, error), stderr io.Writer) int {
	a, err := configure(getenv, readFile)
	if err != nil {
		fmt.Fprintln(stderr, "testapp:", err)
		return 1
	}
	if a.pause {
		// Every container of the pod joins this one's namespaces: it must
		// hold no port.
		<-ctx.Done()
		return 0
	}
	ln, err := net.Listen("tcp", a.addr)
	if err != nil {
		fmt.Fprintln(stderr, "testapp:", err)
		return 1
	}
	fmt.Fprintf(stderr, "testapp %s: serving on %s (ready: %t)\n", a.version, ln.Addr(), a.ready)
	srv := &http.Server{Handler: a.handler(), ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		fmt.Fprintln(stderr, "testapp:", err)
		return 1
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		fmt.Fprintln(stderr, "testapp: shutting down:", err)
		return 1
	}
	return 0
}
