package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The traffic a metric check needs: without requests an error rate is no
// number (Inconclusive), and nothing is ever rolled back on it.
const (
	requestEvery = 50 * time.Millisecond // 20 a second
	reportEvery  = 10 * time.Second
)

// tally counts what the requests got.
type tally struct{ ok, failed, errs atomic.Int64 }

// take returns the counts and starts again from zero.
func (t *tally) take() (ok, failed, errs int64) {
	return t.ok.Swap(0), t.failed.Swap(0), t.errs.Swap(0)
}

// sendTraffic waits for the Service ns/name, then sends it requestEvery a
// request through its ClusterIP (as kube-proxy routes it from the node: this
// namespace), each on a new connection so that kube-proxy spreads them over
// the pods, and writes to out what they got every reportEvery, until ctx
// ends.
func sendTraffic(ctx context.Context, cl client.Client, ns, name string, out io.Writer) {
	addr, err := waitService(ctx, cl, ns, name)
	if err != nil {
		return // ctx ended
	}
	fmt.Fprintf(out, "Sending 20 requests a second to Service %s/%s (%s).\n", ns, name, addr)
	url := "http://" + addr + "/"
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	var t tally
	var wg sync.WaitGroup
	defer wg.Wait()
	send, report := time.NewTicker(requestEvery), time.NewTicker(reportEvery)
	defer send.Stop()
	defer report.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-report.C:
			ok, failed, errs := t.take()
			fmt.Fprintf(out, "%s %s/%s: %d 2xx, %d 5xx, %d without an answer in the last %s\n",
				time.Now().Format(time.TimeOnly), ns, name, ok, failed, errs, reportEvery)
		case <-send.C:
			// Not one after the other: a slow release must not slow the
			// traffic down.
			wg.Go(func() { get(ctx, c, url, &t) })
		}
	}
}

func get(ctx context.Context, c *http.Client, url string, t *tally) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.errs.Add(1)
		return
	}
	resp, err := c.Do(req)
	if err != nil {
		if ctx.Err() == nil {
			t.errs.Add(1)
		}
		return
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode >= 500 {
		t.failed.Add(1)
	} else {
		t.ok.Add(1)
	}
}

// waitService returns the ClusterIP:port of the Service ns/name once it has
// one.
func waitService(ctx context.Context, cl client.Client, ns, name string) (string, error) {
	for {
		var svc corev1.Service
		if err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &svc); err == nil &&
			svc.Spec.ClusterIP != "" && svc.Spec.ClusterIP != corev1.ClusterIPNone && len(svc.Spec.Ports) > 0 {
			return net.JoinHostPort(svc.Spec.ClusterIP, strconv.Itoa(int(svc.Spec.Ports[0].Port))), nil
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
}
