package reconciler

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/vocab"
)

// The ledger is every fact the reconciler acts on about a Deployment: which
// ReplicaSets completed a rollout (known-good), which revision it rolled back
// and to what, which deadline and which fail-fast verdict it has decided
// about, and since when the new pods fail. It lives in one status condition
// of the Deployment (vocab.ConditionLedger), because a status condition is
// the one place on a Deployment that its tenants cannot write (the `edit`
// role has no deployments/status), that neither the Deployment controller
// (which copies annotations onto ReplicaSets) nor `kubectl rollout undo`
// (which copies a ReplicaSet's annotations onto the Deployment) carries
// anywhere, and that a create cannot bring (the API server drops the status
// of a create). The Deployment controller keeps condition types it does not
// own (calculateStatus copies them), and a Deployment deleted and created
// again by the same name starts with none: facts are bound to one
// Deployment's life. Annotations that said the same in earlier releases are
// read once, when the ledger is first written (AdoptLegacy), and never after.

// maxKnownGood bounds the ledger's known-good entries: upstream's default
// revisionHistoryLimit. Only the newest is ever a rollback target; the older
// ones tell a known-good newRS from one that never completed.
const maxKnownGood = 10

// KnownGoodEntry is a ReplicaSet whose rollout completed, as the guard saw it
// complete: its UID (a ReplicaSet deleted and created again by the same name
// is another one) and the hash of its pod template (vocab.TemplateHash; a
// template changed since is another one).
type KnownGoodEntry struct {
	ReplicaSet string    `json:"rs"`
	UID        types.UID `json:"uid"`
	Template   string    `json:"template"`
	Revision   int64     `json:"revision"`
	// At is when the guard saw the rollout complete (RFC 3339).
	At string `json:"at"`
}

// Ledger is the reconciler's record on one Deployment. The zero value is an
// empty ledger.
type Ledger struct {
	// KnownGood, oldest first; the last is the newest known-good ReplicaSet.
	KnownGood []KnownGoodEntry `json:"knownGood,omitempty"`
	// RolledBackRevision is the failed revision the guard last rolled back
	// from, RolledBackTo the ReplicaSet it restored. RolledBackTo goes when
	// the rollback no longer stands (DecideVerdict).
	RolledBackRevision int64  `json:"rolledBackRevision,omitempty"`
	RolledBackTo       string `json:"rolledBackTo,omitempty"`
	// RolledBackToTemplate is the hash of the template the rollback restored
	// (vocab.TemplateHash): the rollback stands while the Deployment runs it,
	// which the verdict webhook decides without reading anything.
	RolledBackToTemplate string `json:"rolledBackToTemplate,omitempty"`
	// FailFastRevision is the revision fail-fast has decided about.
	FailFastRevision int64 `json:"failFastRevision,omitempty"`
	// HandledDeadline is the lastTransitionTime (RFC 3339) of the newest
	// ProgressDeadlineExceeded condition decided about.
	HandledDeadline string `json:"handledDeadline,omitempty"`
	// FailingSince is "<RFC 3339> <ReplicaSet>": when failure evidence was
	// first seen on that ReplicaSet's new pods.
	FailingSince string `json:"failingSince,omitempty"`
	// Pending is a rollback decided and about to be written: recorded before
	// the template is restored, settled after (reconcilePending), so that a
	// guard stopped between the two finds out whether it happened.
	Pending *PendingRollback `json:"pending,omitempty"`
	// IgnoredTold: the guard has said, once, that this Deployment or its
	// ReplicaSets carry annotations it ignores (LegacyAnnotations).
	IgnoredTold bool `json:"ignoredTold,omitempty"`
}

// LegacyAnnotations are the annotations the guard ignores on Deployments and
// ReplicaSets: the facts earlier releases kept in them (read once, by
// AdoptLegacy), and the name under which the cache kept a template's hash.
// Whoever writes them, or whatever copies them, changes nothing.
var LegacyAnnotations = []string{
	vocab.LegacyAnnotationKnownGood, vocab.LegacyAnnotationKnownGoodHash, vocab.LegacyAnnotationKnownGoodRevision,
	vocab.LegacyAnnotationRolledBackRevision, vocab.LegacyAnnotationRolledBackTo, vocab.LegacyAnnotationFailFastRevision,
	vocab.LegacyAnnotationHandledDeadline, vocab.LegacyAnnotationFailingSince, vocab.Domain + "/cached-template-hash",
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

// PendingRollback is a rollback the guard is making: from FailedRevision to
// the ReplicaSet To, whose template hashes to Template, deciding the deadline
// Deadline (RFC 3339); FailFast when fail-fast declared the failure.
type PendingRollback struct {
	FailedRevision int64  `json:"failedRevision"`
	To             string `json:"to"`
	Template       string `json:"template"`
	Deadline       string `json:"deadline"`
	FailFast       bool   `json:"failFast,omitempty"`
}

func equalPending(a, b *PendingRollback) bool {
	return (a == nil && b == nil) || (a != nil && b != nil && *a == *b)
}

// settled returns the ledger with the pending rollback p recorded as made.
func (l Ledger) settled(p PendingRollback) Ledger {
	l.Pending = nil
	l.HandledDeadline = p.Deadline
	l.RolledBackRevision, l.RolledBackTo, l.RolledBackToTemplate, l.FailingSince = p.FailedRevision, p.To, p.Template, ""
	if p.FailFast {
		l.FailFastRevision = p.FailedRevision
	}
	return l
}

// ledgerReason is the ledger condition's reason.
const ledgerReason = "Recorded"

// ReadLedger returns the ledger on the Deployment's status, and whether there
// is one. A ledger that does not parse (only a holder of deployments/status
// can have written it) reads as present and empty, so that nothing older is
// adopted in its place.
func ReadLedger(d *appsv1.Deployment) (Ledger, bool) {
	c := ledgerCondition(&d.Status)
	if c == nil {
		return Ledger{}, false
	}
	var l Ledger
	if err := json.Unmarshal([]byte(c.Message), &l); err != nil {
		return Ledger{}, true
	}
	return l, true
}

func ledgerCondition(s *appsv1.DeploymentStatus) *appsv1.DeploymentCondition {
	for i := range s.Conditions {
		if s.Conditions[i].Type == vocab.ConditionLedger {
			return &s.Conditions[i]
		}
	}
	return nil
}

// SetLedger writes l into the status, and reports whether that changed it.
func SetLedger(s *appsv1.DeploymentStatus, l Ledger, now time.Time) bool {
	b, err := json.Marshal(l)
	if err != nil {
		return false // plain strings and numbers: never
	}
	if c := ledgerCondition(s); c != nil && c.Status == corev1.ConditionTrue && c.Reason == ledgerReason && c.Message == string(b) {
		return false
	}
	setCondition(s, appsv1.DeploymentCondition{
		Type: vocab.ConditionLedger, Status: corev1.ConditionTrue, Reason: ledgerReason, Message: string(b),
	}, now)
	return true
}

// RemoveLedger removes the ledger condition (uninstall), and reports whether
// there was one.
func RemoveLedger(s *appsv1.DeploymentStatus) bool {
	n := len(s.Conditions)
	s.Conditions = slices.DeleteFunc(s.Conditions, func(c appsv1.DeploymentCondition) bool { return c.Type == vocab.ConditionLedger })
	return len(s.Conditions) != n
}

// KnownGoodEntryOf returns the ledger's entry for rs, or nil: an entry of the
// same UID whose template is rs's template still. A ReplicaSet's annotations
// play no part.
func (l Ledger) KnownGoodEntryOf(rs *appsv1.ReplicaSet) *KnownGoodEntry {
	for i := range l.KnownGood {
		e := &l.KnownGood[i]
		if e.UID == rs.UID && e.ReplicaSet == rs.Name {
			if e.Template != templateHash(&rs.ObjectMeta, &rs.Spec.Template) {
				return nil
			}
			return e
		}
	}
	return nil
}

// IsKnownGood reports whether rs completed a rollout as the guard saw it, with
// the template it has now.
func (l Ledger) IsKnownGood(rs *appsv1.ReplicaSet) bool { return l.KnownGoodEntryOf(rs) != nil }

// Newest returns the newest known-good entry, or nil.
func (l Ledger) Newest() *KnownGoodEntry {
	if len(l.KnownGood) == 0 {
		return nil
	}
	return &l.KnownGood[len(l.KnownGood)-1]
}

// WithKnownGood returns the ledger with rs recorded as the newest known-good
// ReplicaSet (an earlier entry of the same ReplicaSet goes), bounded to
// maxKnownGood entries, oldest dropped.
func (l Ledger) WithKnownGood(rs *appsv1.ReplicaSet, revision int64, at time.Time) Ledger {
	out := l
	out.KnownGood = slices.DeleteFunc(slices.Clone(l.KnownGood), func(e KnownGoodEntry) bool { return e.UID == rs.UID })
	out.KnownGood = append(out.KnownGood, KnownGoodEntry{
		ReplicaSet: rs.Name, UID: rs.UID, Template: templateHash(&rs.ObjectMeta, &rs.Spec.Template),
		Revision: revision, At: at.UTC().Format(time.RFC3339),
	})
	if n := len(out.KnownGood); n > maxKnownGood {
		out.KnownGood = out.KnownGood[n-maxKnownGood:]
	}
	return out
}

// handledDeadlineTime is HandledDeadline as a time.
func (l Ledger) handledDeadlineTime() (time.Time, bool) {
	if l.HandledDeadline == "" {
		return time.Time{}, false
	}
	return parseTime(l.HandledDeadline)
}

// failingSinceOf reads FailingSince for the ReplicaSet named rs; zero when
// absent, unreadable or about another ReplicaSet.
func (l Ledger) failingSinceOf(rs string) time.Time {
	at, name, ok := strings.Cut(l.FailingSince, " ")
	if !ok || name != rs {
		return time.Time{}
	}
	t, _ := parseTime(at)
	return t
}

// FailingSinceValue renders FailingSince.
func FailingSinceValue(at time.Time, rs string) string {
	return at.UTC().Format(time.RFC3339) + " " + rs
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
func AdoptLegacy(d *appsv1.Deployment, rss []*appsv1.ReplicaSet, cutoff time.Time) (Ledger, bool) {
	if cutoff.IsZero() || !d.CreationTimestamp.Time.Before(cutoff) {
		return Ledger{}, false
	}
	var l Ledger
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
		rev, err := Revision(rs)
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
		if t, ok := parseTime(at); ok {
			l.FailingSince = FailingSinceValue(t, rs)
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
func (r *DeploymentReconciler) updateLedger(ctx context.Context, d *appsv1.Deployment, change func(Ledger) Ledger) (bool, error) {
	if r.Installed != nil {
		// Uninstalled while this replica still runs: `deployguard
		// uninstall` removes every ledger, and none comes back.
		if installed, err := r.Installed(ctx); err != nil || !installed {
			return false, err
		}
	}
	for attempt := 1; ; attempt++ {
		l, _ := ReadLedger(d)
		patch := client.MergeFromWithOptions(d.DeepCopy(), client.MergeFromWithOptimisticLock{})
		if !SetLedger(&d.Status, change(l), r.Clock.Now()) {
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
