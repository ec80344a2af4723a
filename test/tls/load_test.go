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
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/certs"
)

// refusedBecause is the guard's own message for a rollout that may take every
// replica down: a refusal with any other message (such as "failed calling
// webhook") is a failure.
const refusedBecause = "may take every replica down at once"

// goodDeployment has no selector: only the guard's mutating webhook repairs
// that (the API server would refuse it), so a defaulted selector proves the
// API server called the guard.
func goodDeployment(ns string, i int64) *appsv1.Deployment {
	name := fmt.Sprintf("load-%d", i)
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr(int32(2)),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app.kubernetes.io/name": name}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name: "app", Image: "nginx:1.27.3",
					Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
						corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("64Mi"),
					}},
					ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/", Port: intstr.FromInt32(80)}}},
				}}},
			},
		},
	}
}

// badDeployment lets a rollout take all four replicas down: the guard's
// validating webhook refuses it.
func badDeployment(ns string, i int64) *appsv1.Deployment {
	d := goodDeployment(ns, i)
	d.Spec.Replicas = ptr(int32(4))
	d.Spec.Selector = &metav1.LabelSelector{MatchLabels: d.Spec.Template.Labels}
	all := intstr.FromString("100%")
	d.Spec.Strategy = appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType,
		RollingUpdate: &appsv1.RollingUpdateDeployment{MaxUnavailable: &all}}
	return d
}

func ptr[T any](v T) *T { return &v }

// loadStats counts what a load run sent and how it went.
type loadStats struct {
	sent, defaulted, refused, failed atomic.Int64
	elapsed                          time.Duration

	mu       sync.Mutex
	failures []string // the first few, for the report
}

func (s *loadStats) fail(msg string) {
	s.failed.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.failures) < 10 {
		s.failures = append(s.failures, time.Now().Format("15:04:05.000")+" "+msg)
	}
}

func (s *loadStats) rate() float64 { return float64(s.sent.Load()) / s.elapsed.Seconds() }

func (s *loadStats) String() string {
	return fmt.Sprintf("%d requests in %s (%.1f/s): %d defaulted, %d refused by the guard, %d failed",
		s.sent.Load(), s.elapsed.Round(time.Millisecond), s.rate(), s.defaulted.Load(), s.refused.Load(), s.failed.Load())
}

// runLoad sends rps admission requests per second through the API server until
// ctx ends: server-side dry-run creates of Deployments, each calling both of
// the guard's webhooks. Nine in ten are good and must come back defaulted, one
// in ten must be refused with the guard's message; anything else fails.
//
// The requests come in bursts, a quarter of a second's worth at once, as when
// a GitOps tool syncs many applications: the API server then needs more
// connections to the guard than it keeps idle, so it keeps opening new ones,
// each a TLS handshake with the certificate served at that moment.
func runLoad(ctx context.Context, c client.Client, ns string, rps int) *loadStats {
	s := &loadStats{}
	const burstsPerSecond = 4
	burst := rps / burstsPerSecond
	jobs := make(chan int64, 4*rps)
	var wg sync.WaitGroup
	for range 2 * burst {
		wg.Go(func() {
			for i := range jobs {
				s.send(c, ns, i)
			}
		})
	}
	start := time.Now()
	tick := time.NewTicker(time.Second / burstsPerSecond)
	defer tick.Stop()
	var i int64
	func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				for range burst {
					select {
					case jobs <- i:
						i++
					default: // the workers are behind: the achieved rate shows it
					}
				}
			}
		}
	}()
	close(jobs)
	wg.Wait()
	s.elapsed = time.Since(start)
	return s
}

// send makes request i and records how it went.
func (s *loadStats) send(c client.Client, ns string, i int64) {
	s.sent.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if i%10 == 9 {
		err := c.Create(ctx, badDeployment(ns, i), client.DryRunAll)
		switch {
		case err == nil:
			s.fail("a Deployment that takes every replica down was admitted")
		case !strings.Contains(err.Error(), refusedBecause):
			s.fail(err.Error())
		default:
			s.refused.Add(1)
		}
		return
	}
	d := goodDeployment(ns, i)
	err := c.Create(ctx, d, client.DryRunAll)
	switch {
	case err != nil:
		s.fail(err.Error())
	case d.Spec.Selector == nil:
		s.fail("admitted without the guard's defaults: the mutating webhook was not called")
	default:
		s.defaulted.Add(1)
	}
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
