package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/spf13/cobra"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A kubeconfig whose current context names namespace "ctx-ns".
const kubeconfig = `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:6443"}
users:
- name: u
  user: {token: t}
contexts:
- name: main
  context: {cluster: c, user: u, namespace: ctx-ns}
- name: other
  context: {cluster: c, user: u}
current-context: main
`

// command is a command with kubectl's cluster flags that records what it
// was given.
func command(t *testing.T, args ...string) (ns, name string, err error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, os.WriteFile(path, []byte(kubeconfig), 0o600))
	cluster := NewCluster()
	cmd := NewClusterCommand(Streams{Out: &bytes.Buffer{}, ErrOut: &bytes.Buffer{}}, cluster, &cobra.Command{
		Use: "status",
		RunE: func(_ *cobra.Command, args []string) error {
			ns, name, err = NamespacedName(args, cluster)
			return nil
		},
	})
	assert.Equal(t, ExitOK, ExitCode(cmd, append(args, "--kubeconfig", path), &bytes.Buffer{}))
	return ns, name, err
}

func TestNamespacedNameAsKubectl(t *testing.T) {
	tests := []struct {
		args     []string
		ns, name string
		err      string
	}{
		{args: []string{"shop/web"}, ns: "shop", name: "web"},
		{args: []string{"web"}, ns: "ctx-ns", name: "web"},
		{args: []string{"web", "-n", "shop"}, ns: "shop", name: "web"},
		{args: []string{"-n", "shop", "web"}, ns: "shop", name: "web"},
		{args: []string{"--namespace=shop", "web"}, ns: "shop", name: "web"},
		{args: []string{"web", "--context", "other"}, ns: "default", name: "web"},
		{args: []string{"shop/"}, err: "is not NAMESPACE/NAME"},
		{args: []string{"/web"}, err: "is not NAMESPACE/NAME"},
		{args: []string{"a/b/c"}, err: "is not NAMESPACE/NAME"},
		{args: []string{"shop/web", "extra"}, err: "give exactly one Deployment"},
		{args: nil, err: "give exactly one Deployment"},
	}
	for _, tt := range tests {
		ns, name, err := command(t, tt.args...)
		if tt.err != "" {
			assert.ErrorContains(t, err, tt.err, "%v", tt.args)
			continue
		}
		require.NoError(t, err, "%v", tt.args)
		assert.Equal(t, tt.ns, ns, "%v", tt.args)
		assert.Equal(t, tt.name, name, "%v", tt.args)
	}
}

// kubectl's flags reach the client: impersonation and the context's server.
func TestClusterFlagsReachTheClient(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, os.WriteFile(path, []byte(kubeconfig), 0o600))
	cluster := NewCluster()
	cmd := NewClusterCommand(Streams{Out: &bytes.Buffer{}, ErrOut: &bytes.Buffer{}}, cluster, &cobra.Command{
		Use: "audit",
		RunE: func(*cobra.Command, []string) error {
			cfg, err := cluster.RestConfig()
			require.NoError(t, err)
			assert.Equal(t, "https://127.0.0.1:6443", cfg.Host)
			assert.Equal(t, "system:serviceaccount:shop:ci", cfg.Impersonate.UserName)
			assert.Equal(t, []string{"deployers"}, cfg.Impersonate.Groups)
			assert.Equal(t, "deployguard/"+Version, cfg.UserAgent)
			return nil
		},
	})
	assert.Equal(t, ExitOK, ExitCode(cmd, []string{"--kubeconfig", path, "--as", "system:serviceaccount:shop:ci", "--as-group", "deployers"}, &bytes.Buffer{}))
}

func TestLongFlagsKeepGoFlagSpellings(t *testing.T) {
	cmd := &cobra.Command{Use: "verb"}
	cmd.Flags().String("kubeconfig", "", "")
	cmd.Flags().Bool("dry-run", false, "")
	cmd.Flags().Bool("known-good", false, "")
	cmd.Flags().StringP("namespace", "n", "", "")
	cmd.Flags().StringP("output", "o", "", "")
	cmd.Flags().StringArrayP("filename", "f", nil, "")
	cmd.Flags().String("as", "", "")
	tests := []struct{ args, want []string }{
		{
			args: []string{"-kubeconfig", "k", "-dry-run", "-n", "shop", "-o", "json", "-known-good=true", "shop/web", "--", "-kubeconfig"},
			want: []string{"--kubeconfig", "k", "--dry-run", "-n", "shop", "-o", "json", "--known-good=true", "shop/web", "--", "-kubeconfig"},
		},
		// kubectl's shorthands with their values attached.
		{args: []string{"-nshop", "-ojson"}, want: []string{"-nshop", "-ojson"}},
		// A value that starts with a dash is a value.
		{args: []string{"--as", "-kubeconfig", "-f", "-dry-run", "-f", "-"}, want: []string{"--as", "-kubeconfig", "-f", "-dry-run", "-f", "-"}},
		{args: []string{"-kubeconfig=k", "-as", "-x"}, want: []string{"--kubeconfig=k", "--as", "-x"}},
		// Not a flag of the command: cobra says so, as written.
		{args: []string{"-frobnicate"}, want: []string{"-frobnicate"}},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, LongFlags(cmd, tt.args), "%v", tt.args)
	}
}

// A kubeconfig that cannot be read fails the verb (exit 1); only a wrong
// argument is a usage error.
func TestNamespacedNameOfABrokenKubeconfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, os.WriteFile(path, []byte("current-context: [nope"), 0o600))
	var stderr bytes.Buffer
	cluster := NewCluster()
	cmd := NewClusterCommand(Streams{Out: &bytes.Buffer{}, ErrOut: &stderr}, cluster, &cobra.Command{
		Use: "status",
		RunE: func(cmd *cobra.Command, args []string) error {
			_, _, err := NamespacedName(args, cluster)
			return ArgsError(cmd, err)
		},
	})
	assert.Equal(t, ExitFailed, ExitCode(cmd, []string{"web", "--kubeconfig", path}, &stderr))
}

// No client-side rate limit: uninstall patches every guarded Deployment.
func TestNoClientSideRateLimit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, os.WriteFile(path, []byte(kubeconfig), 0o600))
	cluster := NewCluster()
	cmd := NewClusterCommand(Streams{Out: &bytes.Buffer{}, ErrOut: &bytes.Buffer{}}, cluster, &cobra.Command{
		Use: "uninstall",
		RunE: func(*cobra.Command, []string) error {
			cfg, err := cluster.RestConfig()
			require.NoError(t, err)
			assert.Equal(t, float32(-1), cfg.QPS)
			return nil
		},
	})
	assert.Equal(t, ExitOK, ExitCode(cmd, []string{"--kubeconfig", path}, &bytes.Buffer{}))
}

func TestExitCodes(t *testing.T) {
	run := func(args ...string) (int, string) {
		var stderr bytes.Buffer
		cmd := NewCommand(Streams{Out: &bytes.Buffer{}, ErrOut: &stderr}, &cobra.Command{
			Use:  "restore",
			Args: cobra.ArbitraryArgs,
			RunE: func(*cobra.Command, []string) error { return Exit(ExitFailed) },
		})
		return ExitCode(cmd, args, &stderr), stderr.String()
	}
	code, _ := run("shop/web")
	assert.Equal(t, ExitFailed, code)
	code, msg := run("--no-such-flag")
	assert.Equal(t, ExitUsage, code)
	assert.Contains(t, msg, "unknown flag: --no-such-flag")
	assert.Contains(t, msg, "restore --help")
}
