package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/stretchr/testify/assert"

	"github.com/deployguard/deployguard/cmd/deployguard/cli"
)

func TestCommandsUsage(t *testing.T) {
	tests := []struct {
		name   string
		args   []string
		code   int
		stderr string
		stdout string
	}{
		{name: "restore without an argument", args: []string{"restore"}, code: 2, stderr: "give exactly one Deployment"},
		{name: "restore with an empty name", args: []string{"restore", "shop/"}, code: 2, stderr: "is not NAMESPACE/NAME"},
		{name: "restore help", args: []string{"restore", "-h"}, code: 0, stdout: "deployguard restore [flags] NAMESPACE/NAME"},
		{name: "uninstall with an argument", args: []string{"uninstall", "now"}, code: 2, stderr: "unexpected arguments"},
		{name: "uninstall help", args: []string{"uninstall", "-h"}, code: 0, stdout: "--dry-run"},
		{name: "audit with an argument", args: []string{"audit", "now"}, code: 2, stderr: "takes no arguments"},
		{name: "audit help", args: []string{"audit", "--help"}, code: 0, stdout: "deployguard audit [flags]"},
		{name: "test without a directory", args: []string{"test"}, code: 2, stderr: "usage: deployguard test"},
		{name: "rollout without its verb", args: []string{"rollout"}, code: 2, stderr: "give a verb: status"},
		{name: "an unknown flag", args: []string{"status", "--frobnicate"}, code: 2, stderr: "unknown flag: --frobnicate"},
		{name: "a flag as Go's flag package took it", args: []string{"uninstall", "-dry-run", "-kubeconfig"}, code: 2, stderr: "flag needs an argument: --kubeconfig"},
		{name: "help", args: []string{"help"}, code: 0, stdout: "rollout"},
		{name: "nothing", args: nil, code: 2, stderr: "Available Commands"},
		{name: "an unknown verb", args: []string{"frobnicate"}, code: 2, stderr: `unknown command "frobnicate"`},
		{name: "a mistyped verb", args: []string{"statsu"}, code: 2, stderr: "Did you mean this?"},
		{name: "serve with a bad flag", args: []string{"serve", "--cert-mode", "magic"}, code: 2, stderr: "--cert-mode must be files or self-managed"},
		{name: "version", args: []string{"version"}, code: 0, stdout: "deployguard dev"},
		{name: "--version", args: []string{"--version"}, code: 0, stdout: "deployguard dev"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			assert.Equal(t, tt.code, run(tt.args, nil, &stdout, &stderr), "stderr: %s", stderr.String())
			assert.Contains(t, stderr.String(), tt.stderr)
			assert.Contains(t, stdout.String(), tt.stdout)
		})
	}
}

// Every cluster verb takes kubectl's flags, as `kubectl deployguard VERB`
// users expect of a kubectl plugin.
func TestClusterVerbsTakeKubectlFlags(t *testing.T) {
	root := newRootCommand(cli.Streams{Out: &bytes.Buffer{}, ErrOut: &bytes.Buffer{}}, false)
	for _, path := range [][]string{{"status"}, {"rollout", "status"}, {"audit"}, {"restore"}, {"uninstall"}} {
		cmd, _, err := root.Find(path)
		assert.NoError(t, err, "%v", path)
		for _, flag := range []string{"kubeconfig", "context", "namespace", "as", "as-group", "server", "token", "request-timeout"} {
			assert.NotNil(t, cmd.Flags().Lookup(flag), "%v has no --%s", path, flag)
		}
		assert.Equal(t, "n", cmd.Flags().Lookup("namespace").Shorthand, "%v", path)
	}
}

// complete asks for the completions of a command line, as a shell (or
// kubectl, through kubectl_complete-deployguard) does.
func complete(t *testing.T, words ...string) []string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	assert.Equal(t, 0, run(append([]string{cobra.ShellCompRequestCmd}, words...), nil, &stdout, &stderr), stderr.String())
	var out []string
	for _, l := range strings.Split(stdout.String(), "\n") {
		if l != "" && !strings.HasPrefix(l, ":") {
			out = append(out, strings.SplitN(l, "\t", 2)[0])
		}
	}
	return out
}

func TestCompletion(t *testing.T) {
	assert.Subset(t, complete(t, ""), []string{"serve", "check", "test", "status", "rollout", "audit", "restore", "uninstall", "version", "completion"})
	assert.Equal(t, []string{"status"}, complete(t, "st"))
	assert.Equal(t, []string{"status"}, complete(t, "rollout", ""))
	assert.Subset(t, complete(t, "status", "--"), []string{"--context", "--namespace", "--kubeconfig", "--as", "--output", "--drain", "--guard-namespace"})
	assert.Equal(t, []string{"text", "json"}, complete(t, "status", "-o", ""))
	assert.Equal(t, []string{"text", "json", "sarif", "junit"}, complete(t, "check", "--output", ""))
	assert.Subset(t, complete(t, "serve", "--cert-"), []string{"--cert-mode", "--cert-dir", "--cert-secret"})
}

func TestKubectlPluginNames(t *testing.T) {
	assert.True(t, kubectlPlugin("/usr/local/bin/kubectl-deployguard"))
	assert.True(t, kubectlPlugin("kubectl-deployguard.exe"))
	assert.False(t, kubectlPlugin("/usr/local/bin/deployguard"))
	assert.True(t, completer("/usr/local/bin/kubectl_complete-deployguard"))
	assert.False(t, completer("/usr/local/bin/kubectl-deployguard"))

	// `kubectl deployguard` alone: its help, as kubectl's plugins answer.
	var help, stderr bytes.Buffer
	assert.Equal(t, 0, runAs("/usr/local/bin/kubectl-deployguard", nil, nil, &help, &stderr))
	assert.Contains(t, help.String(), "kubectl deployguard [command]")
	assert.NotContains(t, help.String(), "completion", "kubectl completes its plugins itself")

	var stdout bytes.Buffer
	root := newRootCommand(cli.Streams{Out: &stdout, ErrOut: &bytes.Buffer{}}, true)
	assert.Equal(t, 0, cli.ExitCode(root, []string{"status", "-h"}, &bytes.Buffer{}))
	assert.Contains(t, stdout.String(), "kubectl deployguard status [flags]")
}
