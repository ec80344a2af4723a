package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/tsdb"
)

// serve runs a stand-in Prometheus on addr until SIGTERM or SIGINT: the
// instant query API over a TSDB that tests fill with POST /load. Its first
// line on out is the base URL it listens on (addr may be 127.0.0.1:0).
func serve(addr string, out io.Writer) error {
	dir, err := os.MkdirTemp("", "promql-serve-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	s, err := newServer(dir)
	if err != nil {
		return err
	}
	defer func() { _ = s.close() }()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: s.handler(), ReadHeaderTimeout: 10 * time.Second}
	if _, err := fmt.Fprintf(out, "http://%s\n", l.Addr()); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return srv.Shutdown(shutdown)
}

// server is the stand-in Prometheus: a TSDB, the real PromQL engine over it,
// and a switch that makes every query answer 503.
type server struct {
	dir     string
	db      *tsdb.DB
	engine  *promql.Engine
	failing atomic.Bool
	loadMu  sync.Mutex // load reads its body from one file in dir
}

func newServer(dir string) (*server, error) {
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	opts := tsdb.DefaultOptions()
	// Tests backfill a few minutes of history with /load?time=…, after
	// samples at later times may already be there.
	opts.OutOfOrderTimeWindow = time.Hour.Milliseconds()
	db, err := tsdb.Open(filepath.Join(dir, "data"), logger, nil, opts, nil)
	if err != nil {
		return nil, err
	}
	engine := promql.NewEngine(promql.EngineOpts{
		Logger: logger, MaxSamples: 1_000_000, Timeout: 2 * time.Minute, LookbackDelta: 5 * time.Minute, Parser: promqlParser,
	})
	return &server{dir: dir, db: db, engine: engine}, nil
}

func (s *server) close() error { return s.db.Close() }

func (s *server) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/v1/query", s.query)
	mux.HandleFunc("POST /api/v1/query", s.query)
	mux.HandleFunc("POST /load", s.load)
	mux.HandleFunc("POST /-/fail", s.fail)
	mux.HandleFunc("GET /-/ready", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "Prometheus Server is Ready.\n")
	})
	mux.HandleFunc("GET /-/healthy", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "Prometheus Server is Healthy.\n")
	})
	return mux
}

// fail turns failing on or off: while on, queries answer 503 as a
// Prometheus that is not ready does (plain text, no API JSON).
func (s *server) fail(w http.ResponseWriter, r *http.Request) {
	on, err := strconv.ParseBool(r.URL.Query().Get("on"))
	if err != nil {
		http.Error(w, "on must be true or false", http.StatusBadRequest)
		return
	}
	s.failing.Store(on)
	w.WriteHeader(http.StatusNoContent)
}

// load appends every sample of a body in the text exposition format at the
// current time, or at ?time=<unix seconds>.
func (s *server) load(w http.ResponseWriter, r *http.Request) {
	at := time.Now()
	if v := r.URL.Query().Get("time"); v != "" {
		t, err := parseTime(v)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		at = t
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 16<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	// fire.go's load reads a file: the same parsing and appending as -fire.
	s.loadMu.Lock()
	defer s.loadMu.Unlock()
	path := filepath.Join(s.dir, "load.prom")
	if err := os.WriteFile(path, body, 0o600); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if err := load(s.db, path, at); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// query answers GET or POST /api/v1/query as Prometheus's HTTP API does.
func (s *server) query(w http.ResponseWriter, r *http.Request) {
	if s.failing.Load() {
		http.Error(w, "Service Unavailable", http.StatusServiceUnavailable)
		return
	}
	if err := r.ParseForm(); err != nil {
		respondError(w, "bad_data", err)
		return
	}
	ts := time.Now()
	if v := r.Form.Get("time"); v != "" {
		t, err := parseTime(v)
		if err != nil {
			respondError(w, "bad_data", fmt.Errorf("invalid parameter %q: invalid time value for 'time': %w", "time", err))
			return
		}
		ts = t
	}
	ctx := r.Context()
	if v := r.Form.Get("timeout"); v != "" {
		d, err := parseDuration(v)
		if err != nil || d <= 0 {
			respondError(w, "bad_data", fmt.Errorf("invalid parameter %q: %q is not a positive duration", "timeout", v))
			return
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	q, err := s.engine.NewInstantQuery(ctx, s.db, nil, r.Form.Get("query"), ts)
	if err != nil {
		respondError(w, "bad_data", fmt.Errorf("invalid parameter %q: %w", "query", err))
		return
	}
	defer q.Close()
	res := q.Exec(ctx)
	if res.Err != nil {
		respondError(w, errorType(res.Err), res.Err)
		return
	}
	data, err := encodeValue(res.Value)
	if err != nil {
		respondError(w, "execution", err)
		return
	}
	b, err := json.Marshal(response{Status: "success", Data: &data})
	if err != nil {
		respondError(w, "execution", err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

// response is the API's envelope, its fields in Prometheus's order.
type response struct {
	Status    string  `json:"status"`
	Data      *result `json:"data,omitempty"`
	ErrorType string  `json:"errorType,omitempty"`
	Error     string  `json:"error,omitempty"`
}

// errorType is Prometheus's errorType for an engine error (returnAPIError).
func errorType(err error) string {
	var (
		eqc promql.ErrQueryCanceled
		eqt promql.ErrQueryTimeout
		es  promql.ErrStorage
	)
	switch {
	case errors.As(err, &eqc), errors.Is(err, context.Canceled):
		return "canceled"
	case errors.As(err, &eqt):
		return "timeout"
	case errors.As(err, &es):
		return "internal"
	}
	return "execution"
}

// errorStatus is Prometheus's HTTP status for an errorType.
var errorStatus = map[string]int{
	"bad_data": http.StatusBadRequest, "execution": http.StatusUnprocessableEntity,
	"canceled": 499, "timeout": http.StatusServiceUnavailable, "internal": http.StatusInternalServerError,
}

func respondError(w http.ResponseWriter, typ string, err error) {
	b, _ := json.Marshal(response{Status: "error", ErrorType: typ, Error: err.Error()})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(errorStatus[typ])
	_, _ = w.Write(b)
}

// result is the API's "data" for one query result.
type result struct {
	ResultType string `json:"resultType"`
	Result     any    `json:"result"`
}

type jsonSample struct {
	Metric map[string]string `json:"metric"`
	Value  pair              `json:"value"`
}

type jsonSeries struct {
	Metric map[string]string `json:"metric"`
	Values []pair            `json:"values"`
}

// pair is [<unix seconds>, "<value>"], encoded as Prometheus's jsonutil does.
type pair struct {
	T int64 // milliseconds
	V string
}

func (p pair) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('[')
	b.WriteString(timestamp(p.T))
	b.WriteByte(',')
	v, _ := json.Marshal(p.V)
	b.Write(v)
	b.WriteByte(']')
	return b.Bytes(), nil
}

func floatPair(t int64, f float64) pair { return pair{T: t, V: formatFloat(f)} }

func encodeValue(v parser.Value) (result, error) {
	switch v := v.(type) {
	case promql.Scalar:
		return result{"scalar", floatPair(v.T, v.V)}, nil
	case promql.String:
		return result{"string", pair{T: v.T, V: v.V}}, nil
	case promql.Vector:
		out := make([]jsonSample, 0, len(v))
		for _, s := range v {
			if s.H != nil {
				return result{}, errors.New("native histogram samples are not served by this stand-in")
			}
			out = append(out, jsonSample{Metric: s.Metric.Map(), Value: floatPair(s.T, s.F)})
		}
		return result{"vector", out}, nil
	case promql.Matrix:
		out := make([]jsonSeries, 0, len(v))
		for _, s := range v {
			if len(s.Histograms) > 0 {
				return result{}, errors.New("native histogram samples are not served by this stand-in")
			}
			vs := make([]pair, 0, len(s.Floats))
			for _, p := range s.Floats {
				vs = append(vs, floatPair(p.T, p.F))
			}
			out = append(out, jsonSeries{Metric: s.Metric.Map(), Values: vs})
		}
		return result{"matrix", out}, nil
	}
	return result{}, fmt.Errorf("unexpected result type %T", v)
}

// timestamp writes milliseconds as seconds, as jsonutil.MarshalTimestamp.
func timestamp(ms int64) string {
	sign := ""
	if ms < 0 {
		sign, ms = "-", -ms
	}
	s := sign + strconv.FormatInt(ms/1000, 10)
	if f := ms % 1000; f != 0 {
		s += fmt.Sprintf(".%03d", f)
	}
	return s
}

// formatFloat writes a value as jsonutil.MarshalFloat: "NaN", "+Inf", "-Inf",
// exponent form only for very small or very large numbers.
func formatFloat(f float64) string {
	format := byte('f')
	if a := math.Abs(f); a != 0 && (a < 1e-6 || a >= 1e21) {
		format = 'e'
	}
	return strconv.FormatFloat(f, format, -1, 64)
}

// parseTime reads unix seconds (with a fraction) or RFC 3339, as Prometheus.
func parseTime(s string) (time.Time, error) {
	if t, err := strconv.ParseFloat(s, 64); err == nil {
		sec, frac := math.Modf(t)
		frac = math.Round(frac*1000) / 1000
		return time.Unix(int64(sec), int64(frac*float64(time.Second))).UTC(), nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("cannot parse %q to a valid timestamp", s)
}

// parseDuration reads seconds (with a fraction) or a Prometheus duration.
func parseDuration(s string) (time.Duration, error) {
	if d, err := strconv.ParseFloat(s, 64); err == nil {
		return time.Duration(d * float64(time.Second)), nil
	}
	d, err := model.ParseDuration(s)
	return time.Duration(d), err
}
