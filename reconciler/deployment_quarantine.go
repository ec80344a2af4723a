package reconciler

import (
	"context"
	"fmt"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/vocab"
)

// DefaultQuarantineLimit is how many failed template hashes a Deployment's
// quarantine list keeps; the oldest fall off first.
const DefaultQuarantineLimit = 10

// AddQuarantined returns the quarantine list with hash appended as the newest
// entry (moved there if already present), trimmed to the newest limit entries.
// A limit below 1 means DefaultQuarantineLimit. The input is not modified.
func AddQuarantined(list []string, hash string, limit int) []string {
	if limit < 1 {
		limit = DefaultQuarantineLimit
	}
	out := RemoveQuarantined(list, hash)
	out = append(out, hash)
	if len(out) > limit {
		out = out[len(out)-limit:]
	}
	return out
}

// RemoveQuarantined returns the quarantine list without hash. The input is not
// modified.
func RemoveQuarantined(list []string, hash string) []string {
	return slices.DeleteFunc(slices.Clone(list), func(h string) bool { return h == hash })
}

// FormatTemplateList is the annotation form of a quarantine list, the inverse of
// vocab.SplitList.
func FormatTemplateList(list []string) string {
	return strings.Join(list, ",")
}

// AlignQuarantineLabel sets or removes d's vocab.LabelQuarantined so that
// it says whether d has quarantined templates, and reports whether it
// changed d. The label is what routes a quarantined Deployment's updates to
// the failing-closed webhook entry: one without it is still judged by the
// guard while it is up, but not refused while it is down.
func AlignQuarantineLabel(d *appsv1.Deployment) bool {
	_, labelled := d.Labels[vocab.LabelQuarantined]
	want := vocab.Quarantined(d)
	switch {
	case want && d.Labels[vocab.LabelQuarantined] != vocab.LabelQuarantinedValue:
		setLabel(d, vocab.LabelQuarantined, vocab.LabelQuarantinedValue)
	case !want && labelled:
		delete(d.Labels, vocab.LabelQuarantined)
	default:
		return false
	}
	return true
}

// reconcileQuarantineLabel keeps the label in line with the quarantine
// list whoever changed the list or the label: a rollback of an earlier
// release, an annotation edited by hand, a whole-object update that left
// the label out. One write conditional on the resourceVersion read.
func (r *DeploymentReconciler) reconcileQuarantineLabel(ctx context.Context, d *appsv1.Deployment, _ []*appsv1.ReplicaSet) error {
	patch := client.MergeFromWithOptions(d.DeepCopy(), client.MergeFromWithOptimisticLock{})
	if !AlignQuarantineLabel(d) {
		return nil
	}
	if err := r.Client.Patch(ctx, d, patch, client.FieldOwner(FieldManager)); err != nil {
		return fmt.Errorf("labelling the quarantine: %w", err)
	}
	ctrl.LoggerFrom(ctx).V(1).Info("Quarantine label aligned with the quarantined templates",
		"label", vocab.LabelQuarantined, "quarantined", vocab.Quarantined(d))
	return nil
}
