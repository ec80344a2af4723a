package native

import (
	"context"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/utils/ptr"
)

func policy(v ...admissionregistrationv1.Validation) *admissionregistrationv1.ValidatingAdmissionPolicy {
	return &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "test"},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			Validations: v,
			MatchConditions: []admissionregistrationv1.MatchCondition{{
				Name: "not-the-namespace-controller", Expression: `request.userInfo.username != "system:serviceaccount:kube-system:namespace-controller"`,
			}},
		},
	}
}

func protected(annotations map[string]string) *appsv1.Deployment {
	return &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web", Annotations: annotations}}
}

// The evaluator answers as the API server's plugin does: the validation's
// messageExpression, the match conditions, errors on a policy that does not
// compile.
func TestEvaluate(t *testing.T) {
	p, err := Compile(policy(admissionregistrationv1.Validation{
		Expression:        `request.operation != "DELETE" || !has(oldObject.metadata.annotations) || oldObject.metadata.annotations[?"deployguard.io/protected"].orValue("") != "true"`,
		MessageExpression: `"Deployment " + oldObject.metadata.name + " is protected; lift it with kubectl annotate deployment " + oldObject.metadata.name + " deployguard.io/protected-"`,
	}))
	require.NoError(t, err)
	someone := &user.DefaultInfo{Name: "someone"}
	for _, tc := range []struct {
		name string
		r    Request
		want string
	}{
		{"a protected Deployment deleted", Request{Operation: admission.Delete, OldObject: protected(map[string]string{"deployguard.io/protected": "true"}), User: someone},
			"Deployment web is protected; lift it with kubectl annotate deployment web deployguard.io/protected-"},
		{"an unprotected one", Request{Operation: admission.Delete, OldObject: protected(nil), User: someone}, ""},
		{"the namespace controller", Request{Operation: admission.Delete, OldObject: protected(map[string]string{"deployguard.io/protected": "true"}),
			User: &user.DefaultInfo{Name: "system:serviceaccount:kube-system:namespace-controller"}}, ""},
		{"an update", Request{Operation: admission.Update, Object: protected(nil), OldObject: protected(map[string]string{"deployguard.io/protected": "true"}), User: someone}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.r.Namespace, tc.r.Name = "shop", "web"
			ds := p.Evaluate(context.Background(), tc.r)
			got := ""
			for _, d := range ds {
				require.False(t, d.Error, "evaluation error: %s", d.Message)
				got = d.Message
			}
			assert.Equal(t, tc.want, got)
		})
	}
	_, err = Compile(policy(admissionregistrationv1.Validation{Expression: `object.spec.nosuchfield +`}))
	if assert.Error(t, err, "a policy that does not compile") {
		assert.Contains(t, err.Error(), "test", "the error names the policy")
	}
}

// Params are read as the binding's params object: a ConfigMap here.
func TestEvaluateWithParams(t *testing.T) {
	pol := policy(admissionregistrationv1.Validation{
		Expression:        `!has(object.spec.revisionHistoryLimit) || object.spec.revisionHistoryLimit <= int(params.data.max)`,
		MessageExpression: `"revisionHistoryLimit " + string(object.spec.revisionHistoryLimit) + " is above " + params.data.max`,
	})
	pol.Spec.ParamKind = &admissionregistrationv1.ParamKind{APIVersion: "v1", Kind: "ConfigMap"}
	p, err := Compile(pol)
	require.NoError(t, err)
	limit := int32(50)
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web"}, Spec: appsv1.DeploymentSpec{RevisionHistoryLimit: &limit}}
	params := &corev1.ConfigMap{Data: map[string]string{"max": "10"}}
	ds := p.Evaluate(context.Background(), Request{Operation: admission.Create, Object: d, Namespace: "shop", Name: "web", User: &user.DefaultInfo{Name: "u"}, Params: params})
	if assert.Len(t, ds, 1, "decisions %+v", ds) {
		assert.Equal(t, "revisionHistoryLimit 50 is above 10", ds[0].Message)
	}
}

// BenchmarkEvaluate measures one evaluation of a two-validation policy with
// messageExpressions on a Deployment, as check and the audit would run the
// native rules in process.
func BenchmarkEvaluate(b *testing.B) {
	pol := policy(
		admissionregistrationv1.Validation{
			Expression:        `!has(object.spec.revisionHistoryLimit) || object.spec.revisionHistoryLimit <= 100`,
			MessageExpression: `"revisionHistoryLimit " + string(object.spec.revisionHistoryLimit) + " is above 100"`,
		},
		admissionregistrationv1.Validation{
			Expression:        `!has(object.spec.selector.matchLabels) || object.spec.selector.matchLabels.all(k, has(object.spec.template.metadata.labels) && k in object.spec.template.metadata.labels)`,
			MessageExpression: `"the selector does not select the template's labels"`,
		})
	p, err := Compile(pol)
	if err != nil {
		b.Fatal(err)
	}
	limit := int32(10)
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web"}, Spec: appsv1.DeploymentSpec{
		RevisionHistoryLimit: &limit,
		Selector:             &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
		Template:             corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "web", "version": "1"}}},
	}}
	r := Request{Operation: admission.Create, Object: d, Namespace: "shop", Name: "web", User: &user.DefaultInfo{Name: "u"}}
	b.ReportAllocs()
	for b.Loop() {
		if ds := p.Evaluate(context.Background(), r); len(ds) != 0 {
			b.Fatalf("decisions %+v", ds)
		}
	}
}

// advised are Deployments the warnings and bounds find something in: a
// Recreate strategy for 3 replicas, a revision history and a deadline out of
// bounds, a deadline under the minimum.
func advised() (recreate, outOfBounds, lowDeadline *appsv1.Deployment) {
	recreate = rolling(3, intstr.FromInt32(1), intstr.FromInt32(0))
	recreate.Spec.Strategy = appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType}
	outOfBounds = rolling(3, intstr.FromInt32(1), intstr.FromInt32(0))
	outOfBounds.Spec.RevisionHistoryLimit, outOfBounds.Spec.ProgressDeadlineSeconds = ptr.To[int32](500), ptr.To[int32](math.MaxInt32)
	lowDeadline = rolling(3, intstr.FromInt32(1), intstr.FromInt32(0))
	lowDeadline.Spec.ProgressDeadlineSeconds = ptr.To[int32](5)
	return recreate, outOfBounds, lowDeadline
}

// An Ignore policy is run first without its messages (Policy.evaluate): what
// it decides must be what the API server's validator decides in full, on
// requests that pass, that fail one or several validations, and that the
// guard's exemptions skip.
func TestThePassingRunAnswersAsTheFullRun(t *testing.T) {
	r, err := Load()
	require.NoError(t, err)
	recreate, outOfBounds, lowDeadline := advised()
	alice := &user.DefaultInfo{Name: "alice", Groups: []string{"system:authenticated"}}
	reqs := map[string]Request{
		"passes":           {Operation: admission.Create, Object: rolling(3, intstr.FromString("25%"), intstr.FromString("25%")), User: alice},
		"recreate":         {Operation: admission.Create, Object: recreate, User: alice},
		"out of bounds":    {Operation: admission.Create, Object: outOfBounds, User: alice},
		"deadline below":   {Operation: admission.Update, Object: lowDeadline, OldObject: recreate, User: alice},
		"exempt namespace": {Operation: admission.Create, Object: outOfBounds, User: alice, Namespace: "kube-system"},
		"the guard":        {Operation: admission.Update, Object: outOfBounds, OldObject: recreate, User: &user.DefaultInfo{Name: defaults.GuardUsername}},
		"a delete":         {Operation: admission.Delete, OldObject: outOfBounds, User: alice},
	}
	settings := defaults
	settings.ExemptNamespaces = []string{"kube-system"}
	failed := 0
	require.Nil(t, r.compiled[Refusals].passes, "the refusals fail closed: their errors refuse, so they are always run in full")
	for _, name := range []string{Warnings, Bounds} {
		p := r.compiled[name]
		require.NotNil(t, p.passes, "%s is an Ignore policy and has a passing run", name)
		full := *p
		full.passes = nil
		for what, req := range reqs {
			if req.Namespace == "" {
				req.Namespace = "shop"
			}
			req.Name, req.Params = "web", settings.Params().obj
			in, err := inputOf(req)
			require.NoError(t, err)
			got, want := p.evaluate(context.Background(), in), full.evaluate(context.Background(), in)
			assert.Equal(t, want, got, "%s, %s: the first, then the full run", name, what)
			failed += len(want)
		}
	}
	assert.GreaterOrEqual(t, failed, 4, "validations failed: fewer, and the requests no longer exercise the full run")
}

// TestTheJointPassingRunAnswersAsEachPolicy: the warnings and the bounds,
// asked for together, give what each gives alone, on requests that pass and
// requests that fail some of their validations; and they are joined (a
// variable one of them defines differently would quietly undo that).
func TestTheJointPassingRunAnswersAsEachPolicy(t *testing.T) {
	r, err := Load()
	require.NoError(t, err)
	require.NotNil(t, r.jointPasses([]string{Warnings, Bounds}), "the warnings and the bounds are not joined: a variable they share differs, or one is no longer Ignore")
	require.NotNil(t, r.jointPasses([]string{Refusals, Warnings, Bounds}), "the refusals do not join by their match condition")
	recreate, outOfBounds, lowDeadline := advised()
	noHistory := rolling(3, intstr.FromString("25%"), intstr.FromString("25%"))
	noHistory.Spec.RevisionHistoryLimit = ptr.To[int32](0)
	alice := &user.DefaultInfo{Name: "alice", Groups: []string{"system:authenticated", "ops"}}
	passes := rolling(3, intstr.FromString("25%"), intstr.FromString("25%"))
	reqs := map[string]Request{
		"passes":             {Operation: admission.Create, Object: passes, User: alice},
		"an update":          {Operation: admission.Update, Object: passes, OldObject: recreate, User: alice},
		"unchanged spec":     {Operation: admission.Update, Object: outOfBounds, OldObject: outOfBounds, User: alice},
		"recreate":           {Operation: admission.Create, Object: recreate, User: alice},
		"out of bounds":      {Operation: admission.Create, Object: outOfBounds, User: alice},
		"no history":         {Operation: admission.Create, Object: noHistory, User: alice},
		"deadline below":     {Operation: admission.Update, Object: lowDeadline, OldObject: recreate, User: alice},
		"exempt namespace":   {Operation: admission.Create, Object: outOfBounds, User: alice, Namespace: "kube-system"},
		"exempt group":       {Operation: admission.Create, Object: recreate, User: &user.DefaultInfo{Name: "bob", Groups: []string{"legacy"}}},
		"the guard":          {Operation: admission.Update, Object: outOfBounds, OldObject: recreate, User: &user.DefaultInfo{Name: defaults.GuardUsername}},
		"every replica down": {Operation: admission.Create, Object: rolling(3, intstr.FromString("25%"), intstr.FromString("100%")), User: alice},
	}
	settings := defaults
	settings.ExemptNamespaces, settings.ExemptGroups = []string{"kube-system"}, []string{"legacy"}
	params := settings.Params()
	found := 0
	for what, req := range reqs {
		if req.Namespace == "" {
			req.Namespace = "shop"
		}
		req.Name = "web"
		got := r.Evaluate(context.Background(), req, params, Warnings, Bounds)
		want := append(r.Evaluate(context.Background(), req, params, Warnings), r.Evaluate(context.Background(), req, params, Bounds)...)
		assert.Equal(t, want, got, "%s: together, then each alone", what)
		found += len(want)
		// With the refusals, which join by their match condition.
		got = r.Evaluate(context.Background(), req, params, Refusals, Warnings, Bounds)
		want = append(r.Evaluate(context.Background(), req, params, Refusals), want...)
		assert.Equal(t, want, got, "%s, with the refusals: together, then each alone", what)
	}
	assert.GreaterOrEqual(t, found, 5, "findings: fewer, and the requests no longer exercise the full runs")
}
