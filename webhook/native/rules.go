package native

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"sigs.k8s.io/yaml"

	nativeconfig "github.com/deployguard/deployguard/config/native"
)

// The guard's policies (config/native/policies.yaml), by what a failed
// validation does.
const (
	// Refusals refuse the request: bound in the API server (Deny).
	Refusals = "deployguard-refusals"
	// Warnings warn; the webhook evaluates them.
	Warnings = "deployguard-warnings"
	// Bounds are the platform team's bounds: warnings, or refusals when
	// enforced. Not bound in the API server: PolicyExceptions may cover
	// them, and only the guard knows those.
	Bounds = "deployguard-bounds"
)

// RefusalsCreateBinding binds Refusals to the creates that Selector
// labels LabelRefusals (config/native/bindings.yaml): the binding named
// Refusals takes the updates and deletions, where a label could not stand
// for what the policy reads.
const RefusalsCreateBinding = "deployguard-refusals-create"

// Settings are the guard's configuration as the policies read it: the data
// of the params ConfigMap.
type Settings struct {
	GuardUsername                                   string
	BreakGlassGroups                                []string
	ExemptNamespaces, ExemptUsernames, ExemptGroups []string
	RevisionHistoryMin, RevisionHistoryMax          int32
	ProgressDeadlineMin, ProgressDeadlineMax        int32
	// StableLabelKeys are the template labels deployguard-selector repairs
	// an empty selector from, in order.
	StableLabelKeys []string
	BoundsEnforce   bool
}

// Data is the params ConfigMap's data for s.
func (s Settings) Data() map[string]string {
	list := func(v []string) string { return strings.Join(v, ",") }
	num := func(v int32) string { return strconv.Itoa(int(v)) }
	return map[string]string{
		"guardUsername":       s.GuardUsername,
		"breakGlassGroups":    list(s.BreakGlassGroups),
		"exemptNamespaces":    list(s.ExemptNamespaces),
		"exemptUsernames":     list(s.ExemptUsernames),
		"exemptGroups":        list(s.ExemptGroups),
		"revisionHistoryMin":  num(s.RevisionHistoryMin),
		"revisionHistoryMax":  num(s.RevisionHistoryMax),
		"progressDeadlineMin": num(s.ProgressDeadlineMin),
		"progressDeadlineMax": num(s.ProgressDeadlineMax),
		"stableLabelKeys":     list(s.StableLabelKeys),
	}
}

// ConfigMap is the params object for s in namespace, as the guard writes it.
func (s Settings) ConfigMap(namespace string) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Name: nativeconfig.ParamsName, Namespace: namespace,
			Labels: map[string]string{"app.kubernetes.io/name": "deployguard"}},
		Data: s.Data(),
	}
}

// Rules are the guard's policies, compiled once.
type Rules struct {
	// Policies are the ValidatingAdmissionPolicies as installed, in file
	// order.
	Policies []*admissionregistrationv1.ValidatingAdmissionPolicy
	// Mutations are the MutatingAdmissionPolicies as installed, in file
	// order.
	Mutations []*admissionregistrationv1.MutatingAdmissionPolicy
	compiled  map[string]*Policy
	mutations map[string]*Mutation
	// joint are the passing runs of several Ignore policies evaluated
	// together, by their names joined with ",": see jointPasses.
	joint sync.Map
}

// Load parses and compiles the guard's policies. The result is shared: the
// embedded file never changes.
var Load = sync.OnceValues(func() (*Rules, error) { return Parse(nativeconfig.Policies) })

// Parse reads and compiles a file of ValidatingAdmissionPolicies and
// MutatingAdmissionPolicies. Unknown fields and other kinds are errors: a
// misspelt field would otherwise be dropped here and refused, or worse
// ignored, by the API server.
func Parse(file []byte) (*Rules, error) {
	r := &Rules{compiled: map[string]*Policy{}, mutations: map[string]*Mutation{}}
	docs := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(file)))
	for {
		doc, err := docs.Read()
		if errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("reading the policies: %w", err)
		}
		var t metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &t); err != nil {
			return nil, fmt.Errorf("reading the policies: %w", err)
		}
		switch t.Kind {
		case "":
			continue // only comments
		case "ValidatingAdmissionPolicy":
			err = addPolicy(doc, Compile, &r.Policies, r.compiled)
		case "MutatingAdmissionPolicy":
			err = addPolicy(doc, CompileMutation, &r.Mutations, r.mutations)
		default:
			err = fmt.Errorf("reading the policies: unexpected kind %q", t.Kind)
		}
		if err != nil {
			return nil, err
		}
	}
	return r, nil
}

// object is a pointer to an API object of type T.
type object[T any] interface {
	*T
	GetName() string
}

// addPolicy reads doc, strictly, as a policy of type T, compiles it, and
// files it in policies and, compiled, under its name in compiled.
func addPolicy[T any, P object[T], C any](doc []byte, compile func(P) (C, error), policies *[]P, compiled map[string]C) error {
	p := P(new(T))
	if err := yaml.UnmarshalStrict(doc, p); err != nil {
		return fmt.Errorf("reading the policies: %w", err)
	}
	c, err := compile(p)
	if err != nil {
		return err
	}
	*policies = append(*policies, p)
	compiled[p.GetName()] = c
	return nil
}

// Finding is one failed validation of the guard's policies.
type Finding struct {
	// Policy is the policy whose validation failed (Refusals, Warnings,
	// Bounds).
	Policy string
	// Field is the field the message is about ("spec.strategy.type"), and
	// Message what is wrong and what to change, without the field.
	Field, Message string
	// Reason is Invalid or Forbidden.
	Reason metav1.StatusReason
	// Error is set when the validation could not be evaluated; Message says
	// why.
	Error bool
}

// Line is the finding as the API server's policy plugin words it, without
// the policy's name: "field: message".
func (f Finding) Line() string {
	if f.Field == "" {
		return f.Message
	}
	return f.Field + ": " + f.Message
}

// Params are Settings as the guard evaluates its policies with them,
// converted once.
type Params struct{ obj runtime.Object }

// Params are s for Evaluate. The caller decides what a bound does. The
// webhook asks on every write for the same settings: the last params built
// are kept, and given again while the data is the same. Params are never
// changed once built.
func (s Settings) Params() *Params {
	d := s.Data()
	if last := lastParams.Load(); last != nil && maps.Equal(last.data, d) {
		return last.params
	}
	data := make(map[string]any, len(d))
	for k, v := range d {
		data[k] = v
	}
	p := &Params{obj: &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": nativeconfig.ParamsName},
		"data":     data,
	}}}
	lastParams.Store(&builtParams{data: d, params: p})
	return p
}

type builtParams struct {
	data   map[string]string
	params *Params
}

var lastParams atomic.Pointer[builtParams]

// Evaluate runs the named policies on req with params, and returns what
// failed, in policy and validation order. An Ignore policy whose message
// expressions alone fail gives no error here (Policy.evaluate).
func (r *Rules) Evaluate(ctx context.Context, req Request, params *Params, policies ...string) []Finding {
	req.Params = params.obj
	changed := req.Object != nil && req.OldObject != nil && !apiequality.Semantic.DeepEqual(req.Object.Spec.Template, req.OldObject.Spec.Template)
	req.Object, req.OldObject = project(req.Object, changed), project(req.OldObject, false)
	in, err := inputOf(req)
	if err != nil {
		return []Finding{{Policy: policies[0], Message: err.Error(), Error: true}}
	}
	if j := r.jointPasses(policies); j != nil {
		var params runtime.Object
		if j.hasParams {
			params = in.params
		}
		if admits(j.passes.Validate(ctx, deployments, in.attrs, params, in.namespace, celconfig.RuntimeCELCostBudget, nil)) {
			return nil
		}
	}
	var out []Finding
	for _, name := range policies {
		p, ok := r.compiled[name]
		if !ok {
			out = append(out, Finding{Policy: name, Message: "no policy " + name, Error: true})
			continue
		}
		for _, d := range p.evaluate(ctx, in) {
			f := Finding{Policy: name, Message: d.Message, Reason: d.Reason, Error: d.Error}
			if !d.Error {
				f.Field, f.Message = splitField(d.Message)
			}
			out = append(out, f)
		}
	}
	return out
}

// SizeBoundSuffix ends every message of deployguard-refusals' size bounds
// (config/native/policies.yaml, sizeBounded), which share their fields with
// other rules: the guard files those findings under their own check by it.
const SizeBoundSuffix = "deployguard keeps these of every Deployment in memory"

// project is d as the guard's policies read it: without the pod template
// but for its labels, and without the managed fields, which no expression of
// theirs reads (TestPoliciesReadNoTemplate) and which are most of a
// Deployment, so that converting it for CEL costs little on the webhook's
// path. A template that changed in an update leaves a marker on the new
// object, so that "object.spec != oldObject.spec" still says so.
func project(d *appsv1.Deployment, templateChanged bool) *appsv1.Deployment {
	if d == nil {
		return nil
	}
	p := *d
	p.ManagedFields = nil
	p.Spec.Template = corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: d.Spec.Template.Labels}}
	if templateChanged {
		p.Spec.Template.Annotations = map[string]string{"deployguard.io/template-changed": "true"}
	}
	return &p
}

// splitField splits "field: message", the form of every message of the
// guard's policies.
func splitField(m string) (string, string) {
	field, rest, ok := strings.Cut(m, ": ")
	if !ok || strings.ContainsAny(field, " ") {
		return "", m
	}
	return field, rest
}

// jointPasses is the passing run of the named policies as one: their
// variables, each computed once (the warnings and the bounds share who is
// checked, the costliest), and their validations, without messages. Most
// writes pass every validation, and then one activation answers for all.
// A policy with match conditions (the refusals) joins by them alone, as one
// validation that they do not all hold: where the joint run passes, that
// policy excluded the request and has nothing to say, whatever its
// failurePolicy. When any validation does not pass, or the run errs, each
// policy is evaluated as before, so the answers are the same: a joint run
// within the cost budget leaves each policy's own run within it too. Nil
// when the policies cannot be joined: fewer than two, one without match
// conditions whose failurePolicy is not Ignore, different params, or a
// variable name two policies define differently.
func (r *Rules) jointPasses(names []string) *Policy {
	if len(names) < 2 {
		return nil
	}
	key := strings.Join(names, ",")
	if v, ok := r.joint.Load(key); ok {
		j, _ := v.(*Policy)
		return j
	}
	j := r.join(names)
	if j == nil {
		r.joint.Store(key, (*Policy)(nil))
		return nil
	}
	r.joint.Store(key, j)
	return j
}

func (r *Rules) join(names []string) *Policy {
	var joint *admissionregistrationv1.ValidatingAdmissionPolicy
	vars := map[string]string{}
	for _, name := range names {
		var p *admissionregistrationv1.ValidatingAdmissionPolicy
		for _, x := range r.Policies {
			if x.Name == name {
				p = x
			}
		}
		matched := p != nil && len(p.Spec.MatchConditions) > 0
		if p == nil || len(p.Spec.AuditAnnotations) > 0 ||
			!matched && (p.Spec.FailurePolicy == nil || *p.Spec.FailurePolicy != admissionregistrationv1.Ignore) {
			return nil
		}
		if joint == nil {
			ignore := admissionregistrationv1.Ignore
			joint = &admissionregistrationv1.ValidatingAdmissionPolicy{}
			joint.Name = "joint:" + strings.Join(names, ",")
			joint.Spec.FailurePolicy = &ignore
			joint.Spec.ParamKind = p.Spec.ParamKind
		} else if !apiequality.Semantic.DeepEqual(joint.Spec.ParamKind, p.Spec.ParamKind) {
			return nil
		}
		if matched {
			// Match conditions read no variables: this one needs none of
			// the policy's.
			conds := make([]string, 0, len(p.Spec.MatchConditions))
			for _, c := range p.Spec.MatchConditions {
				conds = append(conds, "("+c.Expression+")")
			}
			joint.Spec.Validations = append(joint.Spec.Validations, admissionregistrationv1.Validation{
				Expression: "!(" + strings.Join(conds, " && ") + ")", Message: "joint"})
			continue
		}
		for _, v := range p.Spec.Variables {
			if expr, ok := vars[v.Name]; ok {
				if expr != v.Expression {
					return nil
				}
				continue
			}
			vars[v.Name] = v.Expression
			joint.Spec.Variables = append(joint.Spec.Variables, v)
		}
		for _, v := range p.Spec.Validations {
			joint.Spec.Validations = append(joint.Spec.Validations, admissionregistrationv1.Validation{Expression: v.Expression, Message: "joint"})
		}
	}
	c, err := Compile(joint)
	if err != nil || c.passes == nil {
		return nil
	}
	return c
}
