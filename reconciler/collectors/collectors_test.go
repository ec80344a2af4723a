package collectors

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func newCounter() prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Name: "deployguard_test_total", Help: "A test counter."})
}

func TestAdd(t *testing.T) {
	tests := []struct {
		name string
		// second is registered after a first deployguard_test_total counter.
		second    prometheus.Collector
		wantErr   string
		wantCount float64
	}{
		{name: "the same metric again counts into the first", second: newCounter(), wantCount: 2},
		{name: "another metric of the same name is an error", wantErr: "registering test metrics: ",
			second: prometheus.NewGauge(prometheus.GaugeOpts{Name: "deployguard_test_total", Help: "Another help."})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			r := NewRegistration(reg, "test metrics")
			first := Add(r, newCounter())
			require.NoError(t, r.Err())
			first.Inc()

			got := Add(r, tt.second)
			if tt.wantErr != "" {
				require.Error(t, r.Err())
				assert.Contains(t, r.Err().Error(), tt.wantErr)
				assert.Same(t, tt.second, got, "the collector itself, unregistered")
				return
			}
			require.NoError(t, r.Err())
			got.(prometheus.Counter).Inc()
			assert.Equal(t, tt.wantCount, testutil.ToFloat64(first))
		})
	}
}

func TestAddWithoutRegistry(t *testing.T) {
	r := NewRegistration(nil, "test metrics")
	c := newCounter()
	assert.Same(t, c, Add(r, c))
	require.NoError(t, r.Err())
}

func TestAddAfterAnError(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := NewRegistration(reg, "test metrics")
	Add(r, newCounter())
	Add(r, prometheus.NewGauge(prometheus.GaugeOpts{Name: "deployguard_test_total", Help: "Another help."}))
	require.Error(t, r.Err())
	first := r.Err()

	Add(r, prometheus.NewCounter(prometheus.CounterOpts{Name: "deployguard_later_total", Help: "Later."}))
	assert.Same(t, first, r.Err(), "the first error stands")
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		assert.NotEqual(t, "deployguard_later_total", f.GetName(), "nothing registered after the error")
	}
}
