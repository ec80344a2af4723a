package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// FuzzParse feeds the config file loader arbitrary documents. A document is
// refused with an error that says something, or accepted as a configuration
// that validates, that the guard can be wired from without a panic, and that
// reads back the same once written out.
func FuzzParse(f *testing.F) {
	shipped, err := os.ReadFile(filepath.Join("..", "..", "..", "config", "manager", "guard.yaml"))
	require.NoError(f, err)
	f.Add(shipped)
	f.Add([]byte("apiVersion: deployguard.io/v1alpha1\nkind: GuardConfig\n"))
	f.Add([]byte("apiVersion: deployguard.io/v1alpha1\nkind: GuardConfig\ndefaults:\n  strategy: {maxSurge: 0, maxUnavailable: 0}\nbounds:\n  progressDeadlineSeconds: {min: 10, max: 5}\n"))
	f.Add([]byte("apiVersion: deployguard.io/v1alpha1\nkind: GuardConfig\nrollback:\n  failFast: {window: -1s, reasons: [Nope]}\ncleanup: {steps: [drain, drain], drainTimeout: 1y}\n"))
	f.Add([]byte("apiVersion: deployguard.io/v1alpha1\nkind: GuardConfig\npolicy: {modes: {images: enforce, x: maybe}, failureMode: open}\n"))
	f.Add([]byte("a: &a [*a, *a]\n"))
	f.Add([]byte("---\n---\n"))
	f.Add([]byte("\t"))
	f.Fuzz(func(t *testing.T, doc []byte) {
		c, err := Parse(doc)
		if err != nil {
			assert.NotEmpty(t, strings.TrimSpace(err.Error()))
			return
		}
		require.Empty(t, c.Validate(), "an accepted configuration validates")
		_ = c.WebhookOptions("system:serviceaccount:deployguard-system:deployguard")
		_, _ = c.PolicyOptions()
		_ = c.FailFastOptions()
		_ = c.CleanupFinalizers()
		_ = c.ChangesEveryDeployment()

		out, err := yaml.Marshal(c)
		require.NoError(t, err)
		again, err := Parse(out)
		require.NoError(t, err, "an accepted configuration, written out, is accepted again:\n%s", out)
		back, err := yaml.Marshal(again)
		require.NoError(t, err)
		assert.Equal(t, string(out), string(back), "and reads back the same")
	})
}
