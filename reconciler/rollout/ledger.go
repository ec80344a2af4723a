package rollout

import (
	"encoding/json"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

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
// read once, when the ledger is first written (reconciler.AdoptLegacy), and never after.

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
	// Config is the config the revision ran with: for each ConfigMap (and,
	// where the platform turned it on, Secret) its template references, the
	// snapshot the guard kept of it when the rollout completed. A rollback
	// to this revision points the restored template at these snapshots
	// where the config drifted since (reconciler/snapshot).
	Config []ConfigSnapshot `json:"config,omitempty"`
}

// ConfigSnapshot is one config object a known-good revision references, as
// the guard found it when the rollout completed.
type ConfigSnapshot struct {
	// Kind is "ConfigMap" or "Secret"; Name the object the template names.
	Kind string `json:"kind"`
	Name string `json:"name"`
	// Snapshot is the immutable copy the guard keeps in the same namespace,
	// owned by the revision's ReplicaSet; Hash is the content hash of its
	// data (snapshot.ContentHash), recomputed from the data before it is
	// trusted. Snapshot equals Name when the template references a snapshot
	// already (a revision restored with its config).
	Snapshot string `json:"snapshot,omitempty"`
	Hash     string `json:"hash,omitempty"`
	// Absent: the object did not exist when the rollout completed (an
	// optional reference, or one deleted since the pods started).
	Absent bool `json:"absent,omitempty"`
	// Skipped says why no snapshot was kept (over the bound, refused by the
	// API server): a rollback restores the template alone for it.
	Skipped string `json:"skipped,omitempty"`
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
	// DeferredFor is "<ReplicaSet> <deadline's RFC 3339>": the newRS whose
	// rollback at that deadline is held for a transient failure (the
	// transient hold). The hold reads it, never the rollback-status
	// annotation, which only says it in words; a later deadline of the same
	// revision is never taken for one already held.
	DeferredFor string `json:"deferredFor,omitempty"`
	// Pending is a rollback decided and about to be written: recorded before
	// the template is restored, settled after (the reconciler's reconcilePending), so that a
	// guard stopped between the two finds out whether it happened.
	Pending *PendingRollback `json:"pending,omitempty"`
	// IgnoredTold: the guard has said, once, that this Deployment or its
	// ReplicaSets carry annotations it ignores (LegacyAnnotations).
	IgnoredTold bool `json:"ignoredTold,omitempty"`
	// Checks is what the metric checks measured of the newRS's revision
	// (CheckRun): kept here so that a restart or a new leader resumes the
	// tally, and so that a revision is recorded known-good only once its
	// bake window has passed.
	Checks *CheckRun `json:"checks,omitempty"`
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

// Settled returns the ledger with the pending rollback p recorded as made.
func (l Ledger) Settled(p PendingRollback) Ledger {
	l.Pending = nil
	l.HandledDeadline = p.Deadline
	l.RolledBackRevision, l.RolledBackTo, l.RolledBackToTemplate, l.FailingSince, l.DeferredFor = p.FailedRevision, p.To, p.Template, "", ""
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
	SetCondition(s, appsv1.DeploymentCondition{
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
			if e.Template != TemplateHash(&rs.Spec.Template) {
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
		ReplicaSet: rs.Name, UID: rs.UID, Template: TemplateHash(&rs.Spec.Template),
		Revision: revision, At: at.UTC().Format(time.RFC3339),
	})
	if n := len(out.KnownGood); n > maxKnownGood {
		out.KnownGood = out.KnownGood[n-maxKnownGood:]
	}
	for i := 0; i < len(out.KnownGood)-maxConfigEntries; i++ {
		out.KnownGood[i].Config = nil
	}
	return out
}

// maxConfigEntries is how many of the newest known-good entries keep their
// Config. A rollback restores the newest entry whose template is not the
// Deployment's; one entry at most runs the Deployment's template (each
// entry is a ReplicaSet of its own template), so the target is one of the
// two newest. The older entries' snapshots are not forgotten by the
// cluster (their ReplicaSets own them), only by the ledger, which the cache
// holds for every Deployment.
const maxConfigEntries = 2

// WithConfig returns the ledger with config recorded on the known-good entry
// of the ReplicaSet uid (nothing changes when there is none).
func (l Ledger) WithConfig(uid types.UID, config []ConfigSnapshot) Ledger {
	out := l
	out.KnownGood = slices.Clone(l.KnownGood)
	for i := range out.KnownGood {
		if out.KnownGood[i].UID == uid {
			out.KnownGood[i].Config = slices.Clone(config)
		}
	}
	return out
}

// HandledDeadlineTime is HandledDeadline as a time.
func (l Ledger) HandledDeadlineTime() (time.Time, bool) {
	if l.HandledDeadline == "" {
		return time.Time{}, false
	}
	return ParseTime(l.HandledDeadline)
}

// FailingSinceOf reads FailingSince for the ReplicaSet named rs; zero when
// absent, unreadable or about another ReplicaSet.
func (l Ledger) FailingSinceOf(rs string) time.Time {
	at, name, ok := strings.Cut(l.FailingSince, " ")
	if !ok || name != rs {
		return time.Time{}
	}
	t, _ := ParseTime(at)
	return t
}

// FailingSinceValue renders FailingSince.
func FailingSinceValue(at time.Time, rs string) string {
	return at.UTC().Format(time.RFC3339) + " " + rs
}
