// Command deployguard is the deployment safety guard: `serve` runs the admission
// webhooks and the rollout reconciler, `check` runs the same admission pipeline
// on manifests offline, `restore` recreates a deleted Deployment from its record,
// `uninstall` takes the guard out of the cluster's way, `status` tells a
// Deployment's revisions, rollout and cleanup, `rollout status` waits for a
// rollout and fails when the guard rolled it back, `version` prints the build.
// Named kubectl-deployguard, it is the kubectl plugin `kubectl deployguard`.
package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/deployguard/deployguard/cmd/deployguard/cli"
	"github.com/deployguard/deployguard/cmd/deployguard/commands/audit"
	"github.com/deployguard/deployguard/cmd/deployguard/commands/check"
	"github.com/deployguard/deployguard/cmd/deployguard/commands/restore"
	"github.com/deployguard/deployguard/cmd/deployguard/commands/rollout"
	"github.com/deployguard/deployguard/cmd/deployguard/commands/serve"
	"github.com/deployguard/deployguard/cmd/deployguard/commands/status"
	"github.com/deployguard/deployguard/cmd/deployguard/commands/test"
	"github.com/deployguard/deployguard/cmd/deployguard/commands/uninstall"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

func main() {
	cli.Version = version
	args := os.Args[1:]
	if completer(os.Args[0]) {
		// kubectl completes `kubectl deployguard …` by running
		// kubectl_complete-deployguard with the words typed so far.
		args = append([]string{cobra.ShellCompRequestCmd}, args...)
	}
	os.Exit(run(args, os.Stdin, os.Stdout, os.Stderr))
}

// kubectlPlugin reports whether the binary runs as the kubectl plugin
// kubectl-deployguard (a copy or a symlink of that name on the PATH), so that
// `kubectl deployguard status …` works and its help says so.
func kubectlPlugin(argv0 string) bool {
	return strings.TrimSuffix(filepath.Base(argv0), ".exe") == "kubectl-deployguard"
}

// completer reports whether the binary runs as kubectl_complete-deployguard,
// the name kubectl looks for to complete a plugin's command line.
func completer(argv0 string) bool {
	return strings.TrimSuffix(filepath.Base(argv0), ".exe") == "kubectl_complete-deployguard"
}

// run runs one command line and returns the process exit code.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return runAs(os.Args[0], args, stdin, stdout, stderr)
}

// runAs is run as the binary named argv0 runs.
func runAs(argv0 string, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return cli.ExitCode(newRootCommand(cli.Streams{In: stdin, Out: stdout, ErrOut: stderr}, kubectlPlugin(argv0) || completer(argv0)), args, stderr)
}

// newRootCommand is deployguard and its verbs; as a kubectl plugin its help
// and completion name it `kubectl deployguard`.
func newRootCommand(s cli.Streams, plugin bool) *cobra.Command {
	root := cli.NewCommand(s, &cobra.Command{
		Use:   "deployguard",
		Short: "a deployment safety guard for Kubernetes",
		Long: `deployguard: a deployment safety guard for Kubernetes.

It defaults and checks every apps/v1 Deployment at admission, with the
platform team's Rego policies, follows each rollout to its end, rolls back
automatically when one fails, and cleans up in order when a Deployment is
deleted. Named kubectl-deployguard on the PATH, it is the kubectl plugin
"kubectl deployguard"; with kubectl_complete-deployguard beside it, kubectl
completes its verbs and flags.`,
		Version: version,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if plugin {
				// `kubectl deployguard` alone asks what it can do, as
				// kubectl's plugins answer.
				return cmd.Help()
			}
			fmt.Fprint(s.ErrOut, cmd.UsageString())
			return cli.Exit(cli.ExitUsage)
		},
	})
	root.SetVersionTemplate("deployguard {{.Version}}\n")
	if plugin {
		root.Annotations = map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl deployguard"}
		// kubectl completes its plugins through kubectl_complete-deployguard;
		// a script for a bare `deployguard` would complete nothing.
		root.CompletionOptions.HiddenDefaultCmd = true
	}
	root.AddCommand(
		serve.NewCommand(s),
		check.NewCommand(s),
		test.NewCommand(s),
		status.NewCommand(s),
		rollout.NewCommand(s),
		audit.NewCommand(s),
		restore.NewCommand(s),
		uninstall.NewCommand(s),
		cli.NewCommand(s, &cobra.Command{
			Use:               "version",
			Short:             "print the build",
			Args:              cobra.NoArgs,
			ValidArgsFunction: cobra.NoFileCompletions,
			Run:               func(*cobra.Command, []string) { fmt.Fprintf(s.Out, "deployguard %s\n", version) },
		}),
	)
	return root
}
