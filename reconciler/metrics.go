package reconciler

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
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
	// Fail-fast.
	failFastReaction  prometheus.Histogram
	failFastDecisions *prometheus.CounterVec
}

// NewMetrics creates the reconciler's metrics and registers them with reg
// (typically controller-runtime's metrics.Registry, so they are served with the
// manager's own). A nil reg leaves them unregistered. Registering twice with the
// same registry (a second reconciler in one process, as in tests) reuses the
// collectors already there.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		rollbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "deployguard_rollbacks_total",
			Help: "Decisions about Deployments whose rollout exceeded its progress deadline, by result: rolled_back, no_known_good, loop_stopped, failed, conflict.",
		}, []string{"result"}),
		knownGoodMarked: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "deployguard_known_good_marked_total",
			Help: "ReplicaSets marked known-good after their rollout completed.",
		}),
		rollbackReaction: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "deployguard_rollback_reaction_seconds",
			Help: "Time from the ProgressDeadlineExceeded condition's lastTransitionTime (one-second resolution) to the rollback write.",
			// The target is under a second; the condition's timestamp is truncated
			// to the second, so the low buckets stay coarse.
			Buckets: []float64{0.1, 0.25, 0.5, 1, 1.5, 2, 5, 10, 30, 60, 300},
		}),
		cleanupSteps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "deployguard_cleanup_steps_total",
			Help: "Cleanup steps of Deployments being deleted whose finalizer the guard removed, by step (drain, record, unknown) and result (completed, timed_out, skipped, failed).",
		}, []string{"step", "result"}),
		cleanupDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "deployguard_cleanup_step_duration_seconds",
			Help:    "Duration of completed or timed-out cleanup steps: for drain, from the drain-started annotation (so across restarts) to the removal of its finalizer; for record, the reconcile that wrote it.",
			Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600},
		}, []string{"step"}),
		failFastReaction: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "deployguard_failfast_reaction_seconds",
			Help:    "Time from the first failure evidence the guard saw on a rollout's new pods to the rollback write (the fail-fast window, and the guard's reaction after it).",
			Buckets: []float64{5, 10, 20, 30, 45, 60, 75, 90, 120, 180, 300, 600},
		}),
		failFastDecisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "deployguard_failfast_decisions_total",
			Help: "Rollouts fail-fast found failing, by the first failing pod's reason (ImagePullBackOff, CrashLoopBackOff, …) and result (rolled_back, no_known_good, reported).",
		}, []string{"reason", "result"}),
		recordsExpired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "deployguard_cleanup_records_expired_total",
			Help: "Record ConfigMaps of deleted Deployments deleted by the guard after their retention.",
		}),
	}
	if reg == nil {
		return m, nil
	}
	var err error
	if m.rollbacks, err = register(reg, m.rollbacks); err != nil {
		return nil, err
	}
	if m.knownGoodMarked, err = register(reg, m.knownGoodMarked); err != nil {
		return nil, err
	}
	if m.rollbackReaction, err = register(reg, m.rollbackReaction); err != nil {
		return nil, err
	}
	if m.cleanupSteps, err = register(reg, m.cleanupSteps); err != nil {
		return nil, err
	}
	if m.cleanupDuration, err = register(reg, m.cleanupDuration); err != nil {
		return nil, err
	}
	if m.recordsExpired, err = register(reg, m.recordsExpired); err != nil {
		return nil, err
	}
	if m.failFastReaction, err = register(reg, m.failFastReaction); err != nil {
		return nil, err
	}
	if m.failFastDecisions, err = register(reg, m.failFastDecisions); err != nil {
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
	return m, nil
}

// register registers c, or returns the equal collector already registered.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var already prometheus.AlreadyRegisteredError
	if errors.As(err, &already) {
		if existing, ok := already.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	return c, fmt.Errorf("registering reconciler metrics: %w", err)
}
