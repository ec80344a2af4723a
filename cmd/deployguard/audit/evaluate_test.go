package audit

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/deployguard/deployguard/policy"
	"github.com/deployguard/deployguard/reconciler/vocab"
	guardwebhook "github.com/deployguard/deployguard/webhook"
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
			"spec-checks/revision-history": ResultPass, "spec-checks/progress-deadline": ResultPass}},
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
		{"running a quarantined template", "enforce", sound(func(d *appsv1.Deployment) {
			d.Annotations = map[string]string{vocab.AnnotationQuarantinedTemplates: vocab.TemplateHash(&d.Spec.Template)}
		}), map[string]string{"quarantine/quarantined-template": ResultFail}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			eng, err := policy.New(policy.Options{})
			require.NoError(t, err)
			require.NoError(t, eng.Load(context.Background(), []policy.Source{{Name: "team.rego", Module: fmt.Sprintf(teamLabel, tt.mode)}}))
			e := &Evaluator{Options: &guardwebhook.Options{Quarantine: guardwebhook.QuarantineEnforce,
				RevisionHistoryBounds: guardwebhook.Range{Min: 1, Max: 100}, ProgressDeadlineBounds: guardwebhook.Range{Min: 60, Max: 3600}}, Engine: eng}
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
	e := &Evaluator{Options: &guardwebhook.Options{}, NamespaceLabels: func(_ context.Context, ns string) (map[string]string, error) {
		return labels[ns], nil
	}}
	assert.Empty(t, e.Evaluate(context.Background(), sound(func(d *appsv1.Deployment) { d.Namespace = "off" })))
	assert.NotEmpty(t, e.Evaluate(context.Background(), sound()))
}
