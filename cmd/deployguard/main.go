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

	"github.com/deployguard/deployguard/cmd/deployguard/cli"
	"github.com/deployguard/deployguard/cmd/deployguard/commands/audit"
	"github.com/deployguard/deployguard/cmd/deployguard/commands/check"
	"github.com/deployguard/deployguard/cmd/deployguard/commands/restore"
	"github.com/deployguard/deployguard/cmd/deployguard/commands/rollout"
	"github.com/deployguard/deployguard/cmd/deployguard/commands/status"
	"github.com/deployguard/deployguard/cmd/deployguard/commands/test"
	"github.com/deployguard/deployguard/cmd/deployguard/commands/uninstall"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

func main() {
	cli.Version = version
	args := os.Args[1:]
	// kubectl runs its plugin with the words after "deployguard", so the
	// commands are the same; only the help names the plugin.
	if kubectlPlugin(os.Args[0]) && (len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help") {
		var b strings.Builder
		usage(&b)
		fmt.Fprint(os.Stdout, strings.ReplaceAll(b.String(), "  deployguard ", "  kubectl deployguard "))
		os.Exit(0)
	}
	os.Exit(run(args, os.Stdin, os.Stdout, os.Stderr))
}

// kubectlPlugin reports whether the binary runs as the kubectl plugin
// kubectl-deployguard (a copy or a symlink of that name on the PATH), so that
// `kubectl deployguard status …` works.
func kubectlPlugin(argv0 string) bool {
	base := filepath.Base(argv0)
	return strings.TrimSuffix(base, ".exe") == "kubectl-deployguard"
}

// run dispatches a subcommand and returns the process exit code.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	switch args[0] {
	case "serve":
		return serve(args[1:], stderr)
	case "check":
		return check.Run(args[1:], stdin, stdout, stderr)
	case "test":
		return test.Run(args[1:], stdout, stderr)
	case "restore":
		return restore.Run(args[1:], stdout, stderr)
	case "status":
		return status.Run(args[1:], stdout, stderr)
	case "rollout":
		return rollout.Run(args[1:], stdout, stderr)
	case "audit":
		return audit.Run(args[1:], stdout, stderr)
	case "uninstall":
		return uninstall.Run(args[1:], stdout, stderr)
	case "version", "--version":
		fmt.Fprintf(stdout, "deployguard %s\n", version)
		return 0
	case "help", "-h", "--help":
		usage(stdout)
		return 0
	default:
		fmt.Fprintf(stderr, "deployguard: unknown command %q\n\n", args[0])
		usage(stderr)
		return 2
	}
}

func usage(w io.Writer) {
	fmt.Fprint(w, `deployguard: a deployment safety guard for Kubernetes

Usage:
  deployguard serve [flags]      run the admission webhooks and the rollout reconciler
  deployguard check -f PATH      run the admission pipeline on manifests, offline (CI)
  deployguard test DIR…         run the Rego tests of policies, with the guard's own OPA (CI)
  deployguard status NS/NAME     revisions, known-good and failed ones, quarantine, rollout and cleanup of a Deployment
  deployguard rollout status deploy/NAME   wait for a rollout like kubectl, and fail when the guard rolled it back (CI/CD)
  deployguard audit [-n NS]      what the background audit found in existing Deployments, by policy then namespace
  deployguard restore NS/NAME    recreate a deleted Deployment from the guard's record of it
  deployguard uninstall          remove the webhooks, then the guard's finalizers from every Deployment
  deployguard version            print the build

Run "deployguard COMMAND -h" for a command's flags.
`)
}
