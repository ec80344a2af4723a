package reconciler

import (
	"context"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/vocab"
)

// IsComplete reports whether the Deployment's latest rollout has completed, in
// the sense of upstream DeploymentComplete and as the Deployment controller has
// recorded it: Progressing=True with reason NewReplicaSetAvailable, the current
// generation observed, and every desired replica updated and available with no
// old replica left (status.replicas counts the pods of all ReplicaSets, so
// replicas == updatedReplicas means the old ones are gone).
func IsComplete(d *appsv1.Deployment) bool {
	cond := progressingCondition(d)
	if cond == nil || cond.Status != corev1.ConditionTrue || cond.Reason != vocab.NewReplicaSetAvailable {
		return false
	}
	if d.Status.ObservedGeneration != d.Generation {
		return false
	}
	desired := desiredReplicas(d)
	s := d.Status
	return s.UpdatedReplicas == desired && s.AvailableReplicas == desired && s.Replicas == s.UpdatedReplicas
}

// ReplicaSetToMark returns the newRS that has just proven its template, or nil.
// A paused Deployment proves nothing (its rollout is on hold), nor does one
// scaled to zero: no pod of the template ever had to become available.
// Whether the newRS is already marked is the caller's question (IsKnownGood).
func ReplicaSetToMark(d *appsv1.Deployment, rss []*appsv1.ReplicaSet) *appsv1.ReplicaSet {
	if d.Spec.Paused || desiredReplicas(d) == 0 || !IsComplete(d) {
		return nil
	}
	return FindNewReplicaSet(d, rss)
}

// IsKnownGood reports whether the ReplicaSet carries the guard's known-good mark,
// written on this very ReplicaSet. The Deployment controller copies Deployment
// annotations onto every new ReplicaSet, and `kubectl rollout undo` copies a
// ReplicaSet's annotations onto the Deployment; together they can carry a mark to
// a ReplicaSet that never completed. Such a copy names another ReplicaSet's
// pod-template-hash and is not a mark.
func IsKnownGood(rs *appsv1.ReplicaSet) bool {
	if _, ok := timeAnnotation(rs.Annotations, vocab.AnnotationKnownGood); !ok {
		return false
	}
	hash, ok := rs.Annotations[vocab.AnnotationKnownGoodHash]
	return ok && hash == rs.Labels[appsv1.DefaultDeploymentUniqueLabelKey]
}

// KnownGoodTarget returns the ReplicaSet to roll back to: the known-good one with
// the highest revision, other than the newRS (and other than any ReplicaSet with
// the Deployment's current template). It returns nil if there is none.
// ReplicaSets being deleted (revision history cleanup) are skipped: rolling back
// to one would race its deletion.
func KnownGoodTarget(d *appsv1.Deployment, rss []*appsv1.ReplicaSet) *appsv1.ReplicaSet {
	var (
		target         *appsv1.ReplicaSet
		targetRevision int64 = -1
	)
	for _, rs := range rss {
		if !IsKnownGood(rs) || rs.DeletionTimestamp != nil || sameTemplate(d, rs) {
			continue
		}
		v, err := Revision(rs)
		if err != nil {
			continue
		}
		if v > targetRevision {
			target, targetRevision = rs, v
		}
	}
	return target
}

// reconcileKnownGood marks the newRS known-good once its rollout completes, and
// records its revision on the Deployment. It writes nothing when both are already
// so. A template that completed is also taken out of the quarantine list: it has
// just proven itself.
func (r *DeploymentReconciler) reconcileKnownGood(ctx context.Context, d *appsv1.Deployment, rss []*appsv1.ReplicaSet) error {
	newRS := ReplicaSetToMark(d, rss)
	if newRS == nil {
		return nil
	}
	revision := newRS.Annotations[vocab.RevisionAnnotation]
	if revision == "" {
		// The Deployment controller sets it when it creates or adopts the newRS;
		// the ReplicaSet's update event brings us back.
		return nil
	}
	log := ctrl.LoggerFrom(ctx).WithValues("replicaSet", klog.KObj(newRS), "revision", revision)

	marked := false
	if !IsKnownGood(newRS) {
		rs := newRS.DeepCopy()
		patch := client.MergeFrom(newRS)
		if rs.Annotations == nil {
			rs.Annotations = map[string]string{}
		}
		rs.Annotations[vocab.AnnotationKnownGood] = r.Clock.Now().UTC().Format(time.RFC3339)
		rs.Annotations[vocab.AnnotationKnownGoodHash] = rs.Labels[appsv1.DefaultDeploymentUniqueLabelKey]
		if err := r.Client.Patch(ctx, rs, patch); err != nil {
			return fmt.Errorf("marking ReplicaSet %s known-good: %w", newRS.Name, err)
		}
		marked = true
		r.Metrics.knownGoodMarked.Inc()
		log.Info("Marked ReplicaSet known-good")
	}

	hash := templateHash(&d.ObjectMeta, &d.Spec.Template)
	quarantined := vocab.QuarantinedTemplates(d)
	unquarantined := RemoveQuarantined(quarantined, hash)
	if d.Annotations[vocab.AnnotationKnownGoodRevision] != revision || len(unquarantined) != len(quarantined) {
		patch := client.MergeFromWithOptions(d.DeepCopy(), client.MergeFromWithOptimisticLock{})
		if d.Annotations == nil {
			d.Annotations = map[string]string{}
		}
		d.Annotations[vocab.AnnotationKnownGoodRevision] = revision
		setOrDelete(d.Annotations, vocab.AnnotationQuarantinedTemplates, FormatTemplateList(unquarantined))
		AlignQuarantineLabel(d)
		if err := r.Client.Patch(ctx, d, patch); err != nil {
			return fmt.Errorf("recording known-good revision %s: %w", revision, err)
		}
		if len(unquarantined) != len(quarantined) {
			log.Info("Template completed; released from quarantine", "templateHash", hash)
		}
		marked = true
	}

	if marked {
		r.emitKnownGoodEvent(d, newRS, fmt.Sprintf("Revision %s (ReplicaSet %s) completed its rollout; recorded as known-good", revision, newRS.Name))
	}
	return nil
}
