package reconciler

// Rollout helpers, in upstream's words (k8s.io/kubernetes
// pkg/controller/deployment/util/deployment_util.go): what the phases share
// about a Deployment, its ReplicaSets and its annotations.

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/deployguard/deployguard/reconciler/vocab"
)

// FindNewReplicaSet returns the Deployment's newRS: the ReplicaSet whose template
// equals the Deployment's, ignoring the hash label (upstream's EqualIgnoreHash,
// by template hash: see sameTemplate). When several do (possible
// after cluster upgrades, kubernetes#40415) the oldest wins, as upstream. It
// returns nil when the Deployment controller has not created it yet. rss is not
// reordered.
func FindNewReplicaSet(d *appsv1.Deployment, rss []*appsv1.ReplicaSet) *appsv1.ReplicaSet {
	sorted := slices.Clone(rss)
	slices.SortStableFunc(sorted, compareByCreationTimestamp)
	for _, rs := range sorted {
		if sameTemplate(d, rs) {
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

// sameTemplate is upstream's EqualIgnoreHash for a Deployment and one of its
// ReplicaSets, cached or not.
func sameTemplate(d *appsv1.Deployment, rs *appsv1.ReplicaSet) bool {
	return templateHash(&d.ObjectMeta, &d.Spec.Template) == templateHash(&rs.ObjectMeta, &rs.Spec.Template)
}

// progressingCondition returns the Deployment's Progressing condition, or nil.
func progressingCondition(d *appsv1.Deployment) *appsv1.DeploymentCondition {
	for i := range d.Status.Conditions {
		if d.Status.Conditions[i].Type == appsv1.DeploymentProgressing {
			return &d.Status.Conditions[i]
		}
	}
	return nil
}

// desiredReplicas is spec.replicas, defaulted to 1 as the API server does.
func desiredReplicas(d *appsv1.Deployment) int32 {
	if d.Spec.Replicas == nil {
		return 1
	}
	return *d.Spec.Replicas
}

// specObserved reports whether the Deployment controller has seen the
// Deployment's spec. Until it has, it may be creating the newRS, and it
// records that (Progressing, reason NewReplicaSetCreated) in one status
// update; any write to the Deployment in between makes that update
// conflict, the next sync finds the ReplicaSet there already and never
// records it, and the new rollout then never times out (DeploymentTimedOut
// reads the old NewReplicaSetAvailable). Writes that can wait, wait: the
// controller's own status update brings the Deployment back.
func specObserved(d *appsv1.Deployment) bool { return d.Status.ObservedGeneration == d.Generation }

// newReplicaSetRecorded reports whether the Deployment controller has
// recorded the newRS of the Deployment's spec in its Progressing condition
// ("Created new replica set %q", "Found new replica set %q", "ReplicaSet %q
// is progressing."). It does so before it records the observed generation,
// in an update of its own: from then on a write of ours loses it nothing.
// The write that records the observed generation follows within
// milliseconds, and copies every condition: the guard's verdict webhook
// ends the rollback verdict in that write (VerdictDue), and the reconciler's
// own end is the fallback for when the webhook could not.
func newReplicaSetRecorded(d *appsv1.Deployment, rss []*appsv1.ReplicaSet) bool {
	newRS := FindNewReplicaSet(d, rss)
	c := progressingCondition(d)
	return newRS != nil && c != nil && c.Status == corev1.ConditionTrue && c.Reason != vocab.NewReplicaSetAvailable &&
		strings.Contains(c.Message, strconv.Quote(newRS.Name))
}

// setLabel sets the label k of d to v.
func setLabel(d *appsv1.Deployment, k, v string) {
	if d.Labels == nil {
		d.Labels = map[string]string{}
	}
	d.Labels[k] = v
}

// setCondition sets the condition of c.Type, as upstream's
// SetDeploymentCondition does: lastUpdateTime is now, and lastTransitionTime
// moves only when the status changes.
func setCondition(s *appsv1.DeploymentStatus, c appsv1.DeploymentCondition, now time.Time) {
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

// removeCondition removes the condition of type t.
func removeCondition(s *appsv1.DeploymentStatus, t appsv1.DeploymentConditionType) {
	out := s.Conditions[:0]
	for _, c := range s.Conditions {
		if c.Type != t {
			out = append(out, c)
		}
	}
	s.Conditions = out
}

// selectorOf parses the Deployment's selector; a Deployment without one
// selects everything, as upstream's pod listing does.
func selectorOf(d *appsv1.Deployment) (labels.Selector, error) {
	if d.Spec.Selector == nil {
		return labels.Everything(), nil
	}
	s, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil {
		return nil, fmt.Errorf("parsing the selector of Deployment %s: %w", d.Name, err)
	}
	return s, nil
}

// setOrDelete sets m[k] = v, or deletes k when v is empty.
func setOrDelete(m map[string]string, k, v string) {
	if v == "" {
		delete(m, k)
		return
	}
	m[k] = v
}

// formatRevision renders a revision as the annotation does.
func formatRevision(v int64) string {
	return strconv.FormatInt(v, 10)
}

// parseTime reads a time the guard wrote in an annotation (RFC 3339). An
// unreadable one is no time at all: callers then decide as if it were absent.
func parseTime(v string) (time.Time, bool) {
	t, err := time.Parse(time.RFC3339, v)
	return t, err == nil
}

// timeAnnotation reads the time in annotation key of m.
func timeAnnotation(m map[string]string, key string) (time.Time, bool) {
	v, ok := m[key]
	if !ok {
		return time.Time{}, false
	}
	return parseTime(v)
}
