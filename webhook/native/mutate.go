package native

import (
	"context"
	"fmt"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/admission"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/policy/mutating/patch"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/cel/environment"
)

// Selector is the guard's MutatingAdmissionPolicy that repairs an empty
// selector from the template's stable labels.
const Selector = "deployguard-selector"

// What deployguard-selector leaves on the object for the guard's webhook and
// deployguard-refusals to read.
const (
	// AnnotationSelectorRepaired says the selector was repaired in this
	// request ("true"). The guard's webhook turns it into its usual warning
	// and deployguard.io/defaulted entry and removes it; with the guard down
	// it stays, as the record that the API server repaired the selector.
	AnnotationSelectorRepaired = "deployguard.io/selector-repaired"
	// LabelEmptySelector, set to EmptySelectorRefused on the selector and
	// the template, marks an empty selector that could not be repaired: the
	// API server's validation lets it through, so that deployguard-refusals
	// refuses it in the guard's words, which a MutatingAdmissionPolicy
	// cannot.
	LabelEmptySelector   = "deployguard.io/empty-selector"
	EmptySelectorRefused = "refused"
	// LabelDefaulting, set to DefaultingPending on a create, says the guard's
	// mutating webhook has something to do for it (a selector repaired or
	// marked, the guard's cleanup annotation or finalizers): the webhook's
	// entry for creates selects on it, and the webhook removes it. With the
	// guard down it stays, until an update the webhook sees.
	LabelDefaulting   = "deployguard.io/defaulting"
	DefaultingPending = "pending"
	// LabelRefusals, set to DefaultingPending with LabelDefaulting, routes
	// the create to deployguard-refusals' binding for creates (every create
	// those may refuse is labelled). A label of its own: a guard of the
	// release before removes LabelDefaulting from every create, refused or
	// not. The webhook removes it from a create the refusals admit.
	LabelRefusals = "deployguard.io/refusals"
)

// Mutation is one compiled MutatingAdmissionPolicy.
type Mutation struct {
	Name      string
	matcher   matchconditions.Matcher
	patchers  []patch.Patcher
	compiler  *plugincel.CompositedCompiler
	hasParams bool
}

// CompileMutation compiles a policy as the API server's
// MutatingAdmissionPolicy plugin does (compilePolicy): its variables, match
// conditions and JSON patches, in the strict-cost base environment of the
// default compatibility version. ApplyConfiguration is not supported here:
// the guard's policies do not use it (a selector is atomic, which it cannot
// set).
func CompileMutation(p *admissionregistrationv1.MutatingAdmissionPolicy) (*Mutation, error) {
	hasParams := p.Spec.ParamKind != nil
	compiler, opts, err := newCompiler(p.Spec.Variables, hasParams)
	if err != nil {
		return nil, err
	}
	matcher, err := compileMatcher(compiler, opts, p.Spec.MatchConditions, p.Spec.FailurePolicy, p.Name)
	if err != nil {
		return nil, fmt.Errorf("MutatingAdmissionPolicy %s: %w", p.Name, err)
	}
	m := &Mutation{Name: p.Name, matcher: matcher, compiler: compiler, hasParams: hasParams}
	patchOpts := opts
	patchOpts.HasPatchTypes = true
	for i, mu := range p.Spec.Mutations {
		if mu.PatchType != admissionregistrationv1.PatchTypeJSONPatch || mu.JSONPatch == nil {
			return nil, fmt.Errorf("MutatingAdmissionPolicy %s: mutation %d: only JSONPatch is evaluated in process", p.Name, i)
		}
		eval := compiler.CompileMutatingEvaluator(&patch.JSONPatchCondition{Expression: mu.JSONPatch.Expression}, patchOpts, environment.StoredExpressions)
		if errs := eval.CompilationErrors(); len(errs) > 0 {
			return nil, fmt.Errorf("MutatingAdmissionPolicy %s: mutation %d: %v", p.Name, i, errs)
		}
		m.patchers = append(m.patchers, patch.NewJSONPatcher(eval))
	}
	return m, nil
}

// objectInterfaces are what a JSON patch needs to encode and decode a
// Deployment.
var objectInterfaces = func() admission.ObjectInterfaces {
	s := runtime.NewScheme()
	if err := appsv1.AddToScheme(s); err != nil {
		panic(err) // a static scheme: cannot fail
	}
	return admission.NewObjectInterfacesFromScheme(s)
}()

// Mutate applies the named MutatingAdmissionPolicy to req.Object with params
// as kube-apiserver would, and returns the object it gives: req.Object itself
// when the policy's match conditions exclude the request, a mutated copy
// otherwise. req.Object is not modified. An error is what the API server
// would report for a policy whose failurePolicy is Ignore, and skip. The
// policy's matchConstraints (operations, resources) are the caller's to
// apply: the guard's webhook also repairs an update's selector with it.
func (r *Rules) Mutate(ctx context.Context, req Request, params *Params, name string) (*appsv1.Deployment, error) {
	m, ok := r.mutations[name]
	if !ok {
		return nil, fmt.Errorf("no policy %s", name)
	}
	if req.Object == nil {
		return nil, nil
	}
	obj := req.Object.DeepCopy()
	obj.APIVersion, obj.Kind = appsv1.SchemeGroupVersion.String(), "Deployment"
	gvk := appsv1.SchemeGroupVersion.WithKind("Deployment")
	var old runtime.Object
	if req.OldObject != nil {
		old = req.OldObject
	}
	attrs := admission.NewAttributesRecord(obj, old, gvk, req.Namespace, req.Name, deployments, "", req.Operation, nil, req.DryRun, req.User)
	va := &admission.VersionedAttributes{Attributes: attrs, VersionedKind: gvk, VersionedObject: obj, VersionedOldObject: old}
	var p runtime.Object
	if m.hasParams && params != nil {
		p = params.obj
	}
	ctx = m.compiler.CreateContext(ctx)
	if m.matcher != nil {
		res := m.matcher.Match(ctx, va, p, nil)
		if res.Error != nil {
			return nil, fmt.Errorf("MutatingAdmissionPolicy %s: %w", name, res.Error)
		}
		if !res.Matches {
			return req.Object, nil
		}
	}
	for _, pt := range m.patchers {
		out, err := pt.Patch(ctx, patch.Request{
			MatchedResource:     deployments,
			VersionedAttributes: va,
			ObjectInterfaces:    objectInterfaces,
			OptionalVariables:   plugincel.OptionalVariableBindings{VersionedParams: p},
		}, celconfig.RuntimeCELCostBudget)
		if err != nil {
			return nil, fmt.Errorf("MutatingAdmissionPolicy %s: %w", name, err)
		}
		d, ok := out.(*appsv1.Deployment)
		if !ok {
			return nil, fmt.Errorf("MutatingAdmissionPolicy %s: the patch gave a %T", name, out)
		}
		va.VersionedObject = d
	}
	d := va.VersionedObject.(*appsv1.Deployment)
	d.APIVersion, d.Kind = req.Object.APIVersion, req.Object.Kind
	return d, nil
}
