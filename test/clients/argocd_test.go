package clients

import (
	"context"
	"io"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/deployguard/deployguard/test/harness"
)

// argoCDHealthBin is Argo CD's health assessment, built from its module
// (test/tools/argocd) once for the package.
var argoCDHealthBin = sync.OnceValues(func() (string, error) {
	return harness.BuildArgoCDHealth(context.Background(), io.Discard)
})

// argoHealth is Argo CD's verdict on the live Deployment, as `kubectl get -o
// json` returns it: built in, and with the guard's health customization
// (config/argocd), evaluated the way Argo CD's controller evaluates it.
func argoHealth(t *testing.T, ns, name string) (builtin, customized harness.HealthResult) {
	t.Helper()
	bin, err := argoCDHealthBin()
	require.NoError(t, err)
	r := kubectl(context.Background(), "get", "deployment", name, "-n", ns, "-o", "json")
	require.Zero(t, r.Code, "%s", r)
	builtin, customized, err = harness.ArgoCDHealth(context.Background(), bin, []byte(r.Stdout))
	require.NoError(t, err)
	require.Empty(t, customized.Error, "the guard's health check failed in Argo CD's Lua VM")
	return builtin, customized
}
