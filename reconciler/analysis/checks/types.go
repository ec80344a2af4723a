// Package checks is the API of metric checks: the platform's
// ClusterDeploymentCheck and a team's DeploymentCheck (deployguard.io/v1alpha1),
// their validation (shared by the guard's webhook and its reconciler) and
// which of them select a Deployment. Deciding what a measurement means is
// package analysis's; querying Prometheus is package prom's.
package checks

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/deployguard/deployguard/reconciler/analysis"
)

// GroupVersion of the checks' API.
var GroupVersion = schema.GroupVersion{Group: "deployguard.io", Version: "v1alpha1"}

// Kinds.
const (
	ClusterKind    = "ClusterDeploymentCheck"
	NamespacedKind = "DeploymentCheck"
)

// ClusterDeploymentCheck is the platform's: it selects Deployments in every
// namespace its namespaceSelector selects, and its queries are not scoped
// (the platform may measure, say, an ingress controller's view of a
// Service). Only a cluster-scoped role can write one; tenants hold none.
type ClusterDeploymentCheck struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              ClusterSpec `json:"spec"`
}

// ClusterSpec selects Deployments and says how they are measured.
type ClusterSpec struct {
	// NamespaceSelector selects the namespaces; nil selects every one (the
	// guard's ignored namespaces aside).
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`
	Spec              `json:",inline"`
}

// DeploymentCheck is a team's: it selects Deployments of its own namespace
// only, and each of its queries is scoped to that namespace
// (promscope.EnforceNamespace), so it reads no other namespace's series.
type DeploymentCheck struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              Spec `json:"spec"`
}

// Spec is what both kinds share.
type Spec struct {
	// Selector selects Deployments by their labels; nil or empty selects
	// every Deployment (of the namespaces selected).
	Selector *metav1.LabelSelector `json:"selector,omitempty"`
	// BakeWindow is how long after a rollout completes its new revision is
	// still measured before it is recorded known-good. Nil means the
	// guard's default (checks.bakeWindow); the longest of the checks that
	// select a Deployment applies.
	BakeWindow *metav1.Duration `json:"bakeWindow,omitempty"`
	// Metrics are measured on each new revision, with Argo Rollouts'
	// AnalysisTemplate metric fields and semantics (package analysis); the
	// query is the Prometheus provider's, moved up one level.
	Metrics []analysis.Metric `json:"metrics"`
}

// ClusterDeploymentCheckList is a list of ClusterDeploymentChecks.
type ClusterDeploymentCheckList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ClusterDeploymentCheck `json:"items"`
}

// DeploymentCheckList is a list of DeploymentChecks.
type DeploymentCheckList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []DeploymentCheck `json:"items"`
}

// AddToScheme registers the types.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &ClusterDeploymentCheck{}, &ClusterDeploymentCheckList{},
		&DeploymentCheck{}, &DeploymentCheckList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}

// DeepCopyInto copies s into out.
func (s *Spec) DeepCopyInto(out *Spec) {
	*out = *s
	out.Selector = s.Selector.DeepCopy()
	if s.BakeWindow != nil {
		b := *s.BakeWindow
		out.BakeWindow = &b
	}
	out.Metrics = make([]analysis.Metric, len(s.Metrics))
	for i := range s.Metrics {
		out.Metrics[i] = s.Metrics[i].DeepCopy()
	}
}

// DeepCopy copies c.
func (c *ClusterDeploymentCheck) DeepCopy() *ClusterDeploymentCheck {
	if c == nil {
		return nil
	}
	out := *c
	c.DeepCopyInto(&out.ObjectMeta)
	out.Spec.NamespaceSelector = c.Spec.NamespaceSelector.DeepCopy()
	c.Spec.DeepCopyInto(&out.Spec.Spec)
	return &out
}

// DeepCopyObject implements runtime.Object.
func (c *ClusterDeploymentCheck) DeepCopyObject() runtime.Object { return c.DeepCopy() }

// DeepCopy copies c.
func (c *DeploymentCheck) DeepCopy() *DeploymentCheck {
	if c == nil {
		return nil
	}
	out := *c
	c.DeepCopyInto(&out.ObjectMeta)
	c.Spec.DeepCopyInto(&out.Spec)
	return &out
}

// DeepCopyObject implements runtime.Object.
func (c *DeploymentCheck) DeepCopyObject() runtime.Object { return c.DeepCopy() }

// DeepCopyObject implements runtime.Object.
func (l *ClusterDeploymentCheckList) DeepCopyObject() runtime.Object {
	if l == nil {
		return nil
	}
	out := *l
	l.DeepCopyInto(&out.ListMeta)
	out.Items = make([]ClusterDeploymentCheck, len(l.Items))
	for i := range l.Items {
		out.Items[i] = *l.Items[i].DeepCopy()
	}
	return &out
}

// DeepCopyObject implements runtime.Object.
func (l *DeploymentCheckList) DeepCopyObject() runtime.Object {
	if l == nil {
		return nil
	}
	out := *l
	l.DeepCopyInto(&out.ListMeta)
	out.Items = make([]DeploymentCheck, len(l.Items))
	for i := range l.Items {
		out.Items[i] = *l.Items[i].DeepCopy()
	}
	return &out
}
