package cli

import (
	"flag"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSplitNamespacedName(t *testing.T) {
	tests := []struct {
		args     []string
		ns, name string
		ok       bool
	}{
		{args: []string{"shop/web"}, ns: "shop", name: "web", ok: true},
		{args: []string{"web"}},
		{args: []string{"shop/"}},
		{args: []string{"/web"}},
		{args: []string{"a/b/c"}},
		{args: []string{"shop/web", "extra"}},
		{args: nil},
	}
	for _, tt := range tests {
		ns, name, ok := SplitNamespacedName(tt.args)
		assert.Equal(t, tt.ok, ok, "%v", tt.args)
		assert.Equal(t, tt.ns, ns, "%v", tt.args)
		assert.Equal(t, tt.name, name, "%v", tt.args)
	}
}

func TestParseInterspersed(t *testing.T) {
	tests := []struct {
		args       []string
		positional []string
		kubeconfig string
		knownGood  bool
	}{
		{args: []string{"shop/web"}, positional: []string{"shop/web"}},
		{args: []string{"--kubeconfig", "k", "shop/web"}, positional: []string{"shop/web"}, kubeconfig: "k"},
		{args: []string{"shop/web", "--kubeconfig", "k", "--known-good"}, positional: []string{"shop/web"}, kubeconfig: "k", knownGood: true},
		{args: []string{"a", "-known-good", "b"}, positional: []string{"a", "b"}, knownGood: true},
	}
	for _, tt := range tests {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		kubeconfig := fs.String("kubeconfig", "", "")
		knownGood := fs.Bool("known-good", false, "")
		got, err := ParseInterspersed(fs, tt.args)
		require.NoError(t, err)
		assert.Equal(t, tt.positional, got, "%v", tt.args)
		assert.Equal(t, tt.kubeconfig, *kubeconfig, "%v", tt.args)
		assert.Equal(t, tt.knownGood, *knownGood, "%v", tt.args)
	}
}
