package status

import (
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func budgetFor(name string, minAvailable int32, st policyv1.PodDisruptionBudgetStatus) policyv1.PodDisruptionBudget {
	m := intstr.FromInt32(minAvailable)
	return policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: name, Generation: 1},
		Spec:       policyv1.PodDisruptionBudgetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}, MinAvailable: &m},
		Status:     st,
	}
}

func webPod(ready bool) *corev1.Pod {
	s := corev1.ConditionFalse
	if ready {
		s = corev1.ConditionTrue
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web-1", Labels: map[string]string{"app": "web"}},
		Status:     corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: s}}},
	}
}

// The cases the API server's eviction handler tells apart.
func TestEvictionRefusal(t *testing.T) {
	healthy1 := policyv1.PodDisruptionBudgetStatus{ObservedGeneration: 1, CurrentHealthy: 1, DesiredHealthy: 1, ExpectedPods: 1}
	healthy3 := policyv1.PodDisruptionBudgetStatus{ObservedGeneration: 1, CurrentHealthy: 3, DesiredHealthy: 2, ExpectedPods: 3, DisruptionsAllowed: 1}
	short3 := policyv1.PodDisruptionBudgetStatus{ObservedGeneration: 1, CurrentHealthy: 2, DesiredHealthy: 2, ExpectedPods: 3}
	behind := healthy3
	behind.ObservedGeneration = 0
	for _, tc := range []struct {
		name    string
		pod     *corev1.Pod
		budgets []policyv1.PodDisruptionBudget
		refused bool
		never   bool
		want    string
	}{
		{"no budget", webPod(true), nil, false, false, ""},
		{"minAvailable 1 of 1 never allows one", webPod(true), []policyv1.PodDisruptionBudget{budgetFor("web", 1, healthy1)}, true, true, "run 2 pods or more"},
		{"a budget with room", webPod(true), []policyv1.PodDisruptionBudget{budgetFor("web", 2, healthy3)}, false, false, ""},
		{"a budget short of healthy pods, for now", webPod(true), []policyv1.PodDisruptionBudget{budgetFor("web", 2, short3)}, true, false, "once more pods are Ready"},
		{"an unready pod under a healthy budget goes", webPod(false), []policyv1.PodDisruptionBudget{budgetFor("web", 1, healthy1)}, false, false, ""},
		{"a status behind its spec", webPod(true), []policyv1.PodDisruptionBudget{budgetFor("web", 2, behind)}, true, false, "not counted its pods yet"},
		{"two budgets", webPod(true), []policyv1.PodDisruptionBudget{budgetFor("b", 2, healthy3), budgetFor("a", 2, healthy3)}, true, true, "(a, b)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, reason, never, refused := evictionRefusal(tc.pod, tc.budgets)
			assert.Equal(t, tc.refused, refused, "refused")
			assert.Equal(t, tc.never, never, "refused at any health")
			assert.Contains(t, reason, tc.want)
		})
	}
}
