package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestCommandsUsage(t *testing.T) {
	tests := []struct {
		name string
		args []string
		code int
		want string
	}{
		{name: "restore without an argument", args: []string{"restore"}, code: 2, want: "give exactly one NAMESPACE/NAME"},
		{name: "restore with a bare name", args: []string{"restore", "web"}, code: 2, want: "give exactly one NAMESPACE/NAME"},
		{name: "restore help", args: []string{"restore", "-h"}, code: 0, want: "Usage: deployguard restore"},
		{name: "uninstall with an argument", args: []string{"uninstall", "now"}, code: 2, want: "unexpected arguments"},
		{name: "uninstall help", args: []string{"uninstall", "-h"}, code: 0, want: "-dry-run"},
		{name: "audit with an argument", args: []string{"audit", "now"}, code: 2, want: "takes no arguments"},
		{name: "audit help", args: []string{"audit", "-h"}, code: 0, want: "Usage: deployguard audit"},
		{name: "test without a directory", args: []string{"test"}, code: 2, want: "usage: deployguard test"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			assert.Equal(t, tt.code, run(tt.args, nil, &stdout, &stderr))
			assert.Contains(t, stderr.String(), tt.want)
		})
	}
}

func TestKubectlPluginName(t *testing.T) {
	assert.True(t, kubectlPlugin("/usr/local/bin/kubectl-deployguard"))
	assert.True(t, kubectlPlugin("kubectl-deployguard.exe"))
	assert.False(t, kubectlPlugin("/usr/local/bin/deployguard"))
}
