package reconciler

import (
	"context"
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// The controller can be wired into a manager the way cmd/deployguard does it,
// without an API server (nothing is started).
func TestSetupWithManager(t *testing.T) {
	mapper := meta.NewDefaultRESTMapper(nil)
	mapper.Add(appsv1.SchemeGroupVersion.WithKind("Deployment"), meta.RESTScopeNamespace)
	mapper.Add(appsv1.SchemeGroupVersion.WithKind("ReplicaSet"), meta.RESTScopeNamespace)
	mapper.Add(corev1.SchemeGroupVersion.WithKind("Namespace"), meta.RESTScopeRoot)
	mgr, err := ctrl.NewManager(&rest.Config{Host: "http://127.0.0.1:1"}, ctrl.Options{
		Metrics:        metricsserver.Options{BindAddress: "0"},
		MapperProvider: func(*rest.Config, *http.Client) (meta.RESTMapper, error) { return mapper, nil },
		Controller:     config.Controller{SkipNameValidation: ptr.To(true)},
	})
	require.NoError(t, err)

	require.ErrorContains(t, (&DeploymentReconciler{Options: DefaultOptions()}).SetupWithManager(context.Background(), mgr),
		"RecordNamespace", "no guard without a namespace of its own for records")

	r := &DeploymentReconciler{Options: testOptions()}
	require.NoError(t, r.SetupWithManager(context.Background(), mgr))

	assert.NotNil(t, r.Client)
	assert.NotNil(t, r.Recorder)
	assert.NotNil(t, r.Clock)
	assert.NotNil(t, r.Metrics)
}

// A second reconciler in the same process (a test that restarts the guard)
// registers its metrics into the same registry without error and counts into
// the same series.
func TestNewMetricsTwice(t *testing.T) {
	reg := prometheus.NewRegistry()
	m1, err := NewMetrics(reg)
	require.NoError(t, err)
	m2, err := NewMetrics(reg)
	require.NoError(t, err)

	m1.rollbacks.WithLabelValues(resultRolledBack).Inc()
	m2.rollbacks.WithLabelValues(resultRolledBack).Inc()

	assert.Equal(t, 2.0, counterValue(t, m2.rollbacks.WithLabelValues(resultRolledBack)))
	families, err := reg.Gather()
	require.NoError(t, err)
	results := map[string]bool{}
	for _, f := range families {
		if f.GetName() != "deployguard_rollbacks_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				results[l.GetValue()] = true
			}
		}
	}
	assert.Equal(t, map[string]bool{
		resultRolledBack: true, resultNoKnownGood: true, resultLoopStopped: true, resultFailed: true, resultConflict: true,
	}, results, "every result exported from the start")
}
