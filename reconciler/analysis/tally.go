package analysis

import "fmt"

// Counts are the counters Argo keeps in a MetricResult, computed from the
// ordered measurement phases: Count counts every measurement that is not an
// Error, and an Error adds to ConsecutiveError, which any other phase resets
// (Argo's runMeasurements).
type Counts struct {
	Count            int32 `json:"count,omitempty"`
	Successful       int32 `json:"successful,omitempty"`
	Failed           int32 `json:"failed,omitempty"`
	Inconclusive     int32 `json:"inconclusive,omitempty"`
	Error            int32 `json:"error,omitempty"`
	ConsecutiveError int32 `json:"consecutiveError,omitempty"`
}

// CountPhases folds the measurement phases, oldest first, into Counts.
// Phases that are not a measurement's outcome (Pending, Running) are ignored.
func CountPhases(measurements []Phase) Counts {
	var c Counts
	for _, p := range measurements {
		c = c.Add(p)
	}
	return c
}

// Add returns the counts with one more measurement of phase p, so that a
// caller can keep the counters instead of every phase (Argo keeps them so
// too, in its MetricResult).
func (c Counts) Add(p Phase) Counts {
	switch p {
	case PhaseSuccessful:
		c.Successful++
		c.Count++
		c.ConsecutiveError = 0
	case PhaseFailed:
		c.Failed++
		c.Count++
		c.ConsecutiveError = 0
	case PhaseInconclusive:
		c.Inconclusive++
		c.Count++
		c.ConsecutiveError = 0
	case PhaseError:
		c.Error++
		c.ConsecutiveError++
	}
	return c
}

// Verdict is a metric's phase after the measurements so far.
type Verdict struct {
	Phase Phase
	// Message says which limit decided, in Argo's words, e.g.
	// "failed (2) > failureLimit (1)"; empty while Running.
	Message string
	// DryRun: the metric reports only; see RollsBack.
	DryRun bool
	Counts Counts
}

// RollsBack says whether the verdict calls for a rollback: only Failed, and
// never in dry run. Inconclusive and Error never roll back (issue 55: three
// outcomes, never a guess).
func (v Verdict) RollsBack() bool {
	return v.Phase == PhaseFailed && !v.DryRun
}

// Tally decides the metric's phase from its measurement phases, oldest first,
// as Argo's assessMetricStatus and assessMetricFailureInconclusiveOrError do:
//
//   - no measurement yet: Pending;
//   - the first verdict that completes stands (Argo stops measuring then);
//   - failed > failureLimit: Failed;
//   - inconclusive > inconclusiveLimit: Inconclusive (wins over Failed:
//     Argo assigns the phases in this order and the last assignment stands);
//   - consecutive errors > consecutiveErrorLimit: Error (wins over both);
//   - otherwise, the effective count reached: Successful (failures within the
//     limit are ignored, as Argo's comment says);
//   - otherwise Running.
//
// Dry run changes nothing in the phase; Argo keeps a dry-run metric's phase
// in the run's dryRunSummary and leaves it out of the run's phase, which
// Verdict.RollsBack does here.
func Tally(m Metric, measurements []Phase) Verdict {
	v := Verdict{Phase: PhasePending, DryRun: m.DryRun}
	// Argo assesses after each measurement and stops measuring once the
	// metric is complete, so the first complete verdict stands: later
	// measurements (a caller that measured once too often) change nothing.
	for i := range measurements {
		v = assess(m, CountPhases(measurements[:i+1]))
		if v.Phase.Completed() {
			return v
		}
	}
	return v
}

// Assess is the metric's verdict from its counters after a measurement (see
// Tally, which folds a list of phases through it). The first completed
// verdict stands: a caller keeping counters stops measuring then.
func Assess(m Metric, c Counts) Verdict {
	if c == (Counts{}) {
		return Verdict{Phase: PhasePending, DryRun: m.DryRun}
	}
	return assess(m, c)
}

func assess(m Metric, c Counts) Verdict {
	v := Verdict{Phase: PhaseRunning, DryRun: m.DryRun, Counts: c}
	if c.Failed > m.failureLimit() {
		v.Phase = PhaseFailed
		v.Message = fmt.Sprintf("failed (%d) > failureLimit (%d)", c.Failed, m.failureLimit())
	}
	if c.Inconclusive > m.inconclusiveLimit() {
		v.Phase = PhaseInconclusive
		v.Message = fmt.Sprintf("inconclusive (%d) > inconclusiveLimit (%d)", c.Inconclusive, m.inconclusiveLimit())
	}
	if c.ConsecutiveError > m.consecutiveErrorLimit() {
		v.Phase = PhaseError
		v.Message = fmt.Sprintf("consecutiveErrors (%d) > consecutiveErrorLimit (%d)", c.ConsecutiveError, m.consecutiveErrorLimit())
	}
	if v.Phase != PhaseRunning {
		return v
	}
	// Argo: "If a count was specified, and we reached that count, then metric
	// is considered Successful."
	if count, bounded := m.EffectiveCount(); bounded && c.Count >= count {
		v.Phase = PhaseSuccessful
		v.Message = fmt.Sprintf("count (%d) reached", count)
	}
	return v
}
