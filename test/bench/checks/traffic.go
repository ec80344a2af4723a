package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// requestsPerSecond is each revision's traffic in the fed series.
const requestsPerSecond = 10

// history is how far back a revision's series are backfilled when it is
// first seen, so that a rate over 30s has samples at its first query.
const history = 30 * time.Second

// scrapeEvery is the fed series' scrape interval.
const scrapeEvery = 5 * time.Second

// series is one revision's request counters: requestsPerSecond since
// since, a share of them 5xx.
type series struct {
	ns, hash string
	share    float64
	since    time.Time
}

// exposition is what a scrape of the revisions' pods gives at at, in the
// text format: counters that grow linearly from since (none before it).
func exposition(ss []series, at time.Time) string {
	var b strings.Builder
	for _, s := range ss {
		secs := at.Sub(s.since).Seconds()
		if secs < 0 {
			continue
		}
		total := requestsPerSecond * secs
		fmt.Fprintf(&b, "http_requests_total{namespace=%q,pod_template_hash=%q,code=\"200\"} %g\n", s.ns, s.hash, total*(1-s.share))
		fmt.Fprintf(&b, "http_requests_total{namespace=%q,pod_template_hash=%q,code=\"500\"} %g\n", s.ns, s.hash, total*s.share)
	}
	return b.String()
}

// feeder loads the stand-in Prometheus with the series of every revision
// added to it: each new one backfilled over history, then all of them once
// per scrapeEvery.
type feeder struct {
	url  string
	http *http.Client

	mu    sync.Mutex
	all   []series
	fresh []series
	known map[string]bool
}

func newFeeder(promURL string) *feeder {
	return &feeder{url: promURL, http: &http.Client{Timeout: 30 * time.Second}, known: map[string]bool{}}
}

// add feeds a revision from now on (once per hash).
func (f *feeder) add(ns, hash string, share float64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.known[hash] {
		return
	}
	f.known[hash] = true
	f.fresh = append(f.fresh, series{ns: ns, hash: hash, share: share, since: time.Now().Add(-history)})
}

// run feeds until ctx ends: new revisions within a second of add, every
// revision each scrapeEvery. Errors are returned on errs, not fatal: a
// late scrape makes a measurement Inconclusive, which the bench reports.
func (f *feeder) run(ctx context.Context, errs chan<- error) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	lastAll := time.Time{}
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			f.mu.Lock()
			fresh := f.fresh
			f.all = append(f.all, fresh...)
			f.fresh = nil
			all := append([]series(nil), f.all...)
			f.mu.Unlock()
			if len(fresh) > 0 {
				for at := now.Add(-history); !at.After(now); at = at.Add(scrapeEvery) {
					f.report(errs, f.load(exposition(fresh, at), at))
				}
			}
			if now.Sub(lastAll) >= scrapeEvery && len(all) > 0 {
				f.report(errs, f.load(exposition(all, now), now))
				lastAll = now
			}
		}
	}
}

func (f *feeder) report(errs chan<- error, err error) {
	if err == nil {
		return
	}
	select {
	case errs <- err:
	default:
	}
}

// load is harness.PromStub.Load without a testing.TB.
func (f *feeder) load(text string, at time.Time) error {
	u := f.url + "/load?time=" + strconv.FormatFloat(float64(at.UnixMilli())/1000, 'f', 3, 64)
	resp, err := f.http.Post(u, "text/plain; version=0.0.4", strings.NewReader(text))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("POST %s: %s", u, resp.Status)
	}
	return nil
}

// queryCounter sits between the guard and the stand-in and counts the
// queries that reach the stand-in, per second: the stand-in counts none.
type queryCounter struct {
	srv *http.Server
	url string

	mu     sync.Mutex
	perSec map[int64]int
}

func startQueryCounter(target string) (*queryCounter, error) {
	u, err := url.Parse(target)
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	q := &queryCounter{url: "http://" + l.Addr().String(), perSec: map[int64]int{}}
	proxy := httputil.NewSingleHostReverseProxy(u)
	q.srv = &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/api/v1/query" {
			q.mu.Lock()
			q.perSec[time.Now().Unix()]++
			q.mu.Unlock()
		}
		proxy.ServeHTTP(w, r)
	})}
	go func() { _ = q.srv.Serve(l) }()
	return q, nil
}

func (q *queryCounter) close() { _ = q.srv.Close() }

// rate is the queries between from and to: their count, the mean per
// second, and the busiest second's.
type rate struct {
	Queries int     `json:"queries"`
	Mean    float64 `json:"meanPerSecond"`
	Peak    int     `json:"peakPerSecond"`
}

func (q *queryCounter) between(from, to time.Time) rate {
	q.mu.Lock()
	defer q.mu.Unlock()
	return rateOf(q.perSec, from, to)
}

// rateOf summarises per-second counts (unix second → count) over [from, to).
func rateOf(perSec map[int64]int, from, to time.Time) rate {
	var r rate
	for s, n := range perSec {
		if s >= from.Unix() && s < to.Unix() {
			r.Queries += n
			r.Peak = max(r.Peak, n)
		}
	}
	if secs := to.Unix() - from.Unix(); secs > 0 {
		r.Mean = float64(r.Queries) / float64(secs)
	}
	return r
}
