package reconciler

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/deployguard/deployguard/reconciler/rollout"
)

// The checks' tally between ledger writes. Writing the ledger on every
// measurement made a status write per Deployment per interval, and at
// 1,000 rollouts at once those writes, not Prometheus, bounded how often a
// revision was measured (test/README.md, "Metric checks at 1,000
// Deployments"). The ledger now takes what decides (a run's start, its bake
// window, anything but a Successful measurement, a verdict, a failure);
// Successful measurements in between are kept here, so a guard restarted
// or a new leader measures those again, nothing more.

// runMemory holds the newest run of each newRS being measured, by its UID.
type runMemory struct {
	mu   sync.Mutex
	runs map[types.UID]remembered
}

type remembered struct {
	run  *rollout.CheckRun
	used time.Time
}

// forgetAfter is how long a run nobody looks at is kept: a Deployment
// deleted, or rolled back to another ReplicaSet, mid-run.
const forgetAfter = 10 * time.Minute

// get returns the run remembered for the ReplicaSet uid, if it is the
// ledger's run carried on (nothing decided since that the memory lacks):
// otherwise the ledger, written by this or another leader, is newer.
func (m *runMemory) get(uid types.UID, ledger *rollout.CheckRun, now time.Time) *rollout.CheckRun {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.runs[uid]
	if !ok || decisionChanged(ledger, r.run) {
		return ledger
	}
	r.used = now
	m.runs[uid] = r
	return r.run.Clone()
}

// put remembers run for the ReplicaSet uid, and forgets the runs nobody
// looked at for forgetAfter.
func (m *runMemory) put(uid types.UID, run *rollout.CheckRun, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.runs == nil {
		m.runs = map[types.UID]remembered{}
	}
	m.runs[uid] = remembered{run: run.Clone(), used: now}
	for k, r := range m.runs {
		if now.Sub(r.used) > forgetAfter {
			delete(m.runs, k)
		}
	}
}

// forget drops the run of the ReplicaSet uid (decided, or known-good).
func (m *runMemory) forget(uid types.UID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.runs, uid)
}

// decisionChanged reports whether next differs from prev in anything that
// decides: which revision and since when, the bake window, a failure, a
// metric's verdict, or any counter but the Successful measurements' (a
// Successful measurement that ends a run of errors resets them: that
// counts). Only Successful measurements' counts, times, values and phase
// are left out; a ledger that still says the latest measurement Failed
// after a recovery only keeps the revision measured a little longer after a
// restart.
func decisionChanged(prev, next *rollout.CheckRun) bool {
	if prev == nil || next == nil {
		return prev != next
	}
	if prev.ReplicaSet != next.ReplicaSet || prev.Revision != next.Revision || prev.Started != next.Started ||
		prev.BakeUntil != next.BakeUntil || prev.Failed != next.Failed || prev.Evidence != next.Evidence ||
		prev.FirstFailed != next.FirstFailed || len(prev.Metrics) != len(next.Metrics) {
		return true
	}
	for i := range next.Metrics {
		a, b := prev.Metrics[i], next.Metrics[i]
		if a.Key != b.Key || a.Phase != b.Phase || a.Message != b.Message || a.DryRun != b.DryRun ||
			a.Counts.Failed != b.Counts.Failed || a.Counts.Inconclusive != b.Counts.Inconclusive ||
			a.Counts.Error != b.Counts.Error || a.Counts.ConsecutiveError != b.Counts.ConsecutiveError {
			return true
		}
	}
	return false
}
