package reconciler

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/deployguard/deployguard/reconciler/analysis"
	"github.com/deployguard/deployguard/reconciler/rollout"
)

func TestDecisionChanged(t *testing.T) {
	base := func() *rollout.CheckRun {
		return &rollout.CheckRun{ReplicaSet: "web-2", Revision: 2, Started: "2026-12-07T10:00:00Z", Metrics: []rollout.MetricRun{{
			Key: "k", Counts: analysis.Counts{Count: 1, Successful: 1}, Last: "2026-12-07T10:00:10Z", Value: "[0.01]", LastPhase: analysis.PhaseSuccessful,
		}}}
	}
	tests := []struct {
		name   string
		change func(*rollout.CheckRun)
		want   bool
	}{
		{"nothing", func(*rollout.CheckRun) {}, false},
		{"one more Successful measurement", func(r *rollout.CheckRun) {
			r.Metrics[0].Counts = r.Metrics[0].Counts.Add(analysis.PhaseSuccessful)
			r.Metrics[0].Last, r.Metrics[0].Value = "2026-12-07T10:00:20Z", "[0.02]"
		}, false},
		{"a Failed measurement", func(r *rollout.CheckRun) { r.Metrics[0].Counts = r.Metrics[0].Counts.Add(analysis.PhaseFailed) }, true},
		{"an Inconclusive one", func(r *rollout.CheckRun) { r.Metrics[0].Counts = r.Metrics[0].Counts.Add(analysis.PhaseInconclusive) }, true},
		{"an Error", func(r *rollout.CheckRun) { r.Metrics[0].Counts = r.Metrics[0].Counts.Add(analysis.PhaseError) }, true},
		{"a verdict", func(r *rollout.CheckRun) { r.Metrics[0].Phase = analysis.PhaseSuccessful }, true},
		{"the bake window set", func(r *rollout.CheckRun) { r.BakeUntil = "2026-12-07T10:05:00Z" }, true},
		{"failed", func(r *rollout.CheckRun) { r.Failed, r.Evidence = "2026-12-07T10:00:20Z", "x" }, true},
		{"another metric", func(r *rollout.CheckRun) { r.Metrics = append(r.Metrics, rollout.MetricRun{Key: "k2"}) }, true},
		{"another revision", func(r *rollout.CheckRun) { r.ReplicaSet, r.Revision = "web-3", 3 }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			next := base()
			tt.change(next)
			assert.Equal(t, tt.want, decisionChanged(base(), next))
		})
	}
	assert.True(t, decisionChanged(nil, base()), "a new run")
	assert.False(t, decisionChanged(nil, nil))
}

// The memory carries the Successful measurements between ledger writes, and
// gives way to the ledger when it holds a decision the memory lacks (written
// by another leader, or before a restart).
func TestRunMemory(t *testing.T) {
	now := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	ledger := &rollout.CheckRun{ReplicaSet: "web-2", Revision: 2, Metrics: []rollout.MetricRun{{Key: "k", Counts: analysis.Counts{Count: 1, Successful: 1}}}}
	var m runMemory
	assert.Same(t, ledger, m.get("uid", ledger, now), "nothing remembered: the ledger")

	ahead := ledger.Clone()
	ahead.Metrics[0].Counts = ahead.Metrics[0].Counts.Add(analysis.PhaseSuccessful)
	m.put("uid", ahead, now)
	got := m.get("uid", ledger, now)
	assert.Equal(t, int32(2), got.Metrics[0].Counts.Successful, "the memory, ahead by a Successful measurement")

	decided := ledger.Clone()
	decided.Metrics[0].Counts = decided.Metrics[0].Counts.Add(analysis.PhaseFailed)
	assert.Same(t, decided, m.get("uid", decided, now), "the ledger holds a decision the memory lacks")

	m.put("other", ahead, now.Add(forgetAfter+time.Second))
	assert.Same(t, ledger, m.get("uid", ledger, now), "forgotten after forgetAfter untouched")
	m.forget("other")
	assert.Same(t, ledger, m.get("other", ledger, now))
}
