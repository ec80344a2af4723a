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

func TestConstructors(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := NewRegistration(reg, "test metrics")
	r.Counter("deployguard_c_total", "A counter.").Inc()
	r.CounterVec("deployguard_cv_total", "A counter with labels.", "a", "b").WithLabelValues("x", "y").Inc()
	r.Gauge("deployguard_g", "A gauge.").Set(1)
	r.GaugeVec("deployguard_gv", "A gauge with labels.", "a").WithLabelValues("x").Set(1)
	r.Histogram("deployguard_h_seconds", "A histogram.", []float64{1, 2}).Observe(1)
	r.HistogramVec("deployguard_hv_seconds", "A histogram with labels.", []float64{1, 2, 3}, "a").WithLabelValues("x").Observe(1)
	require.NoError(t, r.Err())

	families, err := reg.Gather()
	require.NoError(t, err)
	type family struct {
		help    string
		labels  []string
		buckets int
	}
	got := map[string]family{}
	for _, f := range families {
		m := f.GetMetric()[0]
		var labels []string
		for _, l := range m.GetLabel() {
			labels = append(labels, l.GetName())
		}
		got[f.GetName()] = family{help: f.GetHelp(), labels: labels, buckets: len(m.GetHistogram().GetBucket())}
	}
	assert.Equal(t, map[string]family{
		"deployguard_c_total":    {help: "A counter."},
		"deployguard_cv_total":   {help: "A counter with labels.", labels: []string{"a", "b"}},
		"deployguard_g":          {help: "A gauge."},
		"deployguard_gv":         {help: "A gauge with labels.", labels: []string{"a"}},
		"deployguard_h_seconds":  {help: "A histogram.", buckets: 2},
		"deployguard_hv_seconds": {help: "A histogram with labels.", labels: []string{"a"}, buckets: 3},
	}, got)
}
