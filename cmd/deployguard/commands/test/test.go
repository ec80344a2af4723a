// Package test is `deployguard test`: the Rego tests of a policy repository.
package test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/deployguard/deployguard/cmd/deployguard/cli"
	"github.com/deployguard/deployguard/policy"
)

// Run is `deployguard test DIR…`: the Rego tests of a policy
// repository, run with the guard's own OPA and restrictions, so that CI needs
// nothing but the deployguard binary.
func Run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("deployguard test", flag.ContinueOnError)
	fs.SetOutput(stderr)
	verbose := fs.Bool("v", false, "list every test, not only failures")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return cli.ExitUsage
	}
	if fs.NArg() == 0 {
		fmt.Fprintln(stderr, "usage: deployguard test [-v] DIR… (policies and their *_test.rego files)")
		return cli.ExitUsage
	}
	var sources []policy.Source
	for _, dir := range fs.Args() {
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
			if *verbose {
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
