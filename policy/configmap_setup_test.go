package policy

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// TestSetupWithManager checks the controller wiring without an API server:
// the builder accepts it, and incomplete configuration is refused.
func TestSetupWithManager(t *testing.T) {
	mgr, err := ctrl.NewManager(&rest.Config{Host: "https://127.0.0.1:1"}, ctrl.Options{
		Metrics:    metricsserver.Options{BindAddress: "0"},
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	require.NoError(t, err)
	e, err := New(Options{})
	require.NoError(t, err)

	s := &ConfigMapSource{Engine: e, Base: Builtins(), Namespace: guardNamespace, LabelKey: testLabel, ErrorAnnotation: errorAnnotation}
	require.NoError(t, s.SetupWithManager(mgr))
	assert.NotNil(t, s.Client, "client taken from the manager")
	assert.NotNil(t, s.Recorder, "recorder taken from the manager")

	assert.Error(t, (&ConfigMapSource{Engine: e, Namespace: guardNamespace}).SetupWithManager(mgr))
}
