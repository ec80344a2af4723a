package rollout

import (
	"time"

	"github.com/deployguard/deployguard/reconciler/analysis"
)

// CheckRun is the metric checks' record of one revision: when its
// measurements started (the first new pod Ready), when its rollout completed
// and until when it bakes, each metric's counters and verdict, and whether a
// check failed it. One per Deployment (the newRS's), bounded by the number
// of metrics measured (reconciler.MaxCheckedMetrics).
type CheckRun struct {
	ReplicaSet string `json:"rs"`
	Revision   int64  `json:"revision"`
	// Started is when the first new pod was seen Ready (RFC 3339).
	Started string `json:"started"`
	// BakeUntil is when the bake window ends (RFC 3339): set when the
	// rollout is first seen complete. The revision is recorded known-good
	// only after it, and only if no check failed it.
	BakeUntil string `json:"bakeUntil,omitempty"`
	// Metrics, one per metric measured, in the checks' order.
	Metrics []MetricRun `json:"metrics,omitempty"`
	// Failed is when a check that rolls back failed (RFC 3339), and
	// Evidence what it measured, in words: the rollback phase acts on it
	// as on a deadline (reconciler.ShouldRollBack).
	Failed   string `json:"failed,omitempty"`
	Evidence string `json:"evidence,omitempty"`
	// FirstFailed is when a measurement of a check that rolls back was
	// first Failed (RFC 3339): the rollback's reaction is counted from it.
	FirstFailed string `json:"firstFailed,omitempty"`
}

// MetricRun is one metric's measurements of a revision, as Argo keeps them
// in a MetricResult: counters, not every measurement.
type MetricRun struct {
	// Key names the check and metric (checks.Metric.Key).
	Key    string          `json:"key"`
	Counts analysis.Counts `json:"counts"`
	// Phase is the metric's verdict once completed; empty while it runs.
	Phase   analysis.Phase `json:"phase,omitempty"`
	Message string         `json:"message,omitempty"`
	DryRun  bool           `json:"dryRun,omitempty"`
	// Last is when it was last measured (RFC 3339), Value what it read
	// then, or why it could not (cut short), LastPhase that measurement's
	// phase: a revision is never recorded known-good while a metric's latest
	// measurement is Failed.
	Last      string         `json:"last,omitempty"`
	Value     string         `json:"value,omitempty"`
	LastPhase analysis.Phase `json:"lastPhase,omitempty"`
}

// Of reports whether the run is about the ReplicaSet name at revision.
func (c *CheckRun) Of(name string, revision int64) bool {
	return c != nil && c.ReplicaSet == name && c.Revision == revision
}

// Metric returns the run's entry for key, or nil.
func (c *CheckRun) Metric(key string) *MetricRun {
	if c == nil {
		return nil
	}
	for i := range c.Metrics {
		if c.Metrics[i].Key == key {
			return &c.Metrics[i]
		}
	}
	return nil
}

// BakeUntilTime is BakeUntil as a time; false while the rollout has not
// completed (or there is no run: the methods of CheckRun take nil).
func (c *CheckRun) BakeUntilTime() (time.Time, bool) {
	if c == nil {
		return time.Time{}, false
	}
	return parseTime(c.BakeUntil)
}

// FailedTime is Failed as a time; false when no check failed the revision.
func (c *CheckRun) FailedTime() (time.Time, bool) {
	if c == nil {
		return time.Time{}, false
	}
	return parseTime(c.Failed)
}

// FirstFailedTime is FirstFailed as a time.
func (c *CheckRun) FirstFailedTime() (time.Time, bool) {
	if c == nil {
		return time.Time{}, false
	}
	return parseTime(c.FirstFailed)
}

// LastTime is Last as a time; false before the first measurement.
func (m *MetricRun) LastTime() (time.Time, bool) { return parseTime(m.Last) }

func parseTime(s string) (time.Time, bool) {
	if s == "" {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339, s)
	return t, err == nil
}

// Clone copies the run.
func (c *CheckRun) Clone() *CheckRun {
	if c == nil {
		return nil
	}
	out := *c
	out.Metrics = append([]MetricRun(nil), c.Metrics...)
	return &out
}
