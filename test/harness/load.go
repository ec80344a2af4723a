package harness

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// RefusedBecause is the guard's own message for a rollout that may take every
// replica down: a refusal with any other message (such as "failed calling
// webhook") is a failure.
const RefusedBecause = "may take every replica down at once"

// GoodDeployment has no selector: only the guard's mutating webhook repairs
// that (the API server would refuse it), so a defaulted selector proves the
// API server called the guard.
func GoodDeployment(ns string, i int64) *appsv1.Deployment {
	name := fmt.Sprintf("load-%d", i)
	two := int32(2)
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: &two,
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

// BadDeployment lets a rollout take all four replicas down: the guard's
// validating webhook refuses it.
func BadDeployment(ns string, i int64) *appsv1.Deployment {
	d := GoodDeployment(ns, i)
	four := int32(4)
	d.Spec.Replicas = &four
	d.Spec.Selector = &metav1.LabelSelector{MatchLabels: d.Spec.Template.Labels}
	all := intstr.FromString("100%")
	d.Spec.Strategy = appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType,
		RollingUpdate: &appsv1.RollingUpdateDeployment{MaxUnavailable: &all}}
	return d
}

// LoadConfig is cfg without client-side rate limits, for a client that
// sends a load: the load must reach the API server at the rate asked.
func LoadConfig(cfg *rest.Config) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.QPS, c.Burst = 2000, 4000
	return c
}

// LoadStats counts what a load run sent and how it went.
type LoadStats struct {
	Sent, Defaulted, Refused, Failed atomic.Int64
	Elapsed                          time.Duration

	mu       sync.Mutex
	failures []Failure
}

// Failure is one failed request: when it was sent, when it came back, why.
type Failure struct {
	Sent, Done time.Time
	Err        string
}

func (f Failure) String() string {
	return fmt.Sprintf("sent %s, failed %s: %s", f.Sent.Format("15:04:05.000"), f.Done.Format("15:04:05.000"), f.Err)
}

// Failures are the failed requests, the first 1000 of them.
func (s *LoadStats) Failures() []Failure {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Failure(nil), s.failures...)
}

func (s *LoadStats) fail(sent time.Time, msg string) {
	s.Failed.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.failures) < 1000 {
		s.failures = append(s.failures, Failure{Sent: sent, Done: time.Now(), Err: msg})
	}
}

// Rate is the requests sent per second.
func (s *LoadStats) Rate() float64 { return float64(s.Sent.Load()) / s.Elapsed.Seconds() }

func (s *LoadStats) String() string {
	return fmt.Sprintf("%d requests in %s (%.1f/s): %d defaulted, %d refused by the guard, %d failed",
		s.Sent.Load(), s.Elapsed.Round(time.Millisecond), s.Rate(), s.Defaulted.Load(), s.Refused.Load(), s.Failed.Load())
}

// RunLoad sends rps admission requests per second through the API server until
// ctx ends: server-side dry-run creates of Deployments, each calling both of
// the guard's webhooks. Nine in ten are good and must come back defaulted, one
// in ten must be refused with the guard's message; anything else fails.
//
// The requests come in bursts, a quarter of a second's worth at once, as when
// a GitOps tool syncs many applications: the API server then needs more
// connections to the guard than it keeps idle, so it keeps opening new ones,
// each a TLS handshake with the certificate served at that moment.
func RunLoad(ctx context.Context, c client.Client, ns string, rps int) *LoadStats {
	s, wait := StartLoad(ctx, c, ns, rps)
	wait()
	return s
}

// StartLoad is RunLoad in the background: the counters move while it runs,
// and wait returns once ctx has ended and every request has come back.
func StartLoad(ctx context.Context, c client.Client, ns string, rps int) (s *LoadStats, wait func()) {
	s = &LoadStats{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.run(ctx, c, ns, rps)
	}()
	return s, func() { <-done }
}

func (s *LoadStats) run(ctx context.Context, c client.Client, ns string, rps int) {
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
	s.Elapsed = time.Since(start)
}

// send makes request i and records how it went.
func (s *LoadStats) send(c client.Client, ns string, i int64) {
	s.Sent.Add(1)
	sent := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if i%10 == 9 {
		err := c.Create(ctx, BadDeployment(ns, i), client.DryRunAll)
		switch {
		case err == nil:
			s.fail(sent, "a Deployment that takes every replica down was admitted")
		case !strings.Contains(err.Error(), RefusedBecause):
			s.fail(sent, err.Error())
		default:
			s.Refused.Add(1)
		}
		return
	}
	d := GoodDeployment(ns, i)
	err := c.Create(ctx, d, client.DryRunAll)
	switch {
	case err != nil:
		s.fail(sent, err.Error())
	case d.Spec.Selector == nil:
		s.fail(sent, "admitted without the guard's defaults: the mutating webhook was not called")
	default:
		s.Defaulted.Add(1)
	}
}
