// Package rollout reads what the guard knows about a Deployment's rollout
// from the objects alone: its newRS and revisions, in upstream's words
// (k8s.io/kubernetes pkg/controller/deployment/util/deployment_util.go); the
// identity of its pod template, also once the cache has stripped it; the
// reconciler's ledger in its status; and the rollback verdict decided from
// that ledger. It calls nothing and imports no controller: the reconciler
// acts on what it reads, the status webhook ends a verdict with the same
// decision, and the CLI shows the same facts.
package rollout

import (
	"slices"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deployguard/deployguard/reconciler/vocab"
)

// FindNewReplicaSet returns the Deployment's newRS: the ReplicaSet whose template
// equals the Deployment's, ignoring the hash label (upstream's EqualIgnoreHash,
// by template hash: see SameTemplate). When several do (possible
// after cluster upgrades, kubernetes#40415) the oldest wins, as upstream. It
// returns nil when the Deployment controller has not created it yet. rss is not
// reordered.
func FindNewReplicaSet(d *appsv1.Deployment, rss []*appsv1.ReplicaSet) *appsv1.ReplicaSet {
	sorted := slices.Clone(rss)
	slices.SortStableFunc(sorted, compareByCreationTimestamp)
	for _, rs := range sorted {
		if SameTemplate(d, rs) {
			return rs
		}
	}
	return nil
}

// compareByCreationTimestamp orders ReplicaSets oldest first, then by name, as
// upstream's controller.ReplicaSetsByCreationTimestamp.
func compareByCreationTimestamp(a, b *appsv1.ReplicaSet) int {
	if a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return strings.Compare(a.Name, b.Name)
	}
	if a.CreationTimestamp.Before(&b.CreationTimestamp) {
		return -1
	}
	return 1
}

// Revision returns the object's revision annotation. A missing annotation is
// revision 0, as upstream.
func Revision(obj metav1.Object) (int64, error) {
	v, ok := obj.GetAnnotations()[vocab.RevisionAnnotation]
	if !ok {
		return 0, nil
	}
	return strconv.ParseInt(v, 10, 64)
}

// FormatRevision renders a revision as the annotation does.
func FormatRevision(v int64) string {
	return strconv.FormatInt(v, 10)
}

// SameTemplate is upstream's EqualIgnoreHash for a Deployment and one of its
// ReplicaSets, cached or not.
func SameTemplate(d *appsv1.Deployment, rs *appsv1.ReplicaSet) bool {
	return TemplateHash(&d.Spec.Template) == TemplateHash(&rs.Spec.Template)
}

// ProgressingCondition returns the Deployment's Progressing condition, or nil.
func ProgressingCondition(d *appsv1.Deployment) *appsv1.DeploymentCondition {
	for i := range d.Status.Conditions {
		if d.Status.Conditions[i].Type == appsv1.DeploymentProgressing {
			return &d.Status.Conditions[i]
		}
	}
	return nil
}

// Replicas is spec.replicas, defaulted to 1 as the API server does.
func Replicas(d *appsv1.Deployment) int32 {
	if d.Spec.Replicas == nil {
		return 1
	}
	return *d.Spec.Replicas
}

// SpecObserved reports whether the Deployment controller has seen the
// Deployment's spec. Until it has, it may be creating the newRS, and it
// records that (Progressing, reason NewReplicaSetCreated) in one status
// update; any write to the Deployment in between makes that update
// conflict, the next sync finds the ReplicaSet there already and never
// records it, and the new rollout then never times out (DeploymentTimedOut
// reads the old NewReplicaSetAvailable). Writes that can wait, wait: the
// controller's own status update brings the Deployment back.
func SpecObserved(d *appsv1.Deployment) bool { return d.Status.ObservedGeneration == d.Generation }

// SetCondition sets the condition of c.Type, as upstream's
// SetDeploymentCondition does: lastUpdateTime is now, and lastTransitionTime
// moves only when the status changes.
func SetCondition(s *appsv1.DeploymentStatus, c appsv1.DeploymentCondition, now time.Time) {
	c.LastUpdateTime = metav1.NewTime(now)
	c.LastTransitionTime = c.LastUpdateTime
	for i := range s.Conditions {
		if s.Conditions[i].Type != c.Type {
			continue
		}
		if s.Conditions[i].Status == c.Status {
			c.LastTransitionTime = s.Conditions[i].LastTransitionTime
		}
		s.Conditions[i] = c
		return
	}
	s.Conditions = append(s.Conditions, c)
}

// ParseTime reads a time the guard wrote, in its ledger or an annotation
// (RFC 3339). An unreadable one is no time at all: callers then decide as if
// it were absent.
func ParseTime(v string) (time.Time, bool) {
	t, err := time.Parse(time.RFC3339, v)
	return t, err == nil
}
