package tls

import (
	"context"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/certs"
	"github.com/deployguard/deployguard/test/harness"
)

// The admission load and its Deployments are the harness's (the faults tier
// runs the same load).
const refusedBecause = harness.RefusedBecause

func goodDeployment(ns string, i int64) *appsv1.Deployment { return harness.GoodDeployment(ns, i) }

func badDeployment(ns string, i int64) *appsv1.Deployment { return harness.BadDeployment(ns, i) }

func runLoad(ctx context.Context, c client.Client, ns string, rps int) *harness.LoadStats {
	return harness.RunLoad(ctx, c, ns, rps)
}

// observed records, in order, every serving certificate the guard presented
// and every CA bundle the API server was given.
type observed struct {
	mu      sync.Mutex
	leaves  []*x509.Certificate
	since   []time.Time // when each leaf was first seen
	bundles [][]*x509.Certificate

	bundleErrors []string
}

// observe dials the guard every 20ms and reads the injected bundle every
// 100ms until ctx ends.
func observe(ctx context.Context, served certs.ServedCertificate, c client.Client) *observed {
	o := &observed{}
	go func() {
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			leaf, err := served(ctx)
			if err != nil {
				continue
			}
			o.mu.Lock()
			if len(o.leaves) == 0 || !o.leaves[len(o.leaves)-1].Equal(leaf) {
				o.leaves = append(o.leaves, leaf)
				o.since = append(o.since, time.Now())
			}
			o.mu.Unlock()
		}
	}()
	go func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		var last []byte
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			b, err := injectedBundle(ctx, c)
			if err != nil {
				// The client's rate limiter refuses a read it could not start
				// before the run ends: the end of the run, not an error.
				if ctx.Err() == nil && !strings.Contains(err.Error(), "would exceed context deadline") {
					o.mu.Lock()
					o.bundleErrors = append(o.bundleErrors, err.Error())
					o.mu.Unlock()
				}
				continue
			}
			if string(b) == string(last) {
				continue
			}
			last = b
			cas, err := certs.ParseBundle(b)
			if err != nil {
				continue
			}
			o.mu.Lock()
			o.bundles = append(o.bundles, cas)
			o.mu.Unlock()
		}
	}()
	return o
}

// servingRotations is how many times the served certificate changed.
func (o *observed) servingRotations() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return max(0, len(o.leaves)-1)
}

// signingCAs are the distinct CAs (by key id) that signed a served certificate.
func (o *observed) signingCAs() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []string
	for _, l := range o.leaves {
		id := hex.EncodeToString(l.AuthorityKeyId)
		if len(out) == 0 || out[len(out)-1] != id {
			out = append(out, id)
		}
	}
	return out
}

// injectedCAs are the distinct CA certificates the injected bundles held, in
// the order they appeared, each as serial@notBefore.
func (o *observed) injectedCAs() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []string
	for _, b := range o.bundles {
		for _, ca := range b {
			s := fmt.Sprintf("%x@%s", ca.SerialNumber.Bytes()[:4], ca.NotBefore.UTC().Format("15:04:05"))
			if !slices.Contains(out, s) {
				out = append(out, s)
			}
		}
	}
	return out
}

// apiServerConnections samples, every 100ms until ctx ends, the connections
// open to the guard's webhook port, and records when each new one (a new TLS
// handshake, with the certificate served at that moment) was first seen. Only
// kube-apiserver connects to that port in these tests: the load goes through
// it. It reads the kernel's socket tables (/proc/net/tcp and tcp6), so it needs
// no tool of its own.
func apiServerConnections(ctx context.Context, port int) (*connSeen, error) {
	if _, err := os.Stat("/proc/net/tcp"); err != nil {
		return nil, fmt.Errorf("counting the API server's connections to the guard needs /proc/net/tcp: %w", err)
	}
	cs := &connSeen{first: map[string]time.Time{}}
	localPort := fmt.Sprintf(":%04X", port)
	go func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			now := time.Now()
			for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
				b, err := os.ReadFile(table)
				if err != nil {
					continue
				}
				cs.mu.Lock()
				for _, line := range strings.Split(string(b), "\n")[1:] {
					// sl local_address rem_address st …; st 01 is ESTABLISHED.
					f := strings.Fields(line)
					if len(f) < 4 || f[3] != "01" || !strings.HasSuffix(f[1], localPort) {
						continue
					}
					if _, ok := cs.first[f[2]]; !ok {
						cs.first[f[2]] = now
					}
				}
				cs.mu.Unlock()
			}
		}
	}()
	return cs, nil
}

type connSeen struct {
	mu    sync.Mutex
	first map[string]time.Time
}

// exercised counts the served certificates during whose time in service the
// API server opened at least one new connection to the guard, that is made a
// TLS handshake with it and verified it against the bundle it held.
func exercised(o *observed, cs *connSeen) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	cs.mu.Lock()
	defer cs.mu.Unlock()
	n := 0
	for i, from := range o.since {
		to := time.Now()
		if i+1 < len(o.since) {
			to = o.since[i+1]
		}
		for _, at := range cs.first {
			if !at.Before(from) && at.Before(to) {
				n++
				break
			}
		}
	}
	return n
}

// trustChecks dials every replica every 50ms until ctx ends and verifies what
// each serves against the bundle injected at that moment, as the API server
// would on a new connection.
type trustChecks struct {
	mu        sync.Mutex
	checks    int
	untrusted []string
}

func checkTrust(ctx context.Context, c client.Client, replicas ...certs.ServedCertificate) *trustChecks {
	tc := &trustChecks{}
	go func() {
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			bundle, err := injectedBundle(ctx, c)
			if err != nil {
				continue
			}
			for i, served := range replicas {
				leaf, err := served(ctx)
				if err != nil {
					continue
				}
				err = certs.Verify(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leaf.Raw}), bundle, []string{"127.0.0.1"}, time.Now())
				tc.mu.Lock()
				tc.checks++
				if err != nil && ctx.Err() == nil && len(tc.untrusted) < 100 {
					tc.untrusted = append(tc.untrusted, fmt.Sprintf("replica %d: %v", i, err))
				}
				tc.mu.Unlock()
			}
		}
	}()
	return tc
}

// secretWrites counts the updates of a Secret until ctx ends.
func secretWrites(ctx context.Context, c client.WithWatch, ns, name string) (*atomic.Int64, error) {
	w, err := c.Watch(ctx, &corev1.SecretList{}, client.InNamespace(ns), client.MatchingFields{"metadata.name": name})
	if err != nil {
		return nil, err
	}
	n := &atomic.Int64{}
	go func() {
		defer w.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-w.ResultChan():
				if !ok {
					return
				}
				if e.Type == watch.Modified {
					n.Add(1)
				}
			}
		}
	}()
	return n, nil
}
