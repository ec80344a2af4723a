package reconciler

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
)

// AlignFinalizers decides the guard's finalizers of a live Deployment: the
// cleanup steps its deployguard.io/cleanup annotation asks for, or the
// cluster's default (clusterDefault, as vocab.ParseCleanupSteps returns it).
// It returns the new list and whether it differs. An annotation that does not
// parse changes nothing: the validating webhook refuses it on the next write,
// with the reason.
func AlignFinalizers(d *appsv1.Deployment, clusterDefault []string) ([]string, bool) {
	want, err := vocab.DesiredFinalizers(d.Annotations, clusterDefault)
	if err != nil {
		return d.Finalizers, false
	}
	return vocab.WithGuardFinalizers(d.Finalizers, want)
}

// reconcileFinalizers keeps a live Deployment's cleanup finalizers what it asks
// for. The mutating webhook does the same on every write; this catches what it
// did not see: a Deployment written while it was down (its failure policy is
// Ignore), one created before the guard, a change of the cluster's default,
// and the finalizers an earlier version of the guard put on every Deployment.
// One write conditional on the resourceVersion read, so a concurrent change is
// decided again from a fresh read.
//
// Finalizers are added only while the guard is installed (r.Installed): the
// uninstall deletes the webhook configurations first, then removes the
// finalizers, and a guard still running meanwhile must not put them back.
// Removing is always right.
func (r *DeploymentReconciler) reconcileFinalizers(ctx context.Context, d *appsv1.Deployment, _ []*appsv1.ReplicaSet) error {
	next, changed := AlignFinalizers(d, r.Options.CleanupFinalizers)
	if !changed || !rollout.SpecObserved(d) {
		return nil
	}
	if adds := len(vocab.GuardFinalizers(next)) > len(vocab.GuardFinalizers(d.Finalizers)); adds && r.Installed != nil {
		installed, err := r.Installed(ctx)
		if err != nil {
			return fmt.Errorf("checking that the guard is installed: %w", err)
		}
		if !installed {
			ctrl.LoggerFrom(ctx).V(1).Info("Not adding cleanup finalizers: the guard's webhook configuration is gone (uninstall)")
			return nil
		}
	}
	before := vocab.GuardFinalizers(d.Finalizers)
	patch := client.MergeFromWithOptions(d.DeepCopy(), client.MergeFromWithOptimisticLock{})
	d.Finalizers = next
	if err := r.Client.Patch(ctx, d, patch); err != nil {
		return fmt.Errorf("setting the cleanup finalizers: %w", err)
	}
	ctrl.LoggerFrom(ctx).Info("Cleanup finalizers set to what the Deployment asks for",
		"reason", "CleanupFinalizersAligned", "before", before, "after", vocab.GuardFinalizers(d.Finalizers))
	return nil
}
