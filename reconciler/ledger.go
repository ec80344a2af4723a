package reconciler

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
)

// The reconciler's side of its ledger (rollout.Ledger, read and set by
// package rollout): an earlier release's annotations, adopted once, and the
// status patch that records a change.

// LegacyAnnotations are the annotations the guard ignores on Deployments and
// ReplicaSets: the facts earlier releases kept in them (read once, by
// AdoptLegacy), and the name under which the cache kept a template's hash.
// Whoever writes them, or whatever copies them, changes nothing.
var LegacyAnnotations = []string{
	vocab.LegacyAnnotationKnownGood, vocab.LegacyAnnotationKnownGoodHash, vocab.LegacyAnnotationKnownGoodRevision,
	vocab.LegacyAnnotationRolledBackRevision, vocab.LegacyAnnotationRolledBackTo, vocab.LegacyAnnotationFailFastRevision,
	vocab.LegacyAnnotationHandledDeadline, vocab.LegacyAnnotationFailingSince, rollout.CachedTemplateHash,
}

// ignoredAnnotations returns, sorted, the LegacyAnnotations on d and its
// ReplicaSets.
func ignoredAnnotations(d *appsv1.Deployment, rss []*appsv1.ReplicaSet) []string {
	found := map[string]bool{}
	for _, k := range LegacyAnnotations {
		if _, ok := d.Annotations[k]; ok {
			found[k] = true
		}
		for _, rs := range rss {
			if _, ok := rs.Annotations[k]; ok {
				found[k] = true
			}
		}
	}
	out := make([]string, 0, len(found))
	for k := range found {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func equalPending(a, b *rollout.PendingRollback) bool {
	return (a == nil && b == nil) || (a != nil && b != nil && *a == *b)
}

// AdoptLegacy builds the first ledger of a Deployment that has none from the
// annotations an earlier release kept (vocab's Legacy… names), so that a guard
// taking over from that release keeps its known-good history and pending
// decisions. It is read once: the caller writes the ledger it returns, and
// from then on the annotations are ignored. Only Deployments created before
// cutoff (when this release first ran in the cluster) are adopted from: a
// Deployment created since never had an earlier release's marks, so any it
// carries are copies or forgeries. A legacy known-good mark counts only on
// the ReplicaSet it was written on (its hash annotation names the
// ReplicaSet's own pod-template-hash), as the earlier release read it.
func AdoptLegacy(d *appsv1.Deployment, rss []*appsv1.ReplicaSet, cutoff time.Time) (rollout.Ledger, bool) {
	if cutoff.IsZero() || !d.CreationTimestamp.Time.Before(cutoff) {
		return rollout.Ledger{}, false
	}
	var l rollout.Ledger
	type marked struct {
		rs  *appsv1.ReplicaSet
		rev int64
		at  time.Time
	}
	var ms []marked
	for _, rs := range rss {
		at, ok := timeAnnotation(rs.Annotations, vocab.LegacyAnnotationKnownGood)
		if !ok || rs.Annotations[vocab.LegacyAnnotationKnownGoodHash] != rs.Labels[appsv1.DefaultDeploymentUniqueLabelKey] || !rs.CreationTimestamp.Time.Before(cutoff) {
			continue
		}
		rev, err := rollout.Revision(rs)
		if err != nil {
			continue
		}
		ms = append(ms, marked{rs, rev, at})
	}
	slices.SortStableFunc(ms, func(a, b marked) int { return int(a.rev - b.rev) })
	for _, m := range ms {
		l = l.WithKnownGood(m.rs, m.rev, m.at)
	}
	a := d.Annotations
	fmt.Sscan(a[vocab.LegacyAnnotationRolledBackRevision], &l.RolledBackRevision) //nolint:errcheck // absent or unreadable: none
	fmt.Sscan(a[vocab.LegacyAnnotationFailFastRevision], &l.FailFastRevision)     //nolint:errcheck // likewise
	if _, ok := timeAnnotation(a, vocab.LegacyAnnotationHandledDeadline); ok {
		l.HandledDeadline = a[vocab.LegacyAnnotationHandledDeadline]
	}
	if at, rs, ok := strings.Cut(a[vocab.LegacyAnnotationFailingSince], " "); ok {
		if t, ok := rollout.ParseTime(at); ok {
			l.FailingSince = rollout.FailingSinceValue(t, rs)
		}
	}
	l.RolledBackTo = a[vocab.LegacyAnnotationRolledBackTo]
	return l, true
}

// updateLedger applies change to the Deployment's ledger and writes it with a
// status patch conditional on the resourceVersion read. On a conflict (the
// Deployment controller writes status often) it reads the Deployment again
// from the API server and applies change again, so that a fact decided, once
// acted on, is recorded. d takes the result. It writes nothing, and reports
// false, when change changes nothing.
func (r *DeploymentReconciler) updateLedger(ctx context.Context, d *appsv1.Deployment, change func(rollout.Ledger) rollout.Ledger) (bool, error) {
	if r.Installed != nil {
		// Uninstalled while this replica still runs: `deployguard
		// uninstall` removes every ledger, and none comes back.
		if installed, err := r.Installed(ctx); err != nil || !installed {
			return false, err
		}
	}
	for attempt := 1; ; attempt++ {
		l, _ := rollout.ReadLedger(d)
		patch := client.MergeFromWithOptions(d.DeepCopy(), client.MergeFromWithOptimisticLock{})
		if !rollout.SetLedger(&d.Status, change(l), r.Clock.Now()) {
			return false, nil
		}
		err := r.Client.Status().Patch(ctx, d, patch)
		if err == nil {
			return true, nil
		}
		if !apierrors.IsConflict(err) || attempt == maxLedgerAttempts {
			return false, fmt.Errorf("recording the guard's ledger on the Deployment's status: %w", err)
		}
		fresh := &appsv1.Deployment{}
		if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(d), fresh); err != nil {
			return false, fmt.Errorf("reading Deployment %s: %w", d.Name, err)
		}
		*d = *fresh
	}
}

// maxLedgerAttempts bounds updateLedger's retries on conflicts.
const maxLedgerAttempts = 5
