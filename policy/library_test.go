package policy

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/tester"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLibraryRegoTests runs the library's _test.rego files with OPA's tester,
// so "go test" (and make test) fails when a built-in policy's own tests do.
func TestLibraryRegoTests(t *testing.T) {
	sources, err := librarySources(func(name string) bool { return strings.HasSuffix(name, regoSuffix) })
	require.NoError(t, err)
	modules := map[string]*ast.Module{}
	for _, src := range sources {
		mod, errs := parseSource(src)
		require.Empty(t, errs, "parsing %s", src.Name)
		modules[src.Name] = mod
	}

	ch, err := tester.NewRunner().
		SetCompiler(newCompiler()).
		SetModules(modules).
		RunTests(context.Background(), nil)
	require.NoError(t, err)

	ran := 0
	for r := range ch {
		ran++
		switch {
		case r.Error != nil:
			assert.Failf(t, "rego test errored", "%s.%s: %v", r.Package, r.Name, r.Error)
		case r.Fail:
			where := ""
			if r.FailedAt != nil {
				where = fmt.Sprintf(" at %v: %v", r.FailedAt.Location, r.FailedAt)
			}
			assert.Failf(t, "rego test failed", "%s.%s%s", r.Package, r.Name, where)
		}
	}
	assert.NotZero(t, ran, "no rego tests ran")
	t.Logf("%d rego tests ran", ran)
}

// TestBuiltinsLoad guards the embedded library: every built-in policy is
// there, compiles, and runs in the mode its metadata declares: warn, for
// every one, so that a default install denies nothing that was fine before,
// with the severity and category the audit's reports show.
func TestBuiltinsLoad(t *testing.T) {
	e := newEngine(t, Options{}, Builtins()...)
	assert.Equal(t, []PolicyInfo{
		{Name: "hostnamespaces", Source: "builtin/hostnamespaces.rego", Mode: ModeWarn, Severity: "high", Category: "Pod Security"},
		{Name: "images", Source: "builtin/images.rego", Mode: ModeWarn, Severity: "medium", Category: "Supply Chain"},
		{Name: "probes", Source: "builtin/probes.rego", Mode: ModeWarn, Severity: "medium", Category: "Reliability"},
		{Name: "resources", Source: "builtin/resources.rego", Mode: ModeWarn, Severity: "medium", Category: "Resources"},
	}, withoutDigests(e.Policies()))
}
