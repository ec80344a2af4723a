package certs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
)

// ReasonServingCertificateExpiring is the reason of the Warning event about a
// serving certificate that was not rotated in time.
const ReasonServingCertificateExpiring = "ServingCertificateExpiring"

const actionCheckServingCertificate = "CheckServingCertificate"

// Metrics are the serving certificate's metrics.
type Metrics struct {
	// Expiry is deployguard_serving_certificate_expiry_seconds: when the
	// certificate the webhook server serves expires, in unix seconds.
	Expiry prometheus.Gauge
}

// NewMetrics registers the serving certificate's metrics with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{Expiry: prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "deployguard_serving_certificate_expiry_seconds",
		Help: "When the certificate the webhook server serves expires, in seconds since the Unix epoch.",
	})}
	if err := reg.Register(m.Expiry); err != nil {
		return nil, fmt.Errorf("registering deployguard_serving_certificate_expiry_seconds: %w", err)
	}
	return m, nil
}

// ExpiryMonitor watches the served certificate: it keeps the expiry metric
// current and, when the certificate has less than 30% of its life left
// (renewal was due at a third), logs a warning and records a Warning event,
// once per certificate, on the guard's Pod (PodName set) or else on its
// validating webhook configuration.
type ExpiryMonitor struct {
	Served   ServedCertificate
	Metrics  *Metrics
	Recorder events.EventRecorder

	PodName, PodNamespace, PodUID string
	ValidatingName                string

	// Every is how often the served certificate is read (default a minute).
	Every time.Duration
	Clock clock.WithTicker

	warned string // serial of the certificate last warned about
}

// Start checks at once and then every period until ctx ends; while the
// webhook server does not answer yet, it retries every second.
func (m *ExpiryMonitor) Start(ctx context.Context) error {
	if m.Every == 0 {
		m.Every = time.Minute
	}
	if m.Clock == nil {
		m.Clock = clock.RealClock{}
	}
	ctx = ctrl.LoggerInto(ctx, ctrl.LoggerFrom(ctx).WithName("certs"))
	for {
		next := m.Every
		if !m.check(ctx) {
			next = min(time.Second, m.Every)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-m.Clock.After(next):
		}
	}
}

// NeedLeaderElection: every replica serves its own certificate.
func (m *ExpiryMonitor) NeedLeaderElection() bool { return false }

// check reads the served certificate, updates the metric and warns when due;
// it reports whether the certificate could be read.
func (m *ExpiryMonitor) check(ctx context.Context) bool {
	log := ctrl.LoggerFrom(ctx)
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	leaf, err := m.Served(ctx)
	if err != nil {
		log.V(1).Info("cannot read the served certificate", "reason", err.Error())
		return false
	}
	if m.Metrics != nil {
		m.Metrics.Expiry.Set(float64(leaf.NotAfter.Unix()))
	}
	msg, warn := expiryWarning(leaf, m.Clock.Now())
	if !warn {
		return true
	}
	serial := leaf.SerialNumber.String()
	if serial == m.warned {
		return true
	}
	m.warned = serial
	log.Error(errors.New(msg), "the serving certificate was not rotated in time", "reason", ReasonServingCertificateExpiring, "notAfter", leaf.NotAfter)
	if m.Recorder != nil {
		m.Recorder.Eventf(m.regarding(), nil, corev1.EventTypeWarning, ReasonServingCertificateExpiring, actionCheckServingCertificate, "%s", msg)
	}
	return true
}

// regarding is what the event is about: the guard's own Pod when it knows it,
// its validating webhook configuration otherwise.
func (m *ExpiryMonitor) regarding() runtime.Object {
	if m.PodName != "" {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: m.PodName, Namespace: m.PodNamespace, UID: types.UID(m.PodUID)}}
	}
	return &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: m.ValidatingName}}
}
