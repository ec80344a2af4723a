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
	"strings"
	"syscall"
	"time"
)

// The environment the app reads, and the file its setting may come from.
const (
	behaviourEnv      = "APP_BEHAVIOUR"
	configEnv         = "APP_CONFIG"
	configFileEnv     = "APP_CONFIG_FILE"
	defaultConfigFile = "/etc/testapp/config"
	versionEnv        = "APP_VERSION"
	portEnv           = "PORT"
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
}

// configure reads the environment and the config file. An error is what the
// app prints before it exits 1.
func configure(getenv func(string) string, readFile func(string) ([]byte, error)) (*app, error) {
	a := &app{version: getenv(versionEnv), addr: ":8080"}
	if p := getenv(portEnv); p != "" {
		a.addr = ":" + p
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

// handler serves / (the version), /healthz (always 200) and /readyz (200
// when ready, else 503).
func (a *app) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "testapp %s\n", a.version)
	})
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
