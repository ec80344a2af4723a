// Package exception is the PolicyException: a platform team's grant that
// lets named Deployments through named policies and spec checks until a
// date. The webhooks, `deployguard check` and the audit read exceptions from
// one Index and apply them with the same clock, so that all three agree on
// what an exception covers and stop applying it together at its expiry.
package exception

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion of the PolicyException API.
var GroupVersion = schema.GroupVersion{Group: "deployguard.io", Version: "v1alpha1"}

// Kind of the object.
const Kind = "PolicyException"

// PolicyException exempts the Deployments it matches from the policies and
// spec checks it names, until ExpiresAt.
type PolicyException struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              Spec `json:"spec"`
}

// Spec is what an exception covers, for how long and on whose word.
type Spec struct {
	Match Match `json:"match"`
	// Policies are Rego policies by name (the file's package without
	// "deployguard."), e.g. "resources".
	Policies []string `json:"policies,omitempty"`
	// Checks are refusable spec checks by rule: revision-history,
	// progress-deadline, disruption-budget. The invariants are out of reach.
	Checks []string `json:"checks,omitempty"`
	// ExpiresAt is when the exception stops applying, everywhere at once.
	ExpiresAt metav1.Time `json:"expiresAt"`
	// Owner answers for the exception; Reason says why, with a ticket.
	Owner  string `json:"owner"`
	Reason string `json:"reason"`
}

// Match is the scope: the Deployments of one namespace, all of them or those
// named or those the selector selects by their labels.
type Match struct {
	Namespace string                `json:"namespace"`
	Names     []string              `json:"names,omitempty"`
	Selector  *metav1.LabelSelector `json:"selector,omitempty"`
}

// PolicyExceptionList is a list of PolicyExceptions.
type PolicyExceptionList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []PolicyException `json:"items"`
}

// AddToScheme registers the types.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &PolicyException{}, &PolicyExceptionList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}

// DeepCopy copies e.
func (e *PolicyException) DeepCopy() *PolicyException {
	if e == nil {
		return nil
	}
	out := *e
	e.DeepCopyInto(&out.ObjectMeta)
	out.Spec.Match.Names = append([]string(nil), e.Spec.Match.Names...)
	out.Spec.Match.Selector = e.Spec.Match.Selector.DeepCopy()
	out.Spec.Policies = append([]string(nil), e.Spec.Policies...)
	out.Spec.Checks = append([]string(nil), e.Spec.Checks...)
	e.Spec.ExpiresAt.DeepCopyInto(&out.Spec.ExpiresAt)
	return &out
}

// DeepCopyObject implements runtime.Object.
func (e *PolicyException) DeepCopyObject() runtime.Object { return e.DeepCopy() }

// DeepCopyObject implements runtime.Object.
func (l *PolicyExceptionList) DeepCopyObject() runtime.Object {
	if l == nil {
		return nil
	}
	out := *l
	l.DeepCopyInto(&out.ListMeta)
	out.Items = make([]PolicyException, len(l.Items))
	for i := range l.Items {
		out.Items[i] = *l.Items[i].DeepCopy()
	}
	return &out
}
