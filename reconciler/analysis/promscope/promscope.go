// Package promscope scopes a tenant's PromQL query to its own namespace and
// fills in the query's template (the Deployment's namespace and name, the new
// revision's pod-template-hash).
//
// Scoping works on the parsed expression, as prom-label-proxy's injectproxy
// does: every vector selector (also inside a range selector, a subquery, a
// function, an aggregation or either side of a binary operation) gets the
// matcher namespace="<ns>", and a query that already matches on namespace in
// any other way is refused. The query is never edited as a string. It uses
// Prometheus' promql/parser directly rather than injectproxy, whose package
// also serves Alertmanager's API and would add 58 more packages (go-openapi,
// mongo's bson, Alertmanager's client) to the guard's binary.
package promscope

import (
	"errors"
	"fmt"
	"strings"
	"text/template"
	tparse "text/template/parse"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"k8s.io/apimachinery/pkg/util/validation"
)

// NamespaceLabel is the label Prometheus' Kubernetes discovery (and
// kube-prometheus-stack's relabelling) puts the pod's namespace in.
const NamespaceLabel = "namespace"

// ErrOtherNamespace is wrapped by the error for a query whose selector
// matches on the namespace label other than namespace="<its own>".
var ErrOtherNamespace = errors.New("the query names a namespace other than its own")

// promqlParser has Prometheus' default options: no experimental functions,
// so that what the guard accepts any Prometheus accepts.
func promqlParser() parser.Parser { return parser.NewParser(parser.Options{}) }

// EnforceNamespace parses query and returns it with namespace="<namespace>"
// on every selector. A selector that already has exactly that matcher is
// left as it is; one with any other matcher on the namespace label
// (another value, a regular expression, a negation) is refused with
// ErrOtherNamespace: rewriting it would change what its author asked for
// without saying so.
func EnforceNamespace(query, namespace string) (string, error) {
	if errs := validation.IsDNS1123Label(namespace); len(errs) > 0 {
		return "", fmt.Errorf("namespace %q: %s", namespace, strings.Join(errs, "; "))
	}
	expr, err := promqlParser().ParseExpr(query)
	if err != nil {
		return "", fmt.Errorf("parsing the query: %w", err)
	}
	want, err := labels.NewMatcher(labels.MatchEqual, NamespaceLabel, namespace)
	if err != nil {
		return "", fmt.Errorf("namespace matcher: %w", err)
	}
	if err := parser.Walk(enforcer{want: want}, expr, nil); err != nil {
		return "", err
	}
	return expr.String(), nil
}

// enforcer is a parser.Visitor that stops the walk at the first refusal.
type enforcer struct{ want *labels.Matcher }

func (e enforcer) Visit(node parser.Node, _ []parser.Node) (parser.Visitor, error) {
	vs, ok := node.(*parser.VectorSelector)
	if !ok {
		return e, nil
	}
	found := false
	for _, m := range vs.LabelMatchers {
		if m.Name != NamespaceLabel {
			continue
		}
		if m.Type != labels.MatchEqual || m.Value != e.want.Value {
			return nil, fmt.Errorf("selector %s: matcher %s: %w %q", vs, m, ErrOtherNamespace, e.want.Value)
		}
		found = true
	}
	if !found {
		vs.LabelMatchers = append(vs.LabelMatchers, e.want)
	}
	return e, nil
}

// Vars are what a query's template can name.
type Vars struct {
	// Namespace and Name of the Deployment.
	Namespace string
	Name      string
	// PodTemplateHash is the new ReplicaSet's pod-template-hash label: the
	// query measures the new pods only.
	PodTemplateHash string
	// StablePodTemplateHash is the pod-template-hash of the known-good
	// revision the new one replaces, for a query that compares the new pods
	// with the old (a baseline); empty when there is none, and then a query
	// that names it cannot be rendered (ErrNoBaseline).
	StablePodTemplateHash string
}

// ErrNoBaseline is why a query naming {{ .StablePodTemplateHash }} cannot be
// rendered for a revision that replaces no known-good one: an empty hash
// would select every series without the label, not the old pods.
var ErrNoBaseline = errors.New("no known-good revision to compare with")

// templateData is what a query's template sees: the values, and the
// baseline's hash as a method, so that naming it without one fails.
type templateData struct {
	Namespace, Name, PodTemplateHash string
	stable                           string
}

// StablePodTemplateHash is Vars.StablePodTemplateHash, or ErrNoBaseline.
// Checked here, not with the other values, so that a bad one fails only the
// queries that name it.
func (d templateData) StablePodTemplateHash() (string, error) {
	if d.stable == "" {
		return "", ErrNoBaseline
	}
	if msgs := validation.IsValidLabelValue(d.stable); len(msgs) > 0 {
		return "", fmt.Errorf("the known-good revision's pod-template-hash: %s", strings.Join(msgs, "; "))
	}
	return d.stable, nil
}

func (v Vars) validate() error {
	var errs []string
	for _, msg := range validation.IsDNS1123Label(v.Namespace) {
		errs = append(errs, "namespace: "+msg)
	}
	for _, msg := range validation.IsDNS1123Subdomain(v.Name) {
		errs = append(errs, "name: "+msg)
	}
	// The hash is a label value (rand.SafeEncodeString of the template's hash).
	for _, msg := range validation.IsValidLabelValue(v.PodTemplateHash) {
		errs = append(errs, "pod-template-hash: "+msg)
	}
	if len(errs) > 0 {
		return fmt.Errorf("template values: %s", strings.Join(errs, "; "))
	}
	return nil
}

// escaped returns v with every value escaped for the inside of a
// double-quoted PromQL string literal. The values are Kubernetes names and
// label values, so this changes nothing today; it keeps a quote or a
// backslash from ever ending the literal early should those rules widen.
func (v Vars) escaped() templateData {
	return templateData{
		Namespace:       escapeString(v.Namespace),
		Name:            escapeString(v.Name),
		PodTemplateHash: escapeString(v.PodTemplateHash),
		stable:          escapeString(v.StablePodTemplateHash),
	}
}

var stringEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

func escapeString(s string) string { return stringEscaper.Replace(s) }

// Query is a query template, parsed once when the check is loaded and
// rendered for each revision it measures. A tenant's is scoped to its
// namespace; the platform's is not.
type Query struct {
	text     string
	tmpl     *template.Template
	unscoped bool
}

// exampleVars fill the template when it is parsed, so that a query that is
// not PromQL once rendered is refused at load time.
var exampleVars = Vars{Namespace: "example", Name: "example", PodTemplateHash: "5d8f9c7b6", StablePodTemplateHash: "7c6b5d4f8"}

// Parse parses a tenant's query template (text/template, {{ .Namespace }},
// {{ .Name }}, {{ .PodTemplateHash }}, {{ .StablePodTemplateHash }}; any
// other name is an error) and checks
// that it renders to PromQL that can be scoped to a namespace.
func Parse(text string) (*Query, error) { return parse(text, exampleVars, false) }

// ParseIn is Parse for a query of namespace's own: one that names its own
// namespace is accepted, one that names another is refused here, when it is
// written, rather than at its first measurement.
func ParseIn(text, namespace string) (*Query, error) {
	v := exampleVars
	v.Namespace = namespace
	return parse(text, v, false)
}

// ParseUnscoped parses the platform's query template: rendered as written,
// with no namespace matcher added (the platform may read any namespace).
func ParseUnscoped(text string) (*Query, error) { return parse(text, exampleVars, true) }

func parse(text string, example Vars, unscoped bool) (*Query, error) {
	tmpl, err := template.New("query").Option("missingkey=error").Parse(text)
	if err != nil {
		return nil, fmt.Errorf("query template: %w", err)
	}
	if err := onlyValues(tmpl); err != nil {
		return nil, fmt.Errorf("query template: %w", err)
	}
	q := &Query{text: text, tmpl: tmpl, unscoped: unscoped}
	if _, err := q.Render(example); err != nil {
		return nil, err
	}
	return q, nil
}

// templateValues are the names a query's template may use.
var templateValues = map[string]bool{"Namespace": true, "Name": true, "PodTemplateHash": true, "StablePodTemplateHash": true}

// onlyValues refuses a template that does more than name the values: no
// range, if, with, define, pipe or function. A template is a program; a
// tenant's `{{ range 2000000000 }}{{ range 2000000000 }}{{ end }}{{ end }}`
// would spin a core of the guard for ever, in the webhook that parses it and
// in the reconciler that renders it.
func onlyValues(tmpl *template.Template) error {
	if len(tmpl.Templates()) > 1 {
		return errors.New("{{ define }} and {{ block }} are not allowed")
	}
	if tmpl.Tree == nil || tmpl.Root == nil {
		return nil
	}
	for _, n := range tmpl.Root.Nodes {
		switch n := n.(type) {
		case *tparse.TextNode, *tparse.CommentNode:
		case *tparse.ActionNode:
			if !isValueAction(n) {
				return fmt.Errorf("%s: only {{ .Namespace }}, {{ .Name }}, {{ .PodTemplateHash }} and {{ .StablePodTemplateHash }} may be used", cutNode(n.String()))
			}
		default:
			return fmt.Errorf("%s: only {{ .Namespace }}, {{ .Name }}, {{ .PodTemplateHash }} and {{ .StablePodTemplateHash }} may be used (no range, if, with or template)", cutNode(n.String()))
		}
	}
	return nil
}

// isValueAction: {{ .Field }}, one of templateValues, and nothing else.
func isValueAction(a *tparse.ActionNode) bool {
	if a.Pipe == nil || len(a.Pipe.Decl) > 0 || len(a.Pipe.Cmds) != 1 || len(a.Pipe.Cmds[0].Args) != 1 {
		return false
	}
	f, ok := a.Pipe.Cmds[0].Args[0].(*tparse.FieldNode)
	return ok && len(f.Ident) == 1 && templateValues[f.Ident[0]]
}

// cutNode shortens a template node for an error message.
func cutNode(s string) string {
	if len(s) > 64 {
		return s[:61] + "..."
	}
	return s
}

// String is the template as written.
func (q *Query) String() string { return q.text }

// MaxRenderedLength bounds a rendered query: a template within the
// checks' length limit that repeats a variable many times could otherwise
// expand to hundreds of KiB, parsed and sent to Prometheus every interval.
const MaxRenderedLength = 32 << 10

// boundedBuilder is a strings.Builder that refuses to grow past max.
type boundedBuilder struct {
	strings.Builder
	max int
}

func (b *boundedBuilder) Write(p []byte) (int, error) {
	if b.Len()+len(p) > b.max {
		return 0, fmt.Errorf("the rendered query would be longer than %d bytes", b.max)
	}
	return b.Builder.Write(p)
}

func (b *boundedBuilder) WriteString(s string) (int, error) { return b.Write([]byte(s)) }

// Render fills in the template with v (escaped for PromQL string literals)
// and, for a tenant's query, scopes the result to v.Namespace
// (EnforceNamespace). The platform's is only checked to parse.
func (q *Query) Render(v Vars) (string, error) {
	if err := v.validate(); err != nil {
		return "", err
	}
	b := boundedBuilder{max: MaxRenderedLength}
	if err := q.tmpl.Execute(&b, v.escaped()); err != nil {
		return "", fmt.Errorf("query template: %w", err)
	}
	if q.unscoped {
		if _, err := promqlParser().ParseExpr(b.String()); err != nil {
			return "", fmt.Errorf("query %q: parsing the query: %w", b.String(), err)
		}
		return b.String(), nil
	}
	scoped, err := EnforceNamespace(b.String(), v.Namespace)
	if err != nil {
		return "", fmt.Errorf("query %q: %w", b.String(), err)
	}
	return scoped, nil
}
