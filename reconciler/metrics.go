package reconciler

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/deployguard/deployguard/reconciler/collectors"
)

// Values of the result label of deployguard_rollbacks_total.
const (
	resultRolledBack  = "rolled_back"
	resultNoKnownGood = "no_known_good"
	resultLoopStopped = "loop_stopped"
	resultFailed      = "failed"
	resultConflict    = "conflict"
	// resultRefused: the known-good template is one the policies in force
	// refuse; not restored.
	resultRefused = "refused_by_policy"
	// resultReported: fail-fast found the rollout failing and told so, with
	// automatic rollback off.
	resultReported = "reported"
)

// Values of the step and result labels of deployguard_cleanup_steps_total.
const (
	stepDrain   = "drain"
	stepRecord  = "record"
	stepUnknown = "unknown"

	resultCompleted = "completed"
	resultTimedOut  = "timed_out"
	resultSkipped   = "skipped"
	// resultFailed (above) is a step given up on: its finalizer was removed
	// without the step having done its work (a record whose name is taken).
)

// Metrics are the reconciler's Prometheus metrics.
type Metrics struct {
	rollbacks        *prometheus.CounterVec
	knownGoodMarked  prometheus.Counter
	rollbackReaction prometheus.Histogram
	cleanupSteps     *prometheus.CounterVec
	cleanupDuration  *prometheus.HistogramVec
	recordsExpired   prometheus.Counter
	recordsEvicted   prometheus.Counter
	// Fail-fast.
	failFastReaction  prometheus.Histogram
	failFastDecisions *prometheus.CounterVec
	// Metric checks.
	checkMeasurements  *prometheus.CounterVec
	checkVerdicts      *prometheus.CounterVec
	checkQueryDuration prometheus.Histogram
	checkThrottled     prometheus.Counter
	checkReaction      prometheus.Histogram
	checkBaked         prometheus.Counter
}

// NewMetrics creates the reconciler's metrics and registers them with reg
// (typically controller-runtime's metrics.Registry, so they are served with the
// manager's own). A nil reg leaves them unregistered. Registering twice with the
// same registry (a second reconciler in one process, as in tests) reuses the
// collectors already there.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	r := collectors.NewRegistration(reg, "reconciler metrics")
	m := &Metrics{
		rollbacks: r.CounterVec("deployguard_rollbacks_total",
			"Decisions about Deployments whose rollout exceeded its progress deadline, by result: rolled_back, no_known_good, loop_stopped, failed, conflict.",
			"result"),
		knownGoodMarked: r.Counter("deployguard_known_good_marked_total",
			"ReplicaSets marked known-good after their rollout completed."),
		// The target is under a second; the condition's timestamp is truncated
		// to the second, so the low buckets stay coarse.
		rollbackReaction: r.Histogram("deployguard_rollback_reaction_seconds",
			"Time from the ProgressDeadlineExceeded condition's lastTransitionTime (one-second resolution) to the rollback write.",
			[]float64{0.1, 0.25, 0.5, 1, 1.5, 2, 5, 10, 30, 60, 300}),
		cleanupSteps: r.CounterVec("deployguard_cleanup_steps_total",
			"Cleanup steps of Deployments being deleted whose finalizer the guard removed, by step (drain, record, unknown) and result (completed, timed_out, skipped, failed).",
			"step", "result"),
		cleanupDuration: r.HistogramVec("deployguard_cleanup_step_duration_seconds",
			"Duration of completed or timed-out cleanup steps: for drain, from the drain-started annotation (so across restarts) to the removal of its finalizer; for record, the reconcile that wrote it.",
			[]float64{0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600}, "step"),
		failFastReaction: r.Histogram("deployguard_failfast_reaction_seconds",
			"Time from the first failure evidence the guard saw on a rollout's new pods to the rollback write (the fail-fast window, and the guard's reaction after it).",
			[]float64{5, 10, 20, 30, 45, 60, 75, 90, 120, 180, 300, 600}),
		failFastDecisions: r.CounterVec("deployguard_failfast_decisions_total",
			"Rollouts fail-fast found failing, by the first failing pod's reason (ImagePullBackOff, CrashLoopBackOff, …) and result (rolled_back, no_known_good, reported).",
			"reason", "result"),
		checkMeasurements: r.CounterVec("deployguard_check_measurements_total",
			"Measurements of metric checks, by the check's kind (cluster, namespaced) and phase (Successful, Failed, Inconclusive, Error).",
			"kind", "phase"),
		checkVerdicts: r.CounterVec("deployguard_check_verdicts_total",
			"Metric checks' verdicts on revisions, by the check's kind (cluster, namespaced), phase (Successful, Failed, Inconclusive, Error) and dry_run (true, false). Only Failed without dry run rolls back.",
			"kind", "phase", "dry_run"),
		checkQueryDuration: r.Histogram("deployguard_check_query_duration_seconds",
			"Duration of the metric checks' Prometheus queries, errors included.",
			[]float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}),
		checkThrottled: r.Counter("deployguard_check_measurements_delayed_total",
			"Measurements put off by the bound on Prometheus queries per second (checks.prometheus.qps): late, not an error."),
		checkReaction: r.Histogram("deployguard_check_rollback_reaction_seconds",
			"Time from a revision's first Failed measurement (a check that rolls back) to its rollback write.",
			[]float64{1, 5, 10, 20, 30, 45, 60, 90, 120, 180, 300, 600}),
		checkBaked: r.Counter("deployguard_check_baked_total",
			"Revisions whose bake window passed with no metric check failing them (then recorded known-good)."),
		recordsExpired: r.Counter("deployguard_cleanup_records_expired_total",
			"Record ConfigMaps of deleted Deployments deleted by the guard after their retention."),
		recordsEvicted: r.Counter("deployguard_cleanup_records_evicted_total",
			"Record ConfigMaps of deleted Deployments deleted by the guard before their retention, the oldest of their namespace, to keep its records within their budget (count and bytes)."),
	}
	if err := r.Err(); err != nil {
		return nil, err
	}
	// Export every result from the start, at zero, so that rate() and alerts
	// see the series before the first failure.
	for _, result := range []string{resultRolledBack, resultNoKnownGood, resultLoopStopped, resultFailed, resultConflict} {
		m.rollbacks.WithLabelValues(result)
	}
	for _, step := range []string{stepDrain, stepRecord} {
		for _, result := range []string{resultCompleted, resultSkipped, resultFailed} {
			m.cleanupSteps.WithLabelValues(step, result)
		}
	}
	m.cleanupSteps.WithLabelValues(stepDrain, resultTimedOut)
	for _, kind := range []string{"cluster", "namespaced"} {
		for _, phase := range []string{"Successful", "Failed", "Inconclusive", "Error"} {
			m.checkMeasurements.WithLabelValues(kind, phase)
		}
	}
	return m, nil
}
