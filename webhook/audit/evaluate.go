// Package audit is the background audit: a leader-only controller that
// evaluates the Deployments already stored in the cluster with the validating
// webhook's pipeline (the Go spec checks, every Rego policy in every mode, the
// quarantine) and writes what it finds as one PolicyReport per namespace. It
// is admission applied to what is stored, so it lives with the webhook, as
// Kyverno's background controller lives with its admission code.
package audit

import (
	"context"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/deployguard/deployguard/policy"
	"github.com/deployguard/deployguard/reconciler/vocab"
	guardwebhook "github.com/deployguard/deployguard/webhook"
)

// Results of a PolicyReport result, as wgpolicyk8s.io and openreports.io name them.
const (
	ResultPass  = "pass"
	ResultFail  = "fail"
	ResultWarn  = "warn"
	ResultError = "error"
	ResultSkip  = "skip"
)

// Policy names of the Go checks; Rego policies are "deployguard.<name>".
const (
	PolicySpec       = "spec-checks"
	PolicyQuarantine = "quarantine"
)

// AuditUsername is the user an audit evaluation runs as: a policy tells an
// audit from admission by input.userInfo.username == "deployguard:audit".
const AuditUsername = "deployguard:audit"

// specRules are the rules of webhook.CheckSpec, named by the field they judge,
// so that each has a pass result when nothing is wrong. The overlap check is
// not among them: its findings carry the selector's and the template labels'
// paths, so OverlapResults names its rule, RuleOverlap, and gives it its pass.
var specRules = []struct{ rule, prefix string }{
	{"selector", "spec.selector"},
	{"selector", "spec.template.metadata.labels"},
	{"strategy", "spec.strategy"},
	{"revision-history", "spec.revisionHistoryLimit"},
	{"progress-deadline", "spec.progressDeadlineSeconds"},
}

// RuleOverlap is the rule of the overlap check, under PolicySpec.
const RuleOverlap = "overlap"

// Resource names the Deployment a result is about.
type Resource struct {
	Namespace, Name string
	UID             types.UID
}

// Result is one policy rule's verdict on one Deployment.
type Result struct {
	Policy, Rule, Result string
	// Message is the webhook's own line, field path first.
	Message            string
	Field              string
	Severity, Category string
	Resource           Resource
}

// Evaluator runs the validating webhook's checks on a stored Deployment.
type Evaluator struct {
	Options *guardwebhook.Options
	Engine  *policy.Engine
	// NamespaceLabels, when set, gives policies the namespace's labels.
	NamespaceLabels func(ctx context.Context, namespace string) (map[string]string, error)
	// Overlaps, when set, finds the Deployments a stored one may overlap:
	// the webhook's index, fed by the shared informer, so that a lookup costs
	// its few candidates, never a list of the namespace. Without it overlaps
	// are not audited.
	Overlaps guardwebhook.OverlapSource
}

// Evaluate judges d as stored: an UPDATE whose oldObject equals object, run
// as AuditUsername. A namespace the webhook exempts gets skip results; one
// whose label deployguard.io/guard=disabled keeps the webhooks away gets none,
// as it is not guarded.
func (e *Evaluator) Evaluate(ctx context.Context, d *appsv1.Deployment) []Result {
	return e.evaluate(ctx, d, e.active(), nil, true)
}

// EvaluatePolicies judges d with only the policies of set that only selects:
// after a new policy set is loaded, the results of the policies it left
// unchanged stand.
func (e *Evaluator) EvaluatePolicies(ctx context.Context, d *appsv1.Deployment, set *policy.Set, only func(name string) bool) []Result {
	return e.evaluate(ctx, d, set, only, false)
}

func (e *Evaluator) active() *policy.Set {
	if e.Engine == nil {
		return nil
	}
	s := e.Engine.Active()
	return &s
}

// evaluate runs the Go checks when checks is set, and the policies of set
// that only selects.
func (e *Evaluator) evaluate(ctx context.Context, d *appsv1.Deployment, set *policy.Set, only func(string) bool, checks bool) []Result {
	res := Resource{Namespace: d.Namespace, Name: d.Name, UID: d.UID}
	var nsLabels map[string]string
	if e.NamespaceLabels != nil {
		nsLabels, _ = e.NamespaceLabels(ctx, d.Namespace)
		if nsLabels[vocab.LabelGuard] == "disabled" {
			return nil
		}
	}
	var out []Result
	if slices.Contains(e.Options.ExemptNamespaces, d.Namespace) {
		if checks {
			out = append(out, Result{Policy: PolicySpec, Rule: "exempt", Result: ResultSkip, Message: "namespace " + d.Namespace + " is exempt from deployguard's checks", Resource: res})
		}
		return out
	}
	if checks {
		out = append(out, SpecResults(guardwebhook.CheckSpec(d, e.Options), res)...)
		if e.Overlaps != nil {
			others, err := e.Overlaps.OverlapCandidates(ctx, d)
			out = append(out, OverlapResults(d, others, err, res)...)
		}
		out = append(out, QuarantineResult(d, e.Options.Quarantine, res))
	}
	if set != nil {
		in := policy.Request{
			Operation: "UPDATE", Namespace: d.Namespace, Name: d.Name, Object: d, OldObject: d,
			UserInfo: policy.UserInfo{Username: AuditUsername},
		}
		in.NamespaceLabels = nsLabels
		dec, err := set.EvaluateRequest(ctx, in, only)
		policies := set.Policies()
		if only != nil {
			policies = slices.DeleteFunc(policies, func(p policy.PolicyInfo) bool { return !only(p.Name) })
		}
		out = append(out, RegoResults(policies, dec, err, res)...)
	}
	return out
}

// SpecResults turns the Go spec checks' findings into one result per rule:
// fail for an error, warn for a warning, pass for a rule that said nothing.
func SpecResults(f guardwebhook.Findings, res Resource) []Result {
	var out []Result
	said := map[string]bool{}
	for _, e := range f.Errs {
		r := specRule(e.Field)
		said[r] = true
		out = append(out, Result{Policy: PolicySpec, Rule: r, Result: ResultFail, Field: e.Field, Message: errorLine(e), Resource: res})
	}
	for _, w := range f.Warnings {
		path, _, _ := strings.Cut(w, ":")
		r := specRule(path)
		said[r] = true
		out = append(out, Result{Policy: PolicySpec, Rule: r, Result: ResultWarn, Field: path, Message: w, Resource: res})
	}
	seen := map[string]bool{}
	for _, s := range specRules {
		if said[s.rule] || seen[s.rule] {
			continue
		}
		seen[s.rule] = true
		out = append(out, Result{Policy: PolicySpec, Rule: s.rule, Result: ResultPass, Resource: res})
	}
	return out
}

// OverlapResults judges d's overlaps with the candidates others (err: the
// lookup failed) with the webhook's overlap check: one warn result per
// Deployment it overlaps, naming it, or one pass. A warn, not a fail: seen as
// the UPDATE the audit evaluates, a stored Deployment's overlap predates the
// update, and admission then only warns (webhook.Validate), lest it block
// unrelated changes such as a rollback; it refuses the overlap on CREATE.
// Both sides of an overlap warn, each naming the other.
func OverlapResults(d *appsv1.Deployment, others []guardwebhook.Selection, err error, res Resource) []Result {
	r := Result{Policy: PolicySpec, Rule: RuleOverlap, Result: ResultPass, Resource: res}
	if err != nil {
		r.Result, r.Field = ResultError, "spec.selector"
		r.Message = "spec.selector: could not look up the namespace's Deployments to check for overlapping selectors: " + err.Error() +
			"; the audit checks again when this Deployment changes and at the next full pass"
		return []Result{r}
	}
	f := guardwebhook.CheckOverlap(d, others)
	if len(f.Errs) == 0 {
		return []Result{r}
	}
	// CheckOverlap goes through others in name order: the results, like
	// their messages, do not depend on the index.
	out := make([]Result, 0, len(f.Errs))
	for _, e := range f.Errs {
		w := r
		w.Result, w.Field, w.Message = ResultWarn, "spec.selector", guardwebhook.OverlapWarning(e)
		out = append(out, w)
	}
	return out
}

// errorLine prints a field error as the API server prints the webhook's
// refusal: "spec.strategy.rollingUpdate: Invalid value: …: detail".
func errorLine(e *field.Error) string {
	return e.Error()
}

func specRule(path string) string {
	for _, s := range specRules {
		if strings.HasPrefix(path, s.prefix) {
			return s.rule
		}
	}
	return "spec"
}

// QuarantineResult fails a Deployment whose current pod template is on its
// own quarantine list: it runs a template that failed its deadline before and
// that the webhook would refuse to bring back.
func QuarantineResult(d *appsv1.Deployment, mode string, res Resource) Result {
	r := Result{Policy: PolicyQuarantine, Rule: "quarantined-template", Result: ResultPass, Resource: res}
	if mode == guardwebhook.QuarantineOff {
		r.Result = ResultSkip
		r.Message = "the quarantine is off"
		return r
	}
	hash := vocab.TemplateHash(&d.Spec.Template)
	if !slices.Contains(vocab.QuarantinedTemplates(d), hash) || d.Annotations[vocab.AnnotationAllowTemplate] == hash {
		return r
	}
	r.Result, r.Field = ResultFail, "spec.template"
	if mode == guardwebhook.QuarantineWarn {
		r.Result = ResultWarn
	}
	r.Message = "spec.template: this pod template (hash " + hash + ") failed its rollout before and deployguard rolled it back; change the template to fix the failure, " +
		"or to keep this exact template deliberately set the annotation " + vocab.AnnotationAllowTemplate + "=" + hash
	return r
}

// RegoResults gives every policy of the set its results: a deny finding
// fails and a warn finding warns whatever the policy's mode (the mode decides
// what admission does, not what is wrong), an evaluation failure is an error,
// and a policy that found nothing passes. An exempt request skips them all.
func RegoResults(policies []policy.PolicyInfo, dec policy.Decision, err error, res Resource) []Result {
	var out []Result
	findings := map[string][]policy.Finding{}
	for _, fs := range [][]policy.Finding{dec.Denied, dec.Warnings, dec.Audited} {
		for _, f := range fs {
			findings[f.Policy] = append(findings[f.Policy], f)
		}
	}
	for _, p := range policies {
		base := Result{Policy: "deployguard." + p.Name, Severity: p.Severity, Category: p.Category, Resource: res}
		switch {
		case err != nil:
			r := base
			r.Rule, r.Result, r.Message = "evaluation", ResultError, "the policies could not read this Deployment: "+err.Error()
			out = append(out, r)
			continue
		case dec.Exempt:
			r := base
			r.Rule, r.Result, r.Message = "exempt", ResultSkip, dec.ExemptReason
			out = append(out, r)
			continue
		}
		fs := findings[p.Name]
		if len(fs) == 0 {
			r := base
			r.Rule, r.Result = "deny", ResultPass
			out = append(out, r)
			continue
		}
		for _, f := range fs {
			r := base
			r.Rule, r.Field, r.Message = f.Rule, f.Field, f.String()
			switch {
			case f.EvalFailed:
				r.Rule, r.Result = "evaluation", ResultError
			case f.Rule == "warn":
				r.Result = ResultWarn
			default:
				r.Result = ResultFail
			}
			out = append(out, r)
		}
	}
	return out
}

func typesUID(s string) types.UID { return types.UID(s) }
