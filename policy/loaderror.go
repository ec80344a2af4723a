package policy

import (
	"errors"
	"strconv"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
)

// SourceError is one problem in one source, with the line it is on.
type SourceError struct {
	// Source is the Source.Name of the module; empty if OPA could not say.
	Source string
	// Line is 1-based; 0 when the problem has no single line.
	Line int
	// Message is OPA's (or our) description, e.g.
	// "rego_parse_error: unexpected identifier token".
	Message string
}

// Error renders "source:line: message", the form editors and CI understand.
func (e SourceError) Error() string {
	var b strings.Builder
	if e.Source != "" {
		b.WriteString(e.Source)
		if e.Line > 0 {
			b.WriteByte(':')
			b.WriteString(strconv.Itoa(e.Line))
		}
		b.WriteString(": ")
	}
	b.WriteString(e.Message)
	return b.String()
}

// LoadError is returned by Load when a policy set is refused. The set that
// was active before stays active.
type LoadError struct {
	Errors []SourceError
}

func (e *LoadError) Error() string {
	msgs := make([]string, len(e.Errors))
	for i, se := range e.Errors {
		msgs[i] = se.Error()
	}
	return "policy set refused: " + strings.Join(msgs, "; ")
}

// Sources lists the sources that have errors, in order, without repeats.
func (e *LoadError) Sources() []string {
	var names []string
	seen := map[string]bool{}
	for _, se := range e.Errors {
		if !seen[se.Source] {
			seen[se.Source] = true
			names = append(names, se.Source)
		}
	}
	return names
}

// AsLoadError unwraps err to a *LoadError, if it is one.
func AsLoadError(err error) (*LoadError, bool) {
	var le *LoadError
	ok := errors.As(err, &le)
	return le, ok
}

// fromASTErrors converts OPA's errors, which carry the file name we parsed or
// compiled the module under: the source name.
func fromASTErrors(errs ast.Errors) []SourceError {
	out := make([]SourceError, 0, len(errs))
	for _, e := range errs {
		se := SourceError{Message: e.Code + ": " + e.Message}
		if e.Location != nil {
			se.Source = e.Location.File
			se.Line = e.Location.Row
		}
		out = append(out, se)
	}
	return out
}

// errorAt builds our own error about a location in a module.
func errorAt(source string, loc *ast.Location, msg string) SourceError {
	se := SourceError{Source: source, Message: msg}
	if loc != nil {
		se.Line = loc.Row
	}
	return se
}
