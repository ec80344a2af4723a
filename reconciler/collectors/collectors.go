// Package collectors registers each of the guard's components' Prometheus
// collectors the same way: with the registry the caller chose (in the guard,
// controller-runtime's, so that they are served with the manager's own), or
// with none.
package collectors

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Registration registers one component's collectors with a registry, and
// keeps the first error, so that the component builds all of them and
// checks once. Its Counter, Gauge and Histogram methods (and their …Vec
// forms) build a collector from its name, help and labels or buckets and
// Add it, so that each metric is one short declaration.
type Registration struct {
	reg  prometheus.Registerer
	what string
	err  error
}

// NewRegistration registers collectors with reg; what names them in an error
// ("reconciler metrics"). A nil reg leaves them unregistered (tests, and
// commands that count nothing they serve).
func NewRegistration(reg prometheus.Registerer, what string) *Registration {
	return &Registration{reg: reg, what: what}
}

// Add registers c and returns it, or the equal collector registered before:
// a second component of the same kind in one process (a test that restarts
// the guard) counts into the same series. After an error it registers
// nothing more.
func Add[C prometheus.Collector](r *Registration, c C) C {
	if r.reg == nil || r.err != nil {
		return c
	}
	err := r.reg.Register(c)
	if err == nil {
		return c
	}
	var already prometheus.AlreadyRegisteredError
	if errors.As(err, &already) {
		if existing, ok := already.ExistingCollector.(C); ok {
			return existing
		}
	}
	r.err = fmt.Errorf("registering %s: %w", r.what, err)
	return c
}

// Err is the first error Add met, nil when every collector is registered.
func (r *Registration) Err() error { return r.err }

// Counter registers a counter without labels.
func (r *Registration) Counter(name, help string) prometheus.Counter {
	return Add(r, prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help}))
}

// CounterVec registers a counter with labels.
func (r *Registration) CounterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return Add(r, prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels))
}

// Gauge registers a gauge without labels.
func (r *Registration) Gauge(name, help string) prometheus.Gauge {
	return Add(r, prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help}))
}

// GaugeVec registers a gauge with labels.
func (r *Registration) GaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	return Add(r, prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels))
}

// Histogram registers a histogram without labels.
func (r *Registration) Histogram(name, help string, buckets []float64) prometheus.Histogram {
	return Add(r, prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}))
}

// HistogramVec registers a histogram with labels.
func (r *Registration) HistogramVec(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	return Add(r, prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels))
}
