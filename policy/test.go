package policy

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/tester"
)

// TestResult is the outcome of one Rego test (a rule named test_*).
type TestResult struct {
	Package  string
	Name     string
	Passed   bool
	Location string // file:line of the test, or of the failing expression
	Message  string // why it failed or errored
	Duration time.Duration
}

// FromDirWithTests reads every *.rego file of dir and its subdirectories, tests
// included, for RunTests. Hidden entries (a mounted ConfigMap's older copies)
// are passed over.
func FromDirWithTests(dir string) ([]Source, error) {
	var sources []Source
	err := filepath.WalkDir(dir, func(path string, e os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if strings.HasPrefix(e.Name(), ".") && path != dir {
			if e.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if e.IsDir() || !strings.HasSuffix(e.Name(), regoSuffix) {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		sources = append(sources, Source{Name: path, Module: string(b)})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading policies: %w", err)
	}
	return sources, nil
}

// RunTests runs the Rego tests among sources with OPA's tester, parsed and
// compiled exactly as the engine compiles policies (OPA v1 syntax, no network
// built-ins), so a test passes here only if the policy works in the guard.
func RunTests(ctx context.Context, sources []Source) ([]TestResult, error) {
	modules := map[string]*ast.Module{}
	var errs []SourceError
	for _, src := range sources {
		mod, perrs := parseSource(src)
		errs = append(errs, perrs...)
		if mod != nil {
			modules[src.Name] = mod
		}
	}
	if len(errs) > 0 {
		return nil, &LoadError{Errors: errs}
	}
	ch, err := tester.NewRunner().SetCompiler(newCompiler()).SetModules(modules).RunTests(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("compiling the policies and their tests: %w", err)
	}
	var out []TestResult
	for r := range ch {
		res := TestResult{Package: strings.TrimPrefix(r.Package, "data."), Name: r.Name, Duration: r.Duration, Passed: r.Pass()}
		if r.Location != nil {
			res.Location = fmt.Sprintf("%s:%d", r.Location.File, r.Location.Row)
		}
		switch {
		case r.Error != nil:
			res.Message = r.Error.Error()
		case r.Fail:
			res.Message = "failed"
			if r.FailedAt != nil {
				res.Message = fmt.Sprintf("failed at %s", r.FailedAt)
				if r.FailedAt.Location != nil {
					res.Location = fmt.Sprintf("%s:%d", r.FailedAt.Location.File, r.FailedAt.Location.Row)
				}
			}
		}
		out = append(out, res)
	}
	if len(out) == 0 {
		return nil, errors.New("no Rego tests found: name test rules test_*")
	}
	return out, nil
}
