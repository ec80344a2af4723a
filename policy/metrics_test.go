package policy

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMetrics(t *testing.T) {
	e := newEngine(t, Options{Exempt: Exemptions{Namespaces: []string{"kube-system"}}}, Builtins()...)
	reg := prometheus.NewPedanticRegistry()
	for _, c := range e.Collectors() {
		require.NoError(t, reg.Register(c))
	}

	bad := deployment(goodContainer("web"))
	bad.Spec.Template.Spec.Containers[0].Image = "nginx:latest"
	e.Evaluate(context.Background(), createInput(t, bad))
	e.Evaluate(context.Background(), createInput(t, deployment(goodContainer("web"))))
	exempt := deployment(goodContainer("web"))
	exempt.Namespace = "kube-system"
	e.Evaluate(context.Background(), createInput(t, exempt))

	decisions := e.metrics.decisions
	assert.Equal(t, 1.0, value(t, decisions.WithLabelValues("images", ResultWarn)), "the built-ins ship in warn mode")
	assert.Equal(t, 1.0, value(t, decisions.WithLabelValues("images", ResultAllow)))
	assert.Equal(t, 2.0, value(t, decisions.WithLabelValues("resources", ResultAllow)))
	assert.Equal(t, 1.0, value(t, decisions.WithLabelValues("*", ResultExempt)))
	assert.Equal(t, 4.0, value(t, e.metrics.active))
	families, err := reg.Gather()
	require.NoError(t, err, "everything the caller registers passes the pedantic registry's checks")
	for _, mf := range families {
		if mf.GetName() == "deployguard_policy_evaluation_duration_seconds" {
			assert.Len(t, mf.GetMetric(), 4, "one latency series per policy")
		}
	}

	err = e.Load(context.Background(), append(Builtins(), regoSource("configmap/ns/cm/x.rego", "package deployguard.x\n\ndeny contains")))
	require.Error(t, err)
	assert.Equal(t, 1.0, value(t, e.metrics.loadErrors.WithLabelValues("configmap/ns/cm/x.rego")))
	assert.Equal(t, 4.0, value(t, e.metrics.active), "a refused set changes nothing")
}

// value reads a counter or gauge.
func value(t *testing.T, m prometheus.Metric) float64 {
	t.Helper()
	var pb dto.Metric
	require.NoError(t, m.Write(&pb))
	if pb.Counter != nil {
		return pb.Counter.GetValue()
	}
	return pb.Gauge.GetValue()
}
