package reconciler

// What the phases share about a Deployment, its ReplicaSets and its
// annotations, beyond what package rollout reads from them (the newRS,
// revisions, conditions and the ledger, in upstream's words).

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
)

// newReplicaSetRecorded reports whether the Deployment controller has
// recorded the newRS of the Deployment's spec in its Progressing condition
// ("Created new replica set %q", "Found new replica set %q", "ReplicaSet %q
// is progressing."). It does so before it records the observed generation,
// in an update of its own: from then on a write of ours loses it nothing.
// The write that records the observed generation follows within
// milliseconds, and copies every condition: the guard's verdict webhook
// ends the rollback verdict in that write (rollout.VerdictDue), and the reconciler's
// own end is the fallback for when the webhook could not.
func newReplicaSetRecorded(d *appsv1.Deployment, rss []*appsv1.ReplicaSet) bool {
	newRS := rollout.FindNewReplicaSet(d, rss)
	c := rollout.ProgressingCondition(d)
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

// timeAnnotation reads the time in annotation key of m.
func timeAnnotation(m map[string]string, key string) (time.Time, bool) {
	v, ok := m[key]
	if !ok {
		return time.Time{}, false
	}
	return rollout.ParseTime(v)
}
