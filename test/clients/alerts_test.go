package clients

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/deployguard/deployguard/test/harness"
)

// scrapeGuard saves the guard's /metrics as Prometheus would scrape it.
func scrapeGuard(t *testing.T) string {
	t.Helper()
	code, body, err := local.Guard.Get(local.Guard.Metrics, "/metrics")
	require.NoError(t, err)
	require.Equal(t, 200, code)
	f, err := os.CreateTemp(t.TempDir(), "metrics-")
	require.NoError(t, err)
	_, err = f.WriteString(body)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	return f.Name()
}

var promqlBin = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "promql-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "promql")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Dir = filepath.Join(harness.RepoRoot(), "test", "tools", "promql")
	build.Env = append(os.Environ(), "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		return "", &buildError{out: string(out), err: err}
	}
	return bin, nil
})

type buildError struct {
	out string
	err error
}

func (e *buildError) Error() string {
	return "building test/tools/promql: " + e.err.Error() + "\n" + e.out
}

// assertAlertFires evaluates the alert of config/monitoring with
// Prometheus's own rule engine on two scrapes of the guard, taken before and
// after what should make it fire.
func assertAlertFires(t *testing.T, before, after, alert string) {
	t.Helper()
	bin, err := promqlBin()
	require.NoError(t, err)
	rules := filepath.Join(harness.RepoRoot(), "config", "monitoring", "prometheusrule.yaml")
	out, err := exec.Command(bin, "-rules", rules, "-fire", alert, "-scrapes", before+","+after).CombinedOutput()
	require.NoError(t, err, "%s", out)
	var f struct {
		State       string            `json:"state"`
		Annotations map[string]string `json:"annotations"`
	}
	require.NoError(t, json.Unmarshal(out, &f), "%s", out)
	assert.Equal(t, "firing", f.State, "alert %s: %s", alert, out)
	t.Logf("alert %s %s: %s", alert, f.State, f.Annotations["summary"])
}
