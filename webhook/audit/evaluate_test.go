package audit

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/deployguard/deployguard/policy"
	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/webhook/review"
)

const teamLabel = `# METADATA
# custom:
#   mode: %s
#   severity: high
#   category: Ownership
package deployguard.teamlabel

deny contains {"msg": "label team is required", "field": "metadata.labels.team"} if {
	not input.object.metadata.labels.team
}

warn contains "this is an audit" if {
	input.userInfo.username == "deployguard:audit"
	input.operation == "UPDATE"
	input.object.metadata.labels.team == "warn-me"
}
`

func sound(mut ...func(*appsv1.Deployment)) *appsv1.Deployment {
	replicas, history, deadline := int32(2), int32(10), int32(600)
	surge := intstr.FromString("25%")
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web", UID: "uid-web", Labels: map[string]string{"team": "a"}},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas, RevisionHistoryLimit: &history, ProgressDeadlineSeconds: &deadline,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType,
				RollingUpdate: &appsv1.RollingUpdateDeployment{MaxSurge: &surge, MaxUnavailable: &surge}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "web"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "web:1.0"}}},
			},
		},
	}
	for _, m := range mut {
		m(d)
	}
	return d
}

// TestEvaluate runs the webhook's pipeline on stored Deployments: a deny
// fails whatever the policy's mode, a warn warns, and a policy can tell the
// audit by its user.
func TestEvaluate(t *testing.T) {
	tests := []struct {
		name string
		mode string
		d    *appsv1.Deployment
		want map[string]string // "policy/rule" → result
	}{
		{"sound, enforce", "enforce", sound(), map[string]string{
			"deployguard.teamlabel/deny": ResultPass, "quarantine/quarantined-template": ResultPass,
			"spec-checks/selector": ResultPass, "spec-checks/strategy": ResultPass,
			"spec-checks/revision-history": ResultPass, "spec-checks/progress-deadline": ResultPass, "spec-checks/size": ResultPass}},
		{"no team label, audit mode", "audit", sound(func(d *appsv1.Deployment) { d.Labels = nil }), map[string]string{
			"deployguard.teamlabel/deny": ResultFail}},
		{"no team label, warn mode", "warn", sound(func(d *appsv1.Deployment) { d.Labels = nil }), map[string]string{
			"deployguard.teamlabel/deny": ResultFail}},
		{"the policy sees an audit", "enforce", sound(func(d *appsv1.Deployment) { d.Labels["team"] = "warn-me" }), map[string]string{
			"deployguard.teamlabel/warn": ResultWarn}},
		{"every replica down", "enforce", sound(func(d *appsv1.Deployment) {
			zero := intstr.FromInt32(0)
			d.Spec.Strategy.RollingUpdate.MaxSurge = &zero
			full := intstr.FromString("100%")
			d.Spec.Strategy.RollingUpdate.MaxUnavailable = &full
		}), map[string]string{"spec-checks/strategy": ResultFail}},
		{"more labels than the guard keeps (stored before the bound)", "enforce", sound(func(d *appsv1.Deployment) {
			for i := range 70 {
				d.Labels[fmt.Sprintf("team.example.com/l-%d", i)] = "v"
			}
		}), map[string]string{"spec-checks/size": ResultFail, "spec-checks/strategy": ResultPass}},
		{"running a quarantined template", "enforce", sound(func(d *appsv1.Deployment) {
			d.Annotations = map[string]string{vocab.AnnotationQuarantinedTemplates: vocab.TemplateHash(&d.Spec.Template)}
		}), map[string]string{"quarantine/quarantined-template": ResultFail}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			eng, err := policy.New(policy.Options{})
			require.NoError(t, err)
			require.NoError(t, eng.Load(context.Background(), []policy.Source{{Name: "team.rego", Module: fmt.Sprintf(teamLabel, tt.mode)}}))
			e := &Evaluator{Options: &review.Options{Quarantine: review.QuarantineEnforce,
				RevisionHistoryBounds: review.Range{Min: 1, Max: 100}, ProgressDeadlineBounds: review.Range{Min: 60, Max: 3600}}, Engine: eng}
			got := map[string]string{}
			for _, r := range e.Evaluate(context.Background(), tt.d) {
				got[r.Policy+"/"+r.Rule] = r.Result
				assert.Equal(t, "uid-web", string(r.Resource.UID))
				if r.Policy == "deployguard.teamlabel" {
					assert.Equal(t, "high", r.Severity)
					assert.Equal(t, "Ownership", r.Category)
				}
				if r.Result == ResultFail && r.Policy == "deployguard.teamlabel" {
					assert.Equal(t, "[policy teamlabel] metadata.labels.team: label team is required", r.Message)
				}
			}
			for k, v := range tt.want {
				assert.Equal(t, v, got[k], k)
			}
		})
	}
}

// TestEvaluateSkipsUnguardedNamespaces: the webhooks never see a namespace
// labelled deployguard.io/guard=disabled, nor does the audit.
func TestEvaluateSkipsUnguardedNamespaces(t *testing.T) {
	labels := map[string]map[string]string{"off": {vocab.LabelGuard: "disabled"}, "shop": {}}
	e := &Evaluator{Options: &review.Options{}, NamespaceLabels: func(_ context.Context, ns string) (map[string]string, error) {
		return labels[ns], nil
	}}
	assert.Empty(t, e.Evaluate(context.Background(), sound(func(d *appsv1.Deployment) { d.Namespace = "off" })))
	assert.NotEmpty(t, e.Evaluate(context.Background(), sound()))
}

// selecting is a Deployment of the namespace "shop" whose selector is sel
// and whose pods are labelled pods.
func selecting(name string, sel *metav1.LabelSelector, pods map[string]string) *appsv1.Deployment {
	return sound(func(d *appsv1.Deployment) {
		d.Name, d.UID = name, typesUID("uid-"+name)
		d.Spec.Selector, d.Spec.Template.Labels = sel, pods
	})
}

// TestEvaluateOverlaps: a stored Deployment whose selector and another's
// select each other's pods warns, naming the other, as admission warns on an
// update of either; a lookup the index cannot answer is an error, never a pass.
func TestEvaluateOverlaps(t *testing.T) {
	web := sound() // selector app=web, pods app=web
	api := selecting("api", &metav1.LabelSelector{MatchLabels: map[string]string{"app": "api"}}, map[string]string{"app": "api"})
	canary := selecting("web-canary", &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web", "track": "canary"}},
		map[string]string{"app": "web", "track": "canary"})
	either := selecting("web-or-web2", &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
		{Key: "app", Operator: metav1.LabelSelectorOpIn, Values: []string{"web", "web2"}}}}, map[string]string{"app": "web2"})
	leaving := selecting("web-old", &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}, map[string]string{"app": "web"})
	leaving.DeletionTimestamp = &metav1.Time{}
	res := Resource{Namespace: "shop", Name: "web", UID: "uid-web"}
	tests := []struct {
		name   string
		synced bool
		stored []*appsv1.Deployment
		want   []Result
	}{
		{"no overlap", true, []*appsv1.Deployment{web, api}, []Result{
			{Policy: PolicySpec, Rule: RuleOverlap, Result: ResultPass, Resource: res}}},
		{"its selector selects another's pods, and another's selector its pods", true, []*appsv1.Deployment{web, api, either, canary}, []Result{
			{Policy: PolicySpec, Rule: RuleOverlap, Result: ResultWarn, Field: "spec.selector", Resource: res,
				Message: `spec.selector: this Deployment's pods overlap with another Deployment's; this selector also selects the pods of Deployment "web-canary" (labels app=web,track=canary): ` +
					"add a label that tells the two apart, such as app.kubernetes.io/instance, to the template and the selector"},
			{Policy: PolicySpec, Rule: RuleOverlap, Result: ResultWarn, Field: "spec.selector", Resource: res,
				Message: `spec.selector: this Deployment's pods overlap with another Deployment's; these pods would be selected by Deployment "web-or-web2" (selector app in (web,web2)) too: ` +
					"add a label that tells the two apart, such as app.kubernetes.io/instance, to the template and the selector"},
		}},
		{"the other is being deleted", true, []*appsv1.Deployment{web, leaving}, []Result{
			{Policy: PolicySpec, Rule: RuleOverlap, Result: ResultPass, Resource: res}}},
		{"the index has not synced", false, []*appsv1.Deployment{web, canary}, []Result{
			{Policy: PolicySpec, Rule: RuleOverlap, Result: ResultError, Field: "spec.selector", Resource: res,
				Message: "spec.selector: could not look up the namespace's Deployments to check for overlapping selectors: the guard has not yet seen every Deployment; " +
					"the audit checks again when this Deployment changes and at the next full pass"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			idx := review.NewOverlapIndex(func() bool { return tt.synced })
			for _, d := range tt.stored {
				idx.Set(d)
			}
			e := &Evaluator{Options: &review.Options{Quarantine: review.QuarantineEnforce}, Overlaps: idx}
			var got []Result
			for _, r := range e.Evaluate(context.Background(), web) {
				if r.Rule == RuleOverlap {
					got = append(got, r)
				}
			}
			assert.Equal(t, tt.want, got)
		})
	}
	t.Run("without an overlap source, no overlap result", func(t *testing.T) {
		for _, r := range (&Evaluator{Options: &review.Options{}}).Evaluate(context.Background(), web) {
			assert.NotEqual(t, RuleOverlap, r.Rule)
		}
	})
}

// TestEvaluateDisruptionBudgets: a stored Deployment under a budget that
// allows no eviction at its replicas warns on spec.replicas, naming the
// budget; with room for one eviction it passes.
func TestEvaluateDisruptionBudgets(t *testing.T) {
	one := intstr.FromInt32(1)
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web"},
		Spec:       policyv1.PodDisruptionBudgetSpec{MinAvailable: &one, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}},
	}
	for _, tc := range []struct {
		replicas int32
		want     string
	}{{1, ResultWarn}, {2, ResultPass}} {
		t.Run(fmt.Sprintf("%d replicas", tc.replicas), func(t *testing.T) {
			web := sound(func(d *appsv1.Deployment) { d.Spec.Replicas = &tc.replicas })
			deps := review.NewOverlapIndex(nil)
			deps.Set(web)
			budgets := review.NewBudgetIndex(deps)
			budgets.Set(pdb)
			e := &Evaluator{Options: &review.Options{}, Overlaps: deps, Budgets: budgets}
			var got []Result
			for _, r := range e.Evaluate(context.Background(), web) {
				if r.Rule == "disruption-budget" {
					got = append(got, r)
				}
			}
			require.Len(t, got, 1)
			assert.Equal(t, tc.want, got[0].Result)
			if tc.want == ResultWarn {
				assert.Equal(t, "spec.replicas", got[0].Field)
				assert.Contains(t, got[0].Message, `PodDisruptionBudget "web" (minAvailable: 1) allows no eviction`)
			}
		})
	}
}
