package reconciler

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
)

// t0 is when the tests' rollouts start; conditions and marks are relative to it.
var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// deployment returns Deployment shop/web at generation 3, observed, running
// image web:v3 as revision 3 with 3 replicas.
func deployment(mods ...func(*appsv1.Deployment)) *appsv1.Deployment {
	d := &appsv1.Deployment{
		TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{
			Namespace:   "shop",
			Name:        "web",
			UID:         types.UID("uid-web"),
			Generation:  3,
			Annotations: map[string]string{vocab.RevisionAnnotation: "3"},
		},
		Spec: appsv1.DeploymentSpec{
			Replicas:                ptr.To[int32](3),
			ProgressDeadlineSeconds: ptr.To[int32](600),
			Selector:                &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Template:                podTemplate("web:v3"),
		},
		Status: appsv1.DeploymentStatus{ObservedGeneration: 3},
	}
	for _, m := range mods {
		m(d)
	}
	return d
}

func podTemplate(image string) corev1.PodTemplateSpec {
	return corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{
			Labels:      map[string]string{"app": "web"},
			Annotations: map[string]string{"team": "shop"},
		},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: image}}},
	}
}

// replicaSet returns a ReplicaSet controlled by d, of the given revision and
// image, created `revision` minutes after t0. Like the Deployment controller, it
// gives the template and the ReplicaSet the pod-template-hash label and copies the
// Deployment's annotations.
func replicaSet(d *appsv1.Deployment, revision int64, image string, mods ...func(*appsv1.ReplicaSet)) *appsv1.ReplicaSet {
	hash := fmt.Sprintf("h%d", revision)
	tmpl := podTemplate(image)
	tmpl.Labels[appsv1.DefaultDeploymentUniqueLabelKey] = hash
	rs := &appsv1.ReplicaSet{
		TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "ReplicaSet"},
		ObjectMeta: metav1.ObjectMeta{
			Namespace:         d.Namespace,
			Name:              d.Name + "-" + hash,
			UID:               types.UID("uid-rs-" + hash),
			CreationTimestamp: metav1.NewTime(t0.Add(time.Duration(revision) * time.Minute)),
			Labels:            map[string]string{"app": "web", appsv1.DefaultDeploymentUniqueLabelKey: hash},
			Annotations:       map[string]string{vocab.RevisionAnnotation: fmt.Sprint(revision)},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "apps/v1", Kind: "Deployment", Name: d.Name, UID: d.UID,
				Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
			}},
		},
		Spec: appsv1.ReplicaSetSpec{
			Replicas: ptr.To[int32](0),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web", appsv1.DefaultDeploymentUniqueLabelKey: hash}},
			Template: tmpl,
		},
	}
	for k, v := range d.Annotations {
		if !annotationsToSkip[k] {
			rs.Annotations[k] = v
		}
	}
	for _, m := range mods {
		m(rs)
	}
	return rs
}

// withKnownGood records the ReplicaSets in d's ledger as known-good, as the
// guard does when their rollouts complete, in the order given: the last is
// the newest. Each entry takes the ReplicaSet's revision, UID and template as
// they are now.
func withKnownGood(d *appsv1.Deployment, rss ...*appsv1.ReplicaSet) {
	l, _ := rollout.ReadLedger(d)
	for _, rs := range rss {
		rev, err := rollout.Revision(rs)
		if err != nil {
			panic(fmt.Sprintf("ReplicaSet %s: %v", rs.Name, err))
		}
		l = l.WithKnownGood(rs, rev, t0)
	}
	rollout.SetLedger(&d.Status, l, t0)
}

// withLedger is a Deployment modifier that changes its ledger (an empty one
// when it has none) as the guard would have written it.
func withLedger(change func(*rollout.Ledger)) func(*appsv1.Deployment) {
	return func(d *appsv1.Deployment) {
		l, _ := rollout.ReadLedger(d)
		change(&l)
		rollout.SetLedger(&d.Status, l, t0)
	}
}

// ledgerOf returns d's ledger, which must be there.
func ledgerOf(t *testing.T, d *appsv1.Deployment) rollout.Ledger {
	t.Helper()
	l, ok := rollout.ReadLedger(d)
	require.True(t, ok, "the Deployment has a ledger")
	return l
}

// legacyKnownGood writes the known-good mark an earlier release wrote on a
// ReplicaSet (or anyone may forge): its time and the ReplicaSet's own
// pod-template-hash.
func legacyKnownGood(rs *appsv1.ReplicaSet) {
	rs.Annotations[vocab.LegacyAnnotationKnownGood] = t0.Format(time.RFC3339)
	rs.Annotations[vocab.LegacyAnnotationKnownGoodHash] = rs.Labels[appsv1.DefaultDeploymentUniqueLabelKey]
}

// completed gives d the status of a finished rollout of its template.
func completed(d *appsv1.Deployment) {
	n := *d.Spec.Replicas
	d.Status.Replicas, d.Status.UpdatedReplicas, d.Status.ReadyReplicas, d.Status.AvailableReplicas = n, n, n, n
	setProgressing(d, appsv1.DeploymentCondition{
		Status: corev1.ConditionTrue, Reason: vocab.NewReplicaSetAvailable,
		Message:            fmt.Sprintf("ReplicaSet %q has successfully progressed.", d.Name+"-h3"),
		LastTransitionTime: metav1.NewTime(t0.Add(5 * time.Minute)),
	})
}

// failedAt gives d the status upstream writes when the rollout of ReplicaSet
// rsName exceeds its deadline at the given time: one new pod never ready, the old
// ones still serving.
func failedAt(rsName string, at time.Time) func(*appsv1.Deployment) {
	return func(d *appsv1.Deployment) {
		n := *d.Spec.Replicas
		d.Status.Replicas, d.Status.UpdatedReplicas, d.Status.ReadyReplicas, d.Status.AvailableReplicas = n+1, 1, n, n
		setProgressing(d, appsv1.DeploymentCondition{
			Status: corev1.ConditionFalse, Reason: vocab.ProgressDeadlineExceeded,
			Message:            fmt.Sprintf("ReplicaSet %q has timed out progressing.", rsName),
			LastUpdateTime:     metav1.NewTime(at),
			LastTransitionTime: metav1.NewTime(at),
		})
	}
}

// failed is failedAt the newRS of revision 3, at t0+20m.
func failed(d *appsv1.Deployment) { failedAt("web-h3", t0.Add(20*time.Minute))(d) }

func setProgressing(d *appsv1.Deployment, c appsv1.DeploymentCondition) {
	c.Type = appsv1.DeploymentProgressing
	if c.LastUpdateTime.IsZero() {
		c.LastUpdateTime = c.LastTransitionTime
	}
	for i := range d.Status.Conditions {
		if d.Status.Conditions[i].Type == appsv1.DeploymentProgressing {
			d.Status.Conditions[i] = c
			return
		}
	}
	d.Status.Conditions = append(d.Status.Conditions, c)
}

func annotate(kv ...string) func(*appsv1.Deployment) {
	return func(d *appsv1.Deployment) {
		for i := 0; i+1 < len(kv); i += 2 {
			d.Annotations[kv[i]] = kv[i+1]
		}
	}
}

func paused(d *appsv1.Deployment) { d.Spec.Paused = true }

// history returns the ReplicaSets of a Deployment rolled out three times: v1 and
// v2 completed and are known-good in d's ledger, v3 is the Deployment's
// template.
func history(d *appsv1.Deployment) (rs1, rs2, rs3 *appsv1.ReplicaSet) {
	rs1 = replicaSet(d, 1, "web:v1")
	rs2 = replicaSet(d, 2, "web:v2")
	rs3 = replicaSet(d, 3, "web:v3")
	withKnownGood(d, rs1, rs2)
	return rs1, rs2, rs3
}

// knownGoodNames lists the ReplicaSets of the ledger's known-good entries,
// oldest first.
func knownGoodNames(l rollout.Ledger) []string {
	var out []string
	for _, e := range l.KnownGood {
		out = append(out, e.ReplicaSet)
	}
	return out
}
