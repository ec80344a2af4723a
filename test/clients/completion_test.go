package clients

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/deployguard/deployguard/test/harness"
)

// completions are the words kubectl offers for a command line ending in
// the word being typed, as a shell's completion script asks it.
func completions(t *testing.T, words ...string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := kubectl(ctx, append([]string{"__complete"}, words...)...)
	require.Equal(t, 0, r.Code, "%s", r)
	var out []string
	for _, l := range strings.Split(r.Stdout, "\n") {
		if l != "" && !strings.HasPrefix(l, ":") {
			out = append(out, strings.SplitN(l, "\t", 2)[0])
		}
	}
	return out
}

// kubectl completes the plugin's verbs, flags and arguments through
// kubectl_complete-deployguard, which `make build` puts beside the plugin:
// `kubectl deployguard <TAB>` as users press it.
func TestKubectlCompletesThePlugin(t *testing.T) {
	_, err := os.Stat(filepath.Join(bin, "kubectl_complete-deployguard"))
	require.NoError(t, err, "the completion helper is missing beside the plugin: run `make build`")
	ns := harness.NewNamespace(t, local.Client)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, local.Client.Create(ctx, harness.Deployment(ns, "complete-me", "app:1")))

	assert.Subset(t, completions(t, "deployguard", ""), []string{"status", "rollout", "check", "audit", "restore", "uninstall"})
	assert.Equal(t, []string{"status"}, completions(t, "deployguard", "rollout", "st"))
	assert.Subset(t, completions(t, "deployguard", "status", "--"), []string{"--context", "--namespace", "--kubeconfig", "--as", "--output"})
	assert.Contains(t, completions(t, "deployguard", "status", "-n", ""), ns, "namespaces from the cluster")
	assert.Equal(t, []string{"complete-me"}, completions(t, "deployguard", "status", "-n", ns, "comp"))
	assert.Equal(t, []string{ns + "/complete-me"}, completions(t, "deployguard", "status", ns+"/"))
	assert.Equal(t, []string{"deploy/complete-me"}, completions(t, "deployguard", "rollout", "status", "-n", ns, "deploy/"))
}
