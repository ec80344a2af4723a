package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/deployguard/deployguard/reconciler/rollout"
)

func TestExpectedMeasurements(t *testing.T) {
	for _, tc := range []struct {
		name                         string
		span, initialDelay, interval time.Duration
		want                         float64
	}{
		{"one after the delay, then one per interval", 5*time.Minute + 5*time.Second, 5 * time.Second, 10 * time.Second, 31},
		{"a span shorter than the delay measures nothing", 3 * time.Second, 5 * time.Second, 10 * time.Second, 0},
		{"no delay", 60 * time.Second, 0, 10 * time.Second, 7},
		{"a part of an interval measures nothing more", 41 * time.Second, 5 * time.Second, 10 * time.Second, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.InDelta(t, tc.want, expectedMeasurements(tc.span, tc.initialDelay, tc.interval), 1e-9)
		})
	}
}

func TestExposition(t *testing.T) {
	since := time.Unix(1000, 0)
	ss := []series{{ns: "a", hash: "h1", share: 0.3, since: since}, {ns: "b", hash: "h2", since: since.Add(time.Hour)}}
	got := exposition(ss, since.Add(10*time.Second))
	// 10 requests a second for 10 s, 30% of them 5xx; h2 has not started.
	assert.Equal(t, "http_requests_total{namespace=\"a\",pod_template_hash=\"h1\",code=\"200\"} 70\n"+
		"http_requests_total{namespace=\"a\",pod_template_hash=\"h1\",code=\"500\"} 30\n", got)
}

func TestRateOf(t *testing.T) {
	from := time.Unix(100, 0)
	got := rateOf(map[int64]int{99: 50, 100: 20, 101: 25, 103: 15, 104: 90}, from, from.Add(4*time.Second))
	assert.Equal(t, rate{Queries: 60, Mean: 15, Peak: 25}, got)
}

func TestReactionOf(t *testing.T) {
	at := func(s string) time.Time { t, _ := time.Parse(time.RFC3339, s); return t }
	runs := map[string]*rollout.CheckRun{
		"a/x": {FirstFailed: "2026-01-01T00:00:00Z", Failed: "2026-01-01T00:00:10Z"},
		"a/y": {FirstFailed: "2026-01-01T00:00:00Z", Failed: "2026-01-01T00:00:20Z"},
		"a/z": {FirstFailed: "2026-01-01T00:00:00Z", Failed: "2026-01-01T00:00:30Z"},
		"a/w": {}, // never failed: not a check's rollback
	}
	seen := map[string]time.Time{
		"a/x": at("2026-01-01T00:00:11Z"), "a/y": at("2026-01-01T00:00:22Z"), "a/z": at("2026-01-01T00:00:33Z"), "a/w": at("2026-01-01T00:00:05Z"),
	}
	r := reactionOf(seen, runs)
	assert.Equal(t, 3, r.Rollbacks)
	assert.Equal(t, 22*time.Second, r.Median)
	assert.Equal(t, 33*time.Second, r.P90)
	assert.Equal(t, 33*time.Second, r.Worst)
	assert.Equal(t, 20*time.Second, r.ToVerdictMedian)
	assert.Equal(t, 3*time.Second, r.VerdictToRollbackWorst)
}

func TestFailingAtSpreadsOverNamespaces(t *testing.T) {
	b := &bench{o: options{deployments: 1000, namespaces: 10, failing: 20}}
	perNamespace := map[string]int{}
	for i := range b.o.deployments {
		if b.failingAt(i) {
			ns, _ := b.deploymentAt(i)
			perNamespace[ns]++
		}
	}
	assert.Len(t, perNamespace, 10)
	for ns, n := range perNamespace {
		assert.Equal(t, 2, n, ns)
	}
}

func TestThrottledIn(t *testing.T) {
	dump := "goroutine 1 [select]:\nk8s.io/client-go/rest.(*Request).tryThrottleWithInfo(...)\n\n" +
		"goroutine 2 [IO wait]:\nnet.(*netFD).Read(...)\n\n" +
		"goroutine 3 [select]:\ngolang.org/x/time/rate.(*Limiter).wait(...)\nk8s.io/client-go/rest.(*Request).tryThrottle(...)\n"
	assert.Equal(t, 2, throttledIn(dump))
}
