package checks

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"
)

// TestCRDLimitsMatchValidation: the schemas' maxLength and maxItems are
// the limits the webhook and the reconciler apply, so that kubectl refuses
// at the schema what the guard would refuse anyway, and a check the schema
// admits is never one the guard then reports invalid for its size. (The
// Helm chart's files/ are symlinks to these files.)
func TestCRDLimitsMatchValidation(t *testing.T) {
	for _, file := range []string{"deployguard.io_clusterdeploymentchecks.yaml", "deployguard.io_deploymentchecks.yaml"} {
		t.Run(file, func(t *testing.T) {
			raw, err := os.ReadFile(filepath.Join("..", "..", "..", "config", "crd", "checks", file))
			require.NoError(t, err)
			var crd map[string]any
			require.NoError(t, yaml.Unmarshal(raw, &crd))
			versions := dig(t, crd, "spec", "versions").([]any)
			require.Len(t, versions, 1)
			metrics := dig(t, versions[0], "schema", "openAPIV3Schema", "properties", "spec", "properties", "metrics")
			assert.EqualValues(t, MaxMetrics, dig(t, metrics, "maxItems"))
			fields := dig(t, metrics, "items", "properties")
			for name, limit := range map[string]int{
				"name":             MaxNameLength,
				"query":            MaxQueryLength,
				"successCondition": MaxConditionLength,
				"failureCondition": MaxConditionLength,
			} {
				assert.EqualValues(t, limit, dig(t, fields, name, "maxLength"), "%s's maxLength", name)
			}
		})
	}
}

// dig returns the value at keys in nested maps, failing the test if any is
// missing.
func dig(t *testing.T, v any, keys ...string) any {
	t.Helper()
	for _, k := range keys {
		m, ok := v.(map[string]any)
		require.True(t, ok, "%s is under a map", k)
		v, ok = m[k]
		require.True(t, ok, "%s is present", k)
	}
	return v
}
