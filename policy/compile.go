package policy

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
)

// packageRoot is the package every policy lives under: deployguard.<name>.
const packageRoot = "deployguard"

// The rules a policy may define; both are sets of messages.
const (
	ruleDeny = "deny"
	ruleWarn = "warn"
)

// modeKey is the key under "custom:" in a policy's package METADATA.
const modeKey = "mode"

// severityKey and categoryKey, under "custom:", say how grave a policy's
// findings are and what they are about; the audit copies them into
// PolicyReports, where Policy Reporter groups and filters by them.
const (
	severityKey = "severity"
	categoryKey = "category"
)

// severities are the values a PolicyReport result's severity may take.
var severities = []string{"critical", "high", "medium", "low", "info"}

// excludedBuiltins cannot be called by policies: they reach the network from
// the admission path and would let a rule behave differently in the cluster
// than in "check".
var excludedBuiltins = []string{"http.send", "net.lookup_ip_addr"}

// policyModule is what the engine needs to know of one policy module.
type policyModule struct {
	name   string
	source string
	mode   Mode // as declared in the module's metadata
	// severity and category as declared under custom:, "" when absent.
	severity, category string
	path               ast.Ref
	rules              []string // ruleDeny and/or ruleWarn, in that order
	// text is the module's source text, for the policy's digest.
	text string
}

// compiledSet is a policy set that compiled: every module, policies or not.
type compiledSet struct {
	compiler *ast.Compiler
	policies []policyModule // sorted by name
	// libraries digests the modules that are not policies: a policy may
	// import any of them, so a change to one changes every policy's digest.
	libraries string
}

// compileSources parses each source on its own, so that every error names its
// source and line, checks the policy contract, then compiles all modules
// together. It returns every error it finds in the step that fails.
func compileSources(sources []Source) (*compiledSet, []SourceError) {
	var errs []SourceError
	modules := make(map[string]*ast.Module, len(sources))
	for _, src := range sources {
		if _, dup := modules[src.Name]; dup {
			errs = append(errs, SourceError{Source: src.Name, Message: "two sources have this name"})
			continue
		}
		mod, err := parseSource(src)
		if err != nil {
			errs = append(errs, err...)
			continue
		}
		modules[src.Name] = mod
	}
	// Checked in source order, so that of two policies with the same name the
	// later source is the one in error.
	var policies []policyModule
	var libraries []Source
	owner := map[string]string{}
	for _, src := range sources {
		mod, ok := modules[src.Name]
		if !ok {
			continue
		}
		p, isPolicy, perrs := inspectModule(src.Name, mod)
		if len(perrs) > 0 {
			errs = append(errs, perrs...)
			continue
		}
		if !isPolicy {
			libraries = append(libraries, src)
			continue
		}
		p.text = src.Module
		if first, dup := owner[p.name]; dup {
			errs = append(errs, errorAt(src.Name, mod.Package.Location,
				fmt.Sprintf("policy %q is defined twice: in %s and in %s; policy names must be unique", p.name, first, src.Name)))
			continue
		}
		owner[p.name] = src.Name
		policies = append(policies, p)
	}
	if len(errs) > 0 {
		return nil, errs
	}

	c := newCompiler()
	if c.Compile(modules); c.Failed() {
		return nil, fromASTErrors(c.Errors)
	}
	slices.SortFunc(policies, func(a, b policyModule) int { return strings.Compare(a.name, b.name) })
	slices.SortFunc(libraries, func(a, b Source) int { return strings.Compare(a.Name, b.Name) })
	return &compiledSet{compiler: c, policies: policies, libraries: digestLibraries(libraries)}, nil
}

// newCompiler is the compiler for policy sets and for the library's tests.
func newCompiler() *ast.Compiler {
	caps := *ast.CapabilitiesForThisVersion()
	caps.Builtins = slices.DeleteFunc(slices.Clone(caps.Builtins), func(b *ast.Builtin) bool {
		return slices.Contains(excludedBuiltins, b.Name)
	})
	return ast.NewCompiler().
		WithCapabilities(&caps).
		WithDefaultRegoVersion(ast.RegoV1)
}

// parseSource parses one module as Rego v1, keeping its METADATA.
func parseSource(src Source) (*ast.Module, []SourceError) {
	mod, err := ast.ParseModuleWithOpts(src.Name, src.Module, ast.ParserOptions{
		RegoVersion:       ast.RegoV1,
		ProcessAnnotation: true,
	})
	if err != nil {
		var astErrs ast.Errors
		if errors.As(err, &astErrs) {
			return nil, fromASTErrors(astErrs)
		}
		return nil, []SourceError{{Source: src.Name, Message: err.Error()}}
	}
	if mod == nil {
		return nil, []SourceError{{Source: src.Name, Message: "empty module: a policy needs at least a package and a deny or warn rule"}}
	}
	return mod, nil
}

// inspectModule checks the policy contract on a module under deployguard.
// Modules in other packages are libraries: compiled, never evaluated.
func inspectModule(source string, mod *ast.Module) (policyModule, bool, []SourceError) {
	path := mod.Package.Path
	if len(path) < 2 || !path[1].Equal(ast.StringTerm(packageRoot)) {
		return policyModule{}, false, nil
	}
	loc := mod.Package.Location
	if len(path) == 2 {
		return policyModule{}, false, []SourceError{errorAt(source, loc,
			"package deployguard has no policy name: use package deployguard.<name>")}
	}
	p := policyModule{name: policyName(path), source: source, mode: ModeEnforce, path: path}

	var errs []SourceError
	mode, err := declaredMode(mod)
	if err != nil {
		errs = append(errs, errorAt(source, err.loc, err.msg))
	} else if mode != "" {
		p.mode = mode
	}
	if sev, cat, err := declaredSeverityCategory(mod); err != nil {
		errs = append(errs, errorAt(source, err.loc, err.msg))
	} else {
		p.severity, p.category = sev, cat
	}

	defined := map[string]bool{}
	for _, r := range mod.Rules {
		name := r.Head.Ref()[0].String()
		if name != ruleDeny && name != ruleWarn {
			continue
		}
		if len(r.Head.Ref()) != 1 || len(r.Head.Args) != 0 || r.Head.RuleKind() != ast.MultiValue {
			errs = append(errs, errorAt(source, r.Location,
				fmt.Sprintf("%s must be a set of messages: write `%s contains msg if { … }`", name, name)))
			continue
		}
		defined[name] = true
	}
	for _, name := range []string{ruleDeny, ruleWarn} {
		if defined[name] {
			p.rules = append(p.rules, name)
		}
	}
	if len(p.rules) == 0 && len(errs) == 0 {
		errs = append(errs, errorAt(source, loc, fmt.Sprintf(
			"policy %q defines neither deny nor warn; helper modules belong in a package outside deployguard", p.name)))
	}
	if len(errs) > 0 {
		return policyModule{}, false, errs
	}
	return p, true, nil
}

// policyName is the package path without data.deployguard: "images", "team.limits".
func policyName(path ast.Ref) string {
	parts := make([]string, 0, len(path)-2)
	for _, t := range path[2:] {
		if s, ok := t.Value.(ast.String); ok {
			parts = append(parts, string(s))
		} else {
			parts = append(parts, t.String())
		}
	}
	return strings.Join(parts, ".")
}

type locatedError struct {
	loc *ast.Location
	msg string
}

// declaredMode reads custom.mode from the package's METADATA; "" when absent.
func declaredMode(mod *ast.Module) (Mode, *locatedError) {
	for _, a := range mod.Annotations {
		if a.Scope != "package" {
			continue
		}
		v, ok := a.Custom[modeKey]
		if !ok {
			continue
		}
		s, ok := v.(string)
		if !ok {
			return "", &locatedError{a.Location, fmt.Sprintf("custom.mode must be a string, not %v", v)}
		}
		m, err := ParseMode(s)
		if err != nil {
			return "", &locatedError{a.Location, "custom.mode: " + err.Error()}
		}
		return m, nil
	}
	return "", nil
}

// declaredSeverityCategory reads custom.severity and custom.category from the
// package's METADATA; "" for each that is absent.
func declaredSeverityCategory(mod *ast.Module) (severity, category string, _ *locatedError) {
	for _, a := range mod.Annotations {
		if a.Scope != "package" {
			continue
		}
		if v, ok := a.Custom[severityKey]; ok {
			s, ok := v.(string)
			if !ok || !slices.Contains(severities, s) {
				return "", "", &locatedError{a.Location, fmt.Sprintf("custom.severity must be one of %s, not %v", strings.Join(severities, ", "), v)}
			}
			severity = s
		}
		if v, ok := a.Custom[categoryKey]; ok {
			s, ok := v.(string)
			if !ok {
				return "", "", &locatedError{a.Location, fmt.Sprintf("custom.category must be a string, not %v", v)}
			}
			category = s
		}
	}
	return severity, category, nil
}
