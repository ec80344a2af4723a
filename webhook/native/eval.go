// Package native evaluates ValidatingAdmissionPolicies in process, with the
// API server's own CEL compiler and validator (k8s.io/apiserver), so that a
// test, `deployguard check` or the audit can ask what the API server would
// answer for a Deployment without one: the same expressions, the same
// environment and cost limits, the same messages.
package native

import (
	"context"
	"fmt"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/admission"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/cel/environment"
)

// Policy is one compiled ValidatingAdmissionPolicy.
type Policy struct {
	Name      string
	validator validating.Validator
	// passes runs only the match conditions and validations, for a policy
	// whose failurePolicy is Ignore (nil otherwise); see evaluate.
	passes    validating.Validator
	hasParams bool
}

// Compile compiles a policy as the API server's ValidatingAdmissionPolicy
// plugin does (compilePolicy): its variables, match conditions, validations
// and message expressions, in the strict-cost base environment of the
// default compatibility version. A policy that does not compile is an error
// here, where the API server would report it on the policy's status; so is
// one with audit annotations, which are not evaluated in process.
func Compile(p *admissionregistrationv1.ValidatingAdmissionPolicy) (*Policy, error) {
	hasParams := p.Spec.ParamKind != nil
	exprVars := plugincel.OptionalVariableDeclarations{HasParams: hasParams, HasAuthorizer: false}
	compiler, vars, err := newCompiler(p.Spec.Variables, hasParams)
	if err != nil {
		return nil, err
	}

	validations := make([]plugincel.ExpressionAccessor, len(p.Spec.Validations))
	messages := make([]plugincel.ExpressionAccessor, len(p.Spec.Validations))
	for i, v := range p.Spec.Validations {
		validations[i] = &validating.ValidationCondition{Expression: v.Expression, Message: v.Message, Reason: v.Reason}
		if v.MessageExpression != "" {
			messages[i] = &validating.MessageExpressionCondition{MessageExpression: v.MessageExpression}
		}
	}
	validationFilter := compiler.CompileCondition(validations, vars, environment.StoredExpressions)
	messageFilter := compiler.CompileCondition(messages, exprVars, environment.StoredExpressions)
	if err := compileErrors(validationFilter, messageFilter); err != nil {
		return nil, fmt.Errorf("ValidatingAdmissionPolicy %s: %w", p.Name, err)
	}
	matcher, err := compileMatcher(compiler, vars, p.Spec.MatchConditions, p.Spec.FailurePolicy, p.Name)
	if err != nil {
		return nil, fmt.Errorf("ValidatingAdmissionPolicy %s: %w", p.Name, err)
	}
	if len(p.Spec.AuditAnnotations) > 0 {
		return nil, fmt.Errorf("ValidatingAdmissionPolicy %s: audit annotations are not evaluated in process", p.Name)
	}
	c := &Policy{
		Name:      p.Name,
		validator: validating.NewValidator(validationFilter, matcher, noExpressions{}, messageFilter, p.Spec.FailurePolicy, nil),
		hasParams: hasParams,
	}
	if p.Spec.FailurePolicy != nil && *p.Spec.FailurePolicy == admissionregistrationv1.Ignore {
		c.passes = validating.NewValidator(validationFilter, matcher, noExpressions{}, noExpressions{}, p.Spec.FailurePolicy, nil)
	}
	return c, nil
}

// noExpressions is a filter of no expressions that does not build the
// activation the API server's empty filter builds (the request's objects
// converted once more): for the audit annotations, which the guard's
// policies do not write, and for the messages on the passing run.
type noExpressions struct{}

func (noExpressions) ForInput(_ context.Context, _ *admission.VersionedAttributes, _ *admissionv1.AdmissionRequest,
	_ plugincel.OptionalVariableBindings, _ *corev1.Namespace, budget int64) ([]plugincel.EvaluationResult, int64, error) {
	return nil, budget, nil
}

func (noExpressions) CompilationErrors() []error { return nil }

// newCompiler is the API server's compiler for a policy's expressions, with
// its variables compiled and stored, and the declarations they were
// compiled with: the strict-cost base environment of the default
// compatibility version, as both policy plugins use.
func newCompiler(variables []admissionregistrationv1.Variable, hasParams bool) (*plugincel.CompositedCompiler, plugincel.OptionalVariableDeclarations, error) {
	vars := plugincel.OptionalVariableDeclarations{HasParams: hasParams, HasAuthorizer: true}
	compiler, err := plugincel.NewCompositedCompiler(environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()))
	if err != nil {
		return nil, vars, err
	}
	named := make([]plugincel.NamedExpressionAccessor, len(variables))
	for i, v := range variables {
		named[i] = &validating.Variable{Name: v.Name, Expression: v.Expression}
	}
	compiler.CompileAndStoreVariables(named, vars, environment.StoredExpressions)
	return compiler, vars, nil
}

// compileMatcher compiles a policy's match conditions as the policy plugins
// do; nil when it has none.
func compileMatcher(compiler *plugincel.CompositedCompiler, vars plugincel.OptionalVariableDeclarations,
	conditions []admissionregistrationv1.MatchCondition, failurePolicy *admissionregistrationv1.FailurePolicyType, name string) (matchconditions.Matcher, error) {
	if len(conditions) == 0 {
		return nil, nil
	}
	conds := make([]plugincel.ExpressionAccessor, len(conditions))
	for i := range conditions {
		conds[i] = (*matchconditions.MatchCondition)(&conditions[i])
	}
	filter := compiler.CompileCondition(conds, vars, environment.StoredExpressions)
	if err := compileErrors(filter); err != nil {
		return nil, fmt.Errorf("match conditions: %w", err)
	}
	return matchconditions.NewMatcher(filter, failurePolicy, "policy", "validate", name), nil
}

// compileErrors gathers the compilation errors of filters.
func compileErrors(filters ...plugincel.ConditionEvaluator) error {
	var msgs []string
	for _, f := range filters {
		c, ok := f.(interface{ CompilationErrors() []error })
		if !ok {
			continue
		}
		for _, err := range c.CompilationErrors() {
			msgs = append(msgs, err.Error())
		}
	}
	if len(msgs) > 0 {
		return fmt.Errorf("%s", strings.Join(msgs, "; "))
	}
	return nil
}

// Request is one admission of a Deployment, as the policy sees it.
type Request struct {
	Operation admission.Operation
	// Object is nil on DELETE, OldObject on CREATE.
	Object, OldObject *appsv1.Deployment
	Namespace, Name   string
	User              user.Info
	DryRun            bool
	// Params is the params object of the binding (nil: none).
	Params runtime.Object
	// NamespaceObject is the request's namespace, as `namespaceObject`.
	NamespaceObject *corev1.Namespace
}

// Decision is what one validation decided.
type Decision struct {
	// Denied is set when the validation failed (the binding's actions say
	// whether that refuses, warns or audits); Error when it could not be
	// evaluated.
	Denied, Error bool
	Message       string
	// Reason is the validation's reason (Invalid unless it says otherwise).
	Reason metav1.StatusReason
}

// Evaluate runs the policy on r and returns the decisions of the
// validations that did not pass; none when the match conditions exclude r.
func (p *Policy) Evaluate(ctx context.Context, r Request) []Decision {
	in, err := inputOf(r)
	if err != nil {
		return []Decision{{Error: true, Message: err.Error()}}
	}
	return p.evaluate(ctx, in)
}

// input is a request as the evaluator reads it: the objects unstructured,
// converted once for every policy that reads them.
type input struct {
	attrs     *admission.VersionedAttributes
	params    runtime.Object
	namespace *corev1.Namespace
}

func inputOf(r Request) (input, error) {
	var obj, old, params runtime.Object
	var err error
	if r.Object != nil {
		if obj, err = toUnstructured(r.Object); err != nil {
			return input{}, err
		}
	}
	if r.OldObject != nil {
		if old, err = toUnstructured(r.OldObject); err != nil {
			return input{}, err
		}
	}
	if r.Params != nil {
		if params, err = toUnstructured(r.Params); err != nil {
			return input{}, err
		}
	}
	gvk := appsv1.SchemeGroupVersion.WithKind("Deployment")
	attrs := admission.NewAttributesRecord(obj, old, gvk, r.Namespace, r.Name, deployments, "", r.Operation, nil, r.DryRun, r.User)
	return input{
		attrs:     &admission.VersionedAttributes{Attributes: attrs, VersionedKind: gvk, VersionedObject: obj, VersionedOldObject: old},
		params:    params,
		namespace: r.NamespaceObject,
	}, nil
}

var deployments = appsv1.SchemeGroupVersion.WithResource("deployments")

// toUnstructured converts o as the API server hands objects to CEL; an
// object already unstructured is used as it is.
func toUnstructured(o runtime.Object) (runtime.Object, error) {
	if u, ok := o.(*unstructured.Unstructured); ok {
		return u, nil
	}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o)
	if err != nil {
		return nil, fmt.Errorf("cannot read the object: %w", err)
	}
	return &unstructured.Unstructured{Object: m}, nil
}

// evaluate runs the policy. The API server's validator evaluates every
// message expression on every request, the variables they read again with
// them, and most requests pass. So a policy whose failurePolicy is Ignore
// is first run without its messages, and in full only when a validation did
// not pass. That answers as the full run does
// (TestThePassingRunAnswersAsTheFullRun) but in one case: message
// expressions that exhaust the cost budget the validations left (or fail
// inside CEL) turn every validation of the full run into an error, where the
// passing run returns nothing. Under Ignore the API server admits either way,
// and nativeChecks drops the errors of Ignore policies.
func (p *Policy) evaluate(ctx context.Context, in input) []Decision {
	var params runtime.Object
	if p.hasParams {
		params = in.params
	}
	if p.passes != nil && admits(p.passes.Validate(ctx, deployments, in.attrs, params, in.namespace, celconfig.RuntimeCELCostBudget, nil)) {
		return nil
	}
	res := p.validator.Validate(ctx, deployments, in.attrs, params, in.namespace, celconfig.RuntimeCELCostBudget, nil)
	var out []Decision
	for _, d := range res.Decisions {
		switch d.Evaluation {
		case validating.EvalDeny:
			out = append(out, Decision{Denied: true, Message: d.Message, Reason: d.Reason})
		case validating.EvalError:
			out = append(out, Decision{Error: true, Message: d.Message})
		}
	}
	return out
}

// admits: every decision of res admits (there are none when the match
// conditions exclude the request).
func admits(res validating.ValidateResult) bool {
	for _, d := range res.Decisions {
		if d.Evaluation != validating.EvalAdmit {
			return false
		}
	}
	return true
}
