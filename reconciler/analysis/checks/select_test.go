package checks

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deployguard/deployguard/reconciler/analysis"
	"github.com/deployguard/deployguard/reconciler/analysis/promscope"
)

func metric(name, query string) analysis.Metric {
	return analysis.Metric{Name: name, Query: query, FailureCondition: "result[0] > 0.05"}
}

func TestSelect(t *testing.T) {
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "web", Labels: map[string]string{"tier": "web"}}}
	platform := ClusterDeploymentCheck{ObjectMeta: metav1.ObjectMeta{Name: "errors", UID: "p1"}, Spec: ClusterSpec{
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "a"}},
		Spec:              Spec{Metrics: []analysis.Metric{metric("rate", `sum(rate(x{namespace="other"}[1m]))`)}},
	}}
	otherNamespaces := ClusterDeploymentCheck{ObjectMeta: metav1.ObjectMeta{Name: "b-only", UID: "p2"}, Spec: ClusterSpec{
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "b"}},
		Spec:              Spec{Metrics: []analysis.Metric{metric("rate", "up")}},
	}}
	broken := ClusterDeploymentCheck{ObjectMeta: metav1.ObjectMeta{Name: "broken", UID: "p3"}, Spec: ClusterSpec{
		Spec: Spec{Metrics: []analysis.Metric{{Name: "x", Query: "up", FailureCondition: "result[0] >"}}},
	}}
	own := DeploymentCheck{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "mine", UID: "t1"}, Spec: Spec{
		Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "web"}},
		Metrics:  []analysis.Metric{metric("rate", `sum(rate(x[1m]))`)},
	}}
	elsewhere := DeploymentCheck{ObjectMeta: metav1.ObjectMeta{Namespace: "team-b", Name: "theirs", UID: "t2"}, Spec: Spec{
		Metrics: []analysis.Metric{metric("rate", "up")},
	}}
	lib := &Library{}
	ms, invalid := Select(d, map[string]string{"team": "a"}, lib,
		[]ClusterDeploymentCheck{otherNamespaces, broken, platform}, []DeploymentCheck{elsewhere, own})
	require.Len(t, ms, 2)
	assert.Equal(t, "ClusterDeploymentCheck/errors/rate", ms[0].Key(), "the platform's first")
	assert.Equal(t, "DeploymentCheck/mine/rate", ms[1].Key(), "the team's own, never another namespace's")
	require.Len(t, invalid, 1)
	assert.Equal(t, "broken", invalid[0].Name)

	// The platform's query is as written; the team's is scoped.
	q0, err := ms[0].Query.Render(varsOf("team-a"))
	require.NoError(t, err)
	assert.Contains(t, q0, `namespace="other"`)
	q1, err := ms[1].Query.Render(varsOf("team-a"))
	require.NoError(t, err)
	assert.Contains(t, q1, `namespace="team-a"`)

	// Compiled once per generation.
	again, _ := lib.Cluster(&platform)
	assert.Same(t, ms[0].Check, again[0].Check)
}

func TestDeepCopyIsIndependent(t *testing.T) {
	limit := int32(2)
	c := &ClusterDeploymentCheck{Spec: ClusterSpec{Spec: Spec{
		BakeWindow: &metav1.Duration{},
		Metrics:    []analysis.Metric{{Name: "a", FailureLimit: &limit}},
	}}}
	cp := c.DeepCopy()
	*cp.Spec.Metrics[0].FailureLimit = 5
	cp.Spec.Metrics[0].Name = "b"
	cp.Spec.BakeWindow.Duration = 7
	assert.Equal(t, int32(2), *c.Spec.Metrics[0].FailureLimit)
	assert.Equal(t, "a", c.Spec.Metrics[0].Name)
	assert.Zero(t, c.Spec.BakeWindow.Duration)
}

func varsOf(ns string) promscope.Vars {
	return promscope.Vars{Namespace: ns, Name: "web", PodTemplateHash: "5d8f9c7b6"}
}
