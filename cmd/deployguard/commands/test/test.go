// Package test is `deployguard test`: the Rego tests of a policy repository.
package test

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/deployguard/deployguard/cmd/deployguard/cli"
	"github.com/deployguard/deployguard/policy"
)

// NewCommand is `deployguard test DIR…`: the Rego tests of a policy
// repository, run with the guard's own OPA and restrictions, so that CI needs
// nothing but the deployguard binary.
func NewCommand(s cli.Streams) *cobra.Command {
	var verbose bool
	cmd := cli.NewCommand(s, &cobra.Command{
		Use:   "test [-v] DIR…",
		Short: "run the Rego tests of policies, with the guard's own OPA (CI)",
		Long: `Runs the Rego tests (*_test.rego) of the policies in each DIR with the
guard's own OPA and the restrictions it enforces, so that a policy
repository's CI needs nothing but the deployguard binary. Exit 1 when a
test fails, 2 when a policy does not load.`,
		Example: "  deployguard test policies/",
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				fmt.Fprintln(s.ErrOut, "usage: deployguard test [-v] DIR… (policies and their *_test.rego files)")
				return cli.Exit(cli.ExitUsage)
			}
			return cli.Exit(run(args, verbose, s.Out, s.ErrOut))
		},
	})
	cmd.Flags().BoolVarP(&verbose, "verbose", "v", false, "list every test, not only failures")
	// Directories only.
	cmd.ValidArgsFunction = func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return nil, cobra.ShellCompDirectiveFilterDirs
	}
	return cmd
}

func run(dirs []string, verbose bool, stdout, stderr io.Writer) int {
	var sources []policy.Source
	for _, dir := range dirs {
		s, err := policy.FromDirWithTests(dir)
		if err != nil {
			fmt.Fprintf(stderr, "deployguard test: %v\n", err)
			return cli.ExitUsage
		}
		sources = append(sources, s...)
	}
	results, err := policy.RunTests(context.Background(), sources)
	if err != nil {
		fmt.Fprintf(stderr, "deployguard test: %v\n", err)
		return cli.ExitUsage
	}
	passed, failed := 0, 0
	for _, r := range results {
		if r.Passed {
			passed++
			if verbose {
				fmt.Fprintf(stdout, "PASS %s.%s (%s)\n", r.Package, r.Name, r.Duration)
			}
			continue
		}
		failed++
		fmt.Fprintf(stdout, "FAIL %s.%s %s: %s\n", r.Package, r.Name, r.Location, r.Message)
	}
	fmt.Fprintf(stdout, "%d passed, %d failed\n", passed, failed)
	if failed > 0 {
		return cli.ExitFailed
	}
	return cli.ExitOK
}
