package serve

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/deployguard/deployguard/cmd/deployguard/cli"
)

// A bad config file stops `serve` before it touches any cluster, with a
// non-zero exit and a message that names the problem and the line.
func TestServeRefusesABadConfigFile(t *testing.T) {
	tests := []struct {
		name     string
		file     string // content; "" means the file does not exist
		wantCode int
		wantMsg  []string
	}{
		{
			name:     "malformed YAML",
			file:     "apiVersion: deployguard.io/v1alpha1\nkind: GuardConfig\ndefaults: [\n",
			wantCode: 1,
			wantMsg:  []string{"deployguard serve: config file", "line"},
		},
		{
			name:     "unknown field",
			file:     "apiVersion: deployguard.io/v1alpha1\nkind: GuardConfig\ndefaults:\n  revisionHistoryLimt: 3\n",
			wantCode: 1,
			wantMsg:  []string{"line 4", "revisionHistoryLimt"},
		},
		{
			name:     "invalid value",
			file:     "apiVersion: deployguard.io/v1alpha1\nkind: GuardConfig\nrollback:\n  quarantine: maybe\n",
			wantCode: 1,
			wantMsg:  []string{"line 4: rollback.quarantine", `"maybe"`},
		},
		{
			name:     "missing file",
			wantCode: 1,
			wantMsg:  []string{"reading config file"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "guard.yaml")
			if tt.file != "" {
				require.NoError(t, os.WriteFile(p, []byte(tt.file), 0o600))
			}
			var stdout, stderr bytes.Buffer
			// --kubeconfig points nowhere: the config must fail first.
			code := cli.Run(NewCommand, []string{"--config", p, "--kubeconfig", filepath.Join(t.TempDir(), "none")}, nil, &stdout, &stderr)
			assert.Equal(t, tt.wantCode, code)
			for _, w := range tt.wantMsg {
				assert.Contains(t, stderr.String(), w)
			}
		})
	}
}

func TestUsageErrors(t *testing.T) {
	var stdout, stderr bytes.Buffer
	assert.Equal(t, 2, cli.Run(NewCommand, []string{"--cert-mode", "magic"}, nil, &stdout, &stderr))
	assert.Contains(t, stderr.String(), "--cert-mode must be files or self-managed")
	assert.Equal(t, 2, cli.Run(NewCommand, []string{"now"}, nil, &stdout, &stderr))
	assert.Contains(t, stderr.String(), "unexpected arguments: now")
	assert.Equal(t, 2, cli.Run(NewCommand, []string{"--webhook-port", "many"}, nil, &stdout, &stderr))
	assert.Contains(t, stderr.String(), "invalid argument")
	assert.Equal(t, 2, cli.Run(NewCommand, []string{"--kube-api-qps", "0"}, nil, &stdout, &stderr))
	assert.Contains(t, stderr.String(), "--kube-api-qps and --kube-api-burst must be positive")
}

// The client-side rate limit is the flags', with a kubeconfig as in a
// cluster: a kubeconfig alone would leave client-go's 5 requests a second.
func TestKubeAPIRateLimit(t *testing.T) {
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600))
	for _, tc := range []struct {
		name      string
		args      []string
		wantQPS   float32
		wantBurst int
	}{
		{name: "defaults", wantQPS: 50, wantBurst: 100},
		{name: "set", args: []string{"--kube-api-qps=7.5", "--kube-api-burst=9"}, wantQPS: 7.5, wantBurst: 9},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := flag.NewFlagSet("serve", flag.ContinueOnError)
			f, _ := bindServeFlags(fs)
			require.NoError(t, fs.Parse(append([]string{"--kubeconfig", kubeconfig}, tc.args...)))
			require.NoError(t, f.complete(nil))
			c, err := restConfig(f)
			require.NoError(t, err)
			assert.InDelta(t, tc.wantQPS, c.QPS, 1e-6)
			assert.Equal(t, tc.wantBurst, c.Burst)
		})
	}
}
