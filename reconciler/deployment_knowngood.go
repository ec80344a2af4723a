package reconciler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
)

// IsComplete reports whether the Deployment's latest rollout has completed, in
// the sense of upstream DeploymentComplete and as the Deployment controller has
// recorded it: Progressing=True with reason NewReplicaSetAvailable, the current
// generation observed, and every desired replica updated and available with no
// old replica left (status.replicas counts the pods of all ReplicaSets, so
// replicas == updatedReplicas means the old ones are gone).
func IsComplete(d *appsv1.Deployment) bool {
	cond := rollout.ProgressingCondition(d)
	if cond == nil || cond.Status != corev1.ConditionTrue || cond.Reason != vocab.NewReplicaSetAvailable {
		return false
	}
	if d.Status.ObservedGeneration != d.Generation {
		return false
	}
	desired := rollout.Replicas(d)
	s := d.Status
	return s.UpdatedReplicas == desired && s.AvailableReplicas == desired && s.Replicas == s.UpdatedReplicas
}

// ReplicaSetToMark returns the newRS that has just proven its template, or nil.
// A paused Deployment proves nothing (its rollout is on hold), nor does one
// scaled to zero: no pod of the template ever had to become available.
// Whether the newRS is recorded already is the caller's question (IsKnownGood).
func ReplicaSetToMark(d *appsv1.Deployment, rss []*appsv1.ReplicaSet) *appsv1.ReplicaSet {
	if d.Spec.Paused || rollout.Replicas(d) == 0 || !IsComplete(d) {
		return nil
	}
	return rollout.FindNewReplicaSet(d, rss)
}

// IsKnownGood reports whether the ReplicaSet completed a rollout of the
// Deployment, as the guard's ledger records it (rollout.Ledger.IsKnownGood): the same
// ReplicaSet, with the same template. Nothing on the ReplicaSet counts: its
// annotations are the tenant's to write, and the Deployment controller copies
// the Deployment's onto it.
func IsKnownGood(d *appsv1.Deployment, rs *appsv1.ReplicaSet) bool {
	l, _ := rollout.ReadLedger(d)
	return l.IsKnownGood(rs)
}

// KnownGoodTarget returns the ReplicaSet to roll back to, or nil. See
// FindKnownGoodTarget.
func KnownGoodTarget(d *appsv1.Deployment, rss []*appsv1.ReplicaSet) *appsv1.ReplicaSet {
	t, _ := FindKnownGoodTarget(d, rss)
	return t
}

// FindKnownGoodTarget returns the ReplicaSet to roll back to: the one of the
// ledger's newest known-good entry. Only that one: when its ReplicaSet is
// gone, being deleted (a rollback to it would race the deletion), replaced
// (another UID) or its template changed since it completed, there is no
// target, and why says so. When the Deployment's template is that entry's
// already (the newest known-good revision is the one failing now, or its
// ReplicaSet was deleted and made again by the Deployment controller), there
// is no target either: a rollback could only go to an older entry. Falling
// back to an older entry would let whoever writes the Deployment's template or
// deletes or edits one ReplicaSet (a tenant may) choose which older template
// the guard restores under its own identity.
func FindKnownGoodTarget(d *appsv1.Deployment, rss []*appsv1.ReplicaSet) (target *appsv1.ReplicaSet, why string) {
	l, _ := rollout.ReadLedger(d)
	e := l.Newest()
	if e == nil {
		return nil, ""
	}
	if e.Template == rollout.TemplateHash(&d.Spec.Template) {
		return nil, fmt.Sprintf("the Deployment's template is already that of the newest known-good ReplicaSet %s (revision %d), and the guard never falls back to an older one", e.ReplicaSet, e.Revision)
	}
	for _, rs := range rss {
		if rs.Name != e.ReplicaSet {
			continue
		}
		switch {
		case rs.UID != e.UID:
			return nil, fmt.Sprintf("known-good ReplicaSet %s (revision %d) was deleted and created again since it completed", e.ReplicaSet, e.Revision)
		case rollout.TemplateHash(&rs.Spec.Template) != e.Template:
			return nil, fmt.Sprintf("the template of known-good ReplicaSet %s (revision %d) changed since it completed", e.ReplicaSet, e.Revision)
		case rs.DeletionTimestamp != nil:
			return nil, fmt.Sprintf("known-good ReplicaSet %s (revision %d) is being deleted", e.ReplicaSet, e.Revision)
		}
		return rs, ""
	}
	return nil, fmt.Sprintf("known-good ReplicaSet %s (revision %d) is gone", e.ReplicaSet, e.Revision)
}

// reconcileLedger writes the first ledger of a Deployment that existed before
// this release ran: adopted from an earlier release's annotations
// (AdoptLegacy), empty when there were none, so that annotations a tenant
// writes later are never adopted.
func (r *DeploymentReconciler) reconcileLedger(ctx context.Context, d *appsv1.Deployment, rss []*appsv1.ReplicaSet) error {
	if l, ok := rollout.ReadLedger(d); ok {
		return r.tellIgnored(ctx, d, rss, l)
	}
	adopted, ok := AdoptLegacy(d, rss, r.Options.LegacyCutoff)
	if !ok {
		return nil
	}
	if _, err := r.updateLedger(ctx, d, func(rollout.Ledger) rollout.Ledger { return adopted }); err != nil {
		return err
	}
	ctrl.LoggerFrom(ctx).Info("Adopted the rollout history an earlier release kept in annotations", "knownGood", len(adopted.KnownGood),
		"rolledBackRevision", adopted.RolledBackRevision, "failFastRevision", adopted.FailFastRevision)
	return nil
}

// tellIgnored says once per Deployment, with an Event and in the log, that
// it or its ReplicaSets carry annotations the guard ignores (a tenant's
// forgery, or copies of an earlier release's marks that upstream carried
// around), and records in the ledger that it was said. Only where the
// Deployment has a ledger already: before, they may still be adopted.
func (r *DeploymentReconciler) tellIgnored(ctx context.Context, d *appsv1.Deployment, rss []*appsv1.ReplicaSet, l rollout.Ledger) error {
	if l.IgnoredTold {
		return nil
	}
	ignored := ignoredAnnotations(d, rss)
	if len(ignored) == 0 {
		return nil
	}
	written, err := r.updateLedger(ctx, d, func(l rollout.Ledger) rollout.Ledger { l.IgnoredTold = true; return l })
	if err != nil || !written {
		return err
	}
	msg := fmt.Sprintf("Ignoring annotations %s on the Deployment or its ReplicaSets: the guard keeps what it acts on in its ledger (status condition %s), which no annotation changes. Remove them when convenient.",
		strings.Join(ignored, ", "), vocab.ConditionLedger)
	ctrl.LoggerFrom(ctx).Info("Deployment carries annotations the guard ignores", "annotations", ignored)
	r.Recorder.Eventf(d, nil, corev1.EventTypeNormal, vocab.ReasonAnnotationsIgnored, actionIgnore, "%s", msg)
	return nil
}

// reconcileKnownGood records the newRS as the newest known-good ReplicaSet in
// the ledger once its rollout completes. It writes nothing when it is so
// already. A template that completed is also taken out of the quarantine list:
// it has just proven itself.
func (r *DeploymentReconciler) reconcileKnownGood(ctx context.Context, d *appsv1.Deployment, rss []*appsv1.ReplicaSet) error {
	newRS := ReplicaSetToMark(d, rss)
	if newRS == nil {
		return nil
	}
	revision, err := rollout.Revision(newRS)
	if err != nil || revision == 0 {
		// The Deployment controller sets it when it creates or adopts the newRS;
		// the ReplicaSet's update event brings us back.
		return nil
	}
	log := ctrl.LoggerFrom(ctx).WithValues("replicaSet", klog.KObj(newRS), "revision", revision)

	l, _ := rollout.ReadLedger(d)
	marked := false
	tellConfig := func() {}
	if n := l.Newest(); n == nil || n.UID != newRS.UID || !l.IsKnownGood(newRS) || n.Revision != revision {
		live := map[types.UID]bool{}
		for _, rs := range rss {
			live[rs.UID] = true
		}
		// The config it ran with, kept before the mark that names it: a
		// guard stopped in between keeps it again on its next pass (the
		// snapshots are content-addressed, so nothing is duplicated).
		config, err := r.snapshotConfig(ctx, newRS)
		var tooMany *tooManyConfig
		switch {
		case errors.As(err, &tooMany):
		case err != nil:
			return fmt.Errorf("keeping the config of ReplicaSet %s: %w", newRS.Name, err)
		}
		changed, err := r.updateLedger(ctx, d, func(l rollout.Ledger) rollout.Ledger {
			// Entries of ReplicaSets gone (revision history) go too.
			l.KnownGood = slices.DeleteFunc(slices.Clone(l.KnownGood), func(e rollout.KnownGoodEntry) bool { return !live[e.UID] })
			return l.WithKnownGood(newRS, revision, r.Clock.Now()).WithConfig(newRS.UID, config)
		})
		if err != nil {
			return fmt.Errorf("recording ReplicaSet %s known-good: %w", newRS.Name, err)
		}
		if changed {
			marked = true
			r.Metrics.knownGoodMarked.Inc()
			log.Info("Recorded ReplicaSet known-good", "config", len(config))
			tellConfig = func() {
				why := ""
				if tooMany != nil {
					why = tooMany.why
				}
				r.tellConfigNotKept(d, newRS, revision, config, why)
			}
		}
	}

	hash := rollout.TemplateHash(&d.Spec.Template)
	quarantined := vocab.QuarantinedTemplates(d)
	unquarantined := RemoveQuarantined(quarantined, hash)
	if len(unquarantined) != len(quarantined) {
		patch := client.MergeFromWithOptions(d.DeepCopy(), client.MergeFromWithOptimisticLock{})
		setOrDelete(d.Annotations, vocab.AnnotationQuarantinedTemplates, FormatTemplateList(unquarantined))
		AlignQuarantineLabel(d)
		if err := r.Client.Patch(ctx, d, patch); err != nil {
			return fmt.Errorf("releasing the completed template from quarantine: %w", err)
		}
		log.Info("Template completed; released from quarantine", "templateHash", hash)
	}

	if marked {
		r.emitKnownGoodEvent(d, newRS, fmt.Sprintf("Revision %d (ReplicaSet %s) completed its rollout; recorded as known-good", revision, newRS.Name))
		tellConfig()
	}
	return nil
}
