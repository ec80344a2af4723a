package certs

import (
	"context"
	"crypto/x509"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
)

func TestExpiryMonitor(t *testing.T) {
	ca, _ := caAt(t, t0, 1000*time.Hour)
	_, leaf := leafAt(t, ca, t0.Add(time.Minute), 99*time.Minute, nil, nil) // life t0 … t0+100m
	_, renewed := leafAt(t, ca, t0.Add(80*time.Minute), 99*time.Minute, nil, nil)

	tests := []struct {
		name   string
		served []*x509.Certificate // one per check
		at     []time.Duration     // since t0, one per check
		events int
		expiry time.Time
	}{
		{name: "fresh certificate: metric, no event", served: []*x509.Certificate{leaf}, at: []time.Duration{10 * time.Minute}, expiry: leaf.NotAfter},
		{name: "due but within the slack: no event", served: []*x509.Certificate{leaf}, at: []time.Duration{69 * time.Minute}, expiry: leaf.NotAfter},
		{name: "not rotated in time: one event however often it is checked",
			served: []*x509.Certificate{leaf, leaf, leaf}, at: []time.Duration{75 * time.Minute, 80 * time.Minute, 90 * time.Minute}, events: 1, expiry: leaf.NotAfter},
		{name: "rotated after the warning: the metric follows",
			served: []*x509.Certificate{leaf, renewed}, at: []time.Duration{75 * time.Minute, 81 * time.Minute}, events: 1, expiry: renewed.NotAfter},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := NewMetrics(prometheus.NewRegistry())
			require.NoError(t, err)
			rec := events.NewFakeRecorder(10)
			clk := clocktesting.NewFakeClock(t0)
			i := 0
			mon := &ExpiryMonitor{
				Served:   func(context.Context) (*x509.Certificate, error) { return tt.served[i], nil },
				Metrics:  m,
				Recorder: rec,
				PodName:  "deployguard-abc", PodNamespace: testNS,
				Clock: clk,
			}
			for i = range tt.served {
				clk.SetTime(t0.Add(tt.at[i]))
				mon.check(context.Background())
			}
			assert.Equal(t, float64(tt.expiry.Unix()), testutil.ToFloat64(m.Expiry))
			assert.Len(t, rec.Events, tt.events)
			if tt.events > 0 {
				e := <-rec.Events
				assert.Contains(t, e, "Warning "+ReasonServingCertificateExpiring)
				assert.Contains(t, e, "has not been rotated")
			}
		})
	}
}

func TestExpiryMonitorEventTarget(t *testing.T) {
	m := &ExpiryMonitor{ValidatingName: "deployguard-validating"}
	assert.Equal(t, "deployguard-validating", m.regarding().(interface{ GetName() string }).GetName())
	m.PodName, m.PodNamespace = "deployguard-abc", testNS
	pod := m.regarding().(interface {
		GetName() string
		GetNamespace() string
	})
	assert.Equal(t, "deployguard-abc", pod.GetName())
	assert.Equal(t, testNS, pod.GetNamespace())
}
