package reconciler

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/analysis"
	"github.com/deployguard/deployguard/reconciler/analysis/checks"
	"github.com/deployguard/deployguard/reconciler/analysis/promscope"
	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
)

// Querier runs one PromQL query (package prom's Client). Reserve returns 0
// and takes a token of the guard's queries-per-second bound when the query
// of key (a revision's metric) may go now, or how long until its turn, which
// is kept for key: a reconcile requeues rather than block a worker, so that
// 500 rollouts at once wait their turn, first come first served, without
// holding the workers the rest of the cluster needs.
type Querier interface {
	Query(ctx context.Context, query string, at time.Time) (analysis.Value, error)
	Reserve(key string) time.Duration
}

// MetricChecks turns metric checks on (DeploymentReconciler.Checks).
type MetricChecks struct {
	// Prometheus answers the checks' queries.
	Prometheus Querier
	// memory keeps the tally between ledger writes (runMemory).
	memory runMemory
	// told remembers which invalid checks were told on which revision.
	told invalidTold
	// Library compiles each check once per generation; nil makes one.
	Library *checks.Library
	// BakeWindow is how long a completed rollout is still measured before
	// it is recorded known-good, for checks that do not set their own.
	// Zero or less means DefaultBakeWindow.
	BakeWindow time.Duration
}

// DefaultBakeWindow is the bake window of a check that sets none.
const DefaultBakeWindow = 5 * time.Minute

// MaxCheckedMetrics bounds the metrics measured on one revision (the
// ledger keeps an entry for each); past it, the first in the checks' order
// (the platform's first) are measured, and a MetricCheckInvalid Event says so.
const MaxCheckedMetrics = 20

// errorRetry is when a metric without an interval is measured again after
// an Error (Argo's DefaultErrorRetryInterval).
const errorRetry = 10 * time.Second

// maxEvidence and maxValue bound what the ledger keeps of a measurement.
const (
	maxEvidence = 1024
	maxValue    = 128
)

// CheckInput is what decides which metrics are due: the run so far, the
// metrics that select the Deployment, and the rollout's state.
type CheckInput struct {
	Run      *rollout.CheckRun
	Metrics  []checks.Metric
	NewRS    string
	Revision int64
	// Ready: a new pod is Ready (measurements start then). Complete: the
	// rollout completed.
	Ready, Complete bool
	Now             time.Time
	// Bake is the bake window that applies (the longest of the checks').
	Bake time.Duration
}

// CheckPlan is what PlanChecks decided: the run to record (nil: none), the
// indexes of the metrics to measure now, and when to look again (0: when
// something changes).
type CheckPlan struct {
	Run   *rollout.CheckRun
	Due   []int
	Again time.Duration
	// Baked: the bake window passed with no check failing the revision.
	Baked bool
}

// PlanChecks decides, without I/O, what the checks do on this pass: start a
// run at the first Ready new pod, set the bake window at completion, and
// which metrics are due. A run of another revision is replaced; a failed
// run measures nothing more.
func PlanChecks(in CheckInput) CheckPlan {
	if len(in.Metrics) == 0 {
		return CheckPlan{}
	}
	run := in.Run.Clone()
	if !run.Of(in.NewRS, in.Revision) {
		run = nil
	}
	if run == nil {
		if !in.Ready {
			return CheckPlan{} // nothing of the new revision to measure yet
		}
		run = &rollout.CheckRun{ReplicaSet: in.NewRS, Revision: in.Revision, Started: formatTime(in.Now)}
	}
	if in.Complete && run.BakeUntil == "" {
		run.BakeUntil = formatTime(in.Now.Add(in.Bake))
	}
	plan := CheckPlan{Run: run}
	if _, failed := run.FailedTime(); failed {
		return plan
	}
	if until, ok := run.BakeUntilTime(); ok {
		if !in.Now.Before(until) && !stillFailing(run, in.Metrics) {
			plan.Baked = true
			return plan
		}
		// A metric whose latest measurement Failed is measured past the
		// window until it fails the revision or recovers: a bake window
		// that ends between two measurements proves nothing.
		if in.Now.Before(until) {
			plan.Again = until.Sub(in.Now)
		}
	}
	for i, m := range in.Metrics {
		if i >= MaxCheckedMetrics {
			break
		}
		mr := run.Metric(m.Key())
		if mr != nil && mr.Phase.Completed() {
			continue
		}
		wait, measures := untilFirst(m.Check.Metric, run, in.Now), true
		if mr != nil {
			wait, measures = untilDue(m.Check.Metric, mr, in.Now)
		}
		if !measures {
			continue
		}
		if wait <= 0 {
			plan.Due = append(plan.Due, i)
			wait = m.Check.Metric.Interval.Duration
			if wait <= 0 {
				wait = errorRetry
			}
		}
		if wait > 0 && (plan.Again == 0 || wait < plan.Again) {
			plan.Again = wait
		}
	}
	return plan
}

// stillFailing reports whether a metric that rolls back (not dry run, not
// completed) was Failed at its latest measurement.
func stillFailing(run *rollout.CheckRun, ms []checks.Metric) bool {
	for _, m := range ms {
		if mr := run.Metric(m.Key()); mr != nil && !mr.DryRun && !mr.Phase.Completed() && mr.LastPhase == analysis.PhaseFailed {
			return true
		}
	}
	return false
}

// untilFirst is how long until the metric's first measurement: its
// initialDelay after the run started.
func untilFirst(m analysis.Metric, run *rollout.CheckRun, now time.Time) time.Duration {
	started, err := time.Parse(time.RFC3339, run.Started)
	if err != nil || m.InitialDelay.Duration <= 0 {
		return 0
	}
	return started.Add(m.InitialDelay.Duration).Sub(now)
}

// untilDue is how long until the metric's next measurement: its interval
// after the last one; a metric without an interval is measured once (false
// after that), and again errorRetry after an Error.
func untilDue(m analysis.Metric, mr *rollout.MetricRun, now time.Time) (time.Duration, bool) {
	last, ok := mr.LastTime()
	if !ok {
		return 0, true
	}
	every := m.Interval.Duration
	if every <= 0 {
		if mr.Counts.ConsecutiveError == 0 {
			return 0, false // measured once; Assess completed it (count 1)
		}
		every = errorRetry
	}
	return last.Add(every).Sub(now), true
}

// Measured is one measurement's outcome, for RecordMeasurement.
type Measured struct {
	Phase analysis.Phase
	// Value is what the query returned, or why it could not be judged.
	Value string
	Query string
}

// RecordMeasurement adds one measurement of metric m to run, and returns the
// metric's verdict when this measurement completed it (nil otherwise). A
// verdict that rolls back marks the run Failed with its evidence.
func RecordMeasurement(run *rollout.CheckRun, m checks.Metric, got Measured, now time.Time) *analysis.Verdict {
	mr := run.Metric(m.Key())
	if mr == nil {
		run.Metrics = append(run.Metrics, rollout.MetricRun{Key: m.Key(), DryRun: m.Check.Metric.DryRun})
		mr = &run.Metrics[len(run.Metrics)-1]
	}
	mr.Counts = mr.Counts.Add(got.Phase)
	if got.Phase == analysis.PhaseFailed && run.FirstFailed == "" && !m.Check.Metric.DryRun {
		run.FirstFailed = formatTime(now)
	}
	mr.Last, mr.Value, mr.LastPhase = formatTime(now), cut(got.Value, maxValue), got.Phase
	v := analysis.Assess(m.Check.Metric, mr.Counts)
	if !v.Phase.Completed() {
		return nil
	}
	mr.Phase, mr.Message = v.Phase, v.Message
	if v.RollsBack() && run.Failed == "" {
		run.Failed = formatTime(now)
		run.Evidence = cut(CheckEvidence(m, got, v), maxEvidence)
	}
	return &v
}

// CheckEvidence says what a metric found, in the words the Event, the
// rollback-status annotation and `kubectl deployguard status` carry: the
// check, its query as measured, the value and the condition.
func CheckEvidence(m checks.Metric, got Measured, v analysis.Verdict) string {
	cond := ""
	switch mm := m.Check.Metric; {
	case mm.FailureCondition != "" && mm.SuccessCondition != "":
		cond = fmt.Sprintf("successCondition %q, failureCondition %q", mm.SuccessCondition, mm.FailureCondition)
	case mm.FailureCondition != "":
		cond = fmt.Sprintf("failureCondition %q", mm.FailureCondition)
	default:
		cond = fmt.Sprintf("successCondition %q", mm.SuccessCondition)
	}
	return fmt.Sprintf("metric check %s %s: %s; query %s returned %s (%s)",
		m.Key(), strings.ToLower(string(v.Phase)), v.Message, got.Query, got.Value, cond)
}

// bakeWindow is the longest bake window of the metrics' checks.
func (c *MetricChecks) bakeWindow(ms []checks.Metric) time.Duration {
	def := c.BakeWindow
	if def <= 0 {
		def = DefaultBakeWindow
	}
	out := time.Duration(0)
	for _, m := range ms {
		b := def
		if m.BakeWindow != nil {
			b = m.BakeWindow.Duration
		}
		out = max(out, b)
	}
	return out
}

// selectChecks returns the metrics of the checks that select d.
func (r *DeploymentReconciler) selectChecks(ctx context.Context, d *appsv1.Deployment) ([]checks.Metric, []checks.Invalid, error) {
	ns := &metav1.PartialObjectMetadata{}
	ns.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Namespace"))
	if err := r.Client.Get(ctx, types.NamespacedName{Name: d.Namespace}, ns); client.IgnoreNotFound(err) != nil {
		return nil, nil, fmt.Errorf("reading namespace %s: %w", d.Namespace, err)
	}
	var cluster checks.ClusterDeploymentCheckList
	if err := r.Client.List(ctx, &cluster); err != nil {
		return nil, nil, fmt.Errorf("listing ClusterDeploymentChecks: %w", err)
	}
	var team checks.DeploymentCheckList
	if err := r.Client.List(ctx, &team, client.InNamespace(d.Namespace)); err != nil {
		return nil, nil, fmt.Errorf("listing the DeploymentChecks of namespace %s: %w", d.Namespace, err)
	}
	if r.Checks.Library == nil {
		r.Checks.Library = &checks.Library{}
	}
	ms, invalid := checks.Select(d, ns.Labels, r.Checks.Library, cluster.Items, team.Items)
	return ms, invalid, nil
}

// reconcileChecks measures the newRS of a rollout with the metric checks
// that select the Deployment, from its first Ready pod until its bake window
// ends after completion, and records the tally in the ledger
// (rollout.CheckRun). A check that fails the revision marks the run Failed:
// the rollback phase, which runs after it, acts on that as on a deadline.
// Inconclusive and Error never roll back; they are told in Events. It
// returns when to look again, and whether the newRS is held back from being
// recorded known-good: checks select the Deployment and its bake window has
// not passed, or one of them failed it.
func (r *DeploymentReconciler) reconcileChecks(ctx context.Context, d *appsv1.Deployment, rss []*appsv1.ReplicaSet) (again time.Duration, hold bool, err error) {
	if r.Checks == nil || r.Checks.Prometheus == nil {
		return 0, false, nil
	}
	l, _ := rollout.ReadLedger(d)
	newRS := rollout.FindNewReplicaSet(d, rss)
	var rev int64
	if newRS != nil {
		rev, _ = rollout.Revision(newRS)
	}
	if newRS == nil || rev == 0 || d.Spec.Paused || rollout.Replicas(d) == 0 || d.Status.ObservedGeneration != d.Generation ||
		newRS.DeletionTimestamp != nil || l.IsKnownGood(newRS) || l.RolledBackRevision == rev {
		// Nothing of a new revision to measure: a known-good one proved
		// itself, a rolled-back one is decided.
		if newRS != nil {
			r.Checks.memory.forget(newRS.UID)
		}
		return 0, false, nil
	}
	ms, invalid, err := r.selectChecks(ctx, d)
	if err != nil {
		return 0, true, err
	}
	log := ctrl.LoggerFrom(ctx).WithValues("replicaSet", klog.KObj(newRS), "revision", rev)
	r.tellInvalid(d, newRS, invalid)
	if len(ms) == 0 {
		if _, failed := l.Checks.FailedTime(); failed && l.Checks.Of(newRS.Name, rev) {
			// A revision a check failed stays failed when the check goes.
			return 0, true, nil
		}
		if l.Checks != nil {
			// The checks that selected it are gone: known-good as before.
			_, err := r.updateLedger(ctx, d, func(l rollout.Ledger) rollout.Ledger { l.Checks = nil; return l })
			return 0, err != nil, err
		}
		return 0, false, nil
	}
	now := r.Clock.Now()
	plan := PlanChecks(CheckInput{
		Run: r.Checks.memory.get(newRS.UID, l.Checks, now), Metrics: ms, NewRS: newRS.Name, Revision: rev,
		Ready: newRS.Status.ReadyReplicas > 0, Complete: IsComplete(d), Now: now, Bake: r.Checks.bakeWindow(ms),
	})
	if plan.Run == nil {
		// No new pod Ready yet: nothing measured, nothing proven.
		return 0, true, nil
	}
	started := !l.Checks.Of(newRS.Name, rev)
	run := plan.Run
	type told struct {
		m   checks.Metric
		v   *analysis.Verdict
		got Measured
	}
	var verdicts []told
	var firstErrors []told
	again = plan.Again
	hash, unmeasurable := revisionHash(d, newRS)
	vars := promscope.Vars{Namespace: d.Namespace, Name: d.Name, PodTemplateHash: hash, StablePodTemplateHash: stableHash(d, l, newRS)}
	for _, i := range plan.Due {
		m := ms[i]
		got := Measured{Phase: analysis.PhaseError, Value: fmt.Sprint(unmeasurable), Query: m.Query.String()}
		if unmeasurable == nil {
			if wait := r.Checks.Prometheus.Reserve(string(newRS.UID) + "/" + m.Key()); wait > 0 {
				// Late, not an Error: the guard's bound on queries per
				// second. Each due metric has its turn kept (prom's turns),
				// and the revision comes back for the first of them.
				if again == 0 || wait < again {
					again = wait
				}
				r.Metrics.checkThrottled.Inc()
				continue
			}
			got = r.measure(ctx, m, vars, now)
		}
		r.Metrics.checkMeasurements.WithLabelValues(kindLabel(m.Kind), string(got.Phase)).Inc()
		v := RecordMeasurement(run, m, got, now)
		if v != nil {
			verdicts = append(verdicts, told{m, v, got})
		} else if got.Phase == analysis.PhaseError && run.Metric(m.Key()).Counts.ConsecutiveError == 1 {
			firstErrors = append(firstErrors, told{m, nil, got})
		}
	}
	// What decides goes to the ledger; Successful measurements in between
	// stay in memory (runMemory).
	if decisionChanged(l.Checks, run) {
		if _, err := r.updateLedger(ctx, d, func(l rollout.Ledger) rollout.Ledger { l.Checks = run; return l }); err != nil {
			return 0, true, fmt.Errorf("recording the metric checks of revision %d: %w", rev, err)
		}
	}
	r.Checks.memory.put(newRS.UID, run, now)
	// Told after the write, so once.
	if started {
		log.Info("Measuring the new revision with metric checks", "metrics", len(ms))
		if len(ms) > MaxCheckedMetrics {
			r.Recorder.Eventf(d, newRS, corev1.EventTypeWarning, vocab.ReasonCheckInvalid, actionMeasure,
				"%d metrics of checks select this Deployment; the first %d (the platform's first) are measured.", len(ms), MaxCheckedMetrics)
		}
	}
	for _, e := range firstErrors {
		r.Recorder.Eventf(d, newRS, corev1.EventTypeWarning, vocab.ReasonCheckError, actionMeasure,
			"Metric check %s could not measure revision %d: %s. Not a reason to roll back; after consecutiveErrorLimit errors in a row the revision is unchecked.", e.m.Key(), rev, e.got.Value)
	}
	for _, t := range verdicts {
		r.tellVerdict(ctx, d, newRS, rev, t.m, *t.v, t.got, run)
	}
	if plan.Baked && run.Failed == "" {
		log.Info("Metric checks passed the revision's bake window")
		r.Metrics.checkBaked.Inc()
		return again, false, nil
	}
	return again, true, nil
}

// tellInvalid says, once per check generation and revision, that a check
// selecting the Deployment is invalid and not measured. Not on every pass:
// a Deployment is reconciled many times a rollout, and each Event would be
// another write to the API server for a problem already said.
func (r *DeploymentReconciler) tellInvalid(d *appsv1.Deployment, newRS *appsv1.ReplicaSet, invalid []checks.Invalid) {
	now := r.Clock.Now()
	for _, c := range invalid {
		if !r.Checks.told.first(toldKey{check: c.UID, generation: c.Generation, replicaSet: newRS.UID}, now) {
			continue
		}
		r.Recorder.Eventf(d, nil, corev1.EventTypeWarning, vocab.ReasonCheckInvalid, actionMeasure,
			"%s %s (generation %d) selects this Deployment but is not measured: %s", c.Kind, c.Name, c.Generation, cut(c.Errs.ToAggregate().Error(), maxEvidence))
	}
}

// invalidTold remembers which invalid checks were told on which revision
// (ReplicaSet), so that MetricCheckInvalid is said once for each until the
// check changes (a new generation) or another revision rolls out: Events
// expire after an hour, and a rollout tomorrow is told again. Bounded: an
// entry no pass has seen for forgetToldAfter (its check deleted, fixed or
// no longer selecting, its revision decided) is forgotten, and past
// maxTold entries the longest unseen go first.
type invalidTold struct {
	mu sync.Mutex
	// seen is when each problem was told.
	seen map[toldKey]time.Time
}

type toldKey struct {
	check      types.UID
	generation int64
	replicaSet types.UID
}

const (
	// forgetToldAfter is the Event's own time to live (the API server's
	// --event-ttl default): a problem unseen for longer is told afresh.
	forgetToldAfter = time.Hour
	// maxTold bounds the memo (about 100 bytes an entry): far more invalid
	// checks times revisions rolling out than a cluster has at once.
	maxTold = 4096
)

// first reports whether k is to be told now, and remembers when it was:
// news, or told longer ago than its Event lives (a revision baking for hours
// is told again once its Event expired). Past maxTold problems told within
// the hour, a new one is not told (its measurements say so in the logs and
// metrics): evicting another to make room would tell that one on every pass.
func (t *invalidTold) first(k toldKey, now time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.seen == nil {
		t.seen = map[toldKey]time.Time{}
	}
	if told, ok := t.seen[k]; ok && now.Sub(told) <= forgetToldAfter {
		return false
	}
	for old, told := range t.seen {
		if now.Sub(told) > forgetToldAfter {
			delete(t.seen, old)
		}
	}
	if len(t.seen) >= maxTold {
		return false
	}
	t.seen[k] = now
	return true
}

// tellVerdict says a metric's verdict in an Event and a metric.
func (r *DeploymentReconciler) tellVerdict(ctx context.Context, d *appsv1.Deployment, newRS *appsv1.ReplicaSet, rev int64, m checks.Metric, v analysis.Verdict, got Measured, run *rollout.CheckRun) {
	r.Metrics.checkVerdicts.WithLabelValues(kindLabel(m.Kind), string(v.Phase), fmt.Sprint(v.DryRun)).Inc()
	evidence := cut(CheckEvidence(m, got, v), maxEvidence)
	log := ctrl.LoggerFrom(ctx).WithValues("replicaSet", klog.KObj(newRS), "revision", rev, "check", m.Key(), "phase", v.Phase)
	switch {
	case v.Phase == analysis.PhaseFailed && v.DryRun:
		log.Info("Metric check failed the revision in dry run; nothing rolled back")
		r.Recorder.Eventf(d, newRS, corev1.EventTypeWarning, vocab.ReasonCheckFailed, actionMeasure,
			"Revision %d (ReplicaSet %s): %s. Dry run: reported only, nothing is rolled back.", rev, newRS.Name, evidence)
	case v.Phase == analysis.PhaseFailed:
		log.Info("Metric check failed the revision", "evidence", evidence)
		r.Recorder.Eventf(d, newRS, corev1.EventTypeWarning, vocab.ReasonCheckFailed, actionMeasure,
			"Revision %d (ReplicaSet %s): %s.", rev, newRS.Name, evidence)
	case v.Phase == analysis.PhaseInconclusive:
		log.Info("Metric check inconclusive; not rolling back")
		r.Recorder.Eventf(d, newRS, corev1.EventTypeWarning, vocab.ReasonCheckInconclusive, actionMeasure,
			"Revision %d (ReplicaSet %s): %s. Inconclusive is never a reason to roll back; this check stops measuring the revision.", rev, newRS.Name, evidence)
	case v.Phase == analysis.PhaseError:
		log.Info("Metric check could not measure the revision; it is unchecked")
		r.Recorder.Eventf(d, newRS, corev1.EventTypeWarning, vocab.ReasonCheckError, actionMeasure,
			"Revision %d (ReplicaSet %s) is unchecked by %s: %s. Never a reason to roll back.", rev, newRS.Name, m.Key(), evidence)
	}
}

// revisionHash is the new revision's pod-template-hash, the queries'
// {{ .PodTemplateHash }}: the suffix of the ReplicaSet's name, which the
// Deployment controller sets to <deployment>-<hash> and nobody can change
// after, not its label, which whoever may edit the namespace can relabel to
// make a check measure other pods. A ReplicaSet named otherwise, or whose
// label disagrees with its name, cannot be measured: the error says why, and
// each due metric records it as an Error (never a rollback) rather than
// measure pods that may not be the revision's.
func revisionHash(d *appsv1.Deployment, newRS *appsv1.ReplicaSet) (string, error) {
	hash, ok := strings.CutPrefix(newRS.Name, d.Name+"-")
	if !ok || hash == "" || strings.Contains(hash, "-") {
		return "", fmt.Errorf("ReplicaSet %s is not named %s-<pod-template-hash>, as the Deployment controller names them: its pods cannot be told apart", newRS.Name, d.Name)
	}
	if label := newRS.Labels[appsv1.DefaultDeploymentUniqueLabelKey]; label != hash {
		return "", fmt.Errorf("ReplicaSet %s is labelled %s=%q, not its name's %q: relabelled, it could make the check measure other pods", newRS.Name, appsv1.DefaultDeploymentUniqueLabelKey, label, hash)
	}
	return hash, nil
}

// stableHash is the pod-template-hash of the newest known-good revision
// other than newRS, a query's baseline ({{ .StablePodTemplateHash }}): read
// from the ReplicaSet name the guard recorded in its ledger, which no
// tenant writes. Empty when there is none.
func stableHash(d *appsv1.Deployment, l rollout.Ledger, newRS *appsv1.ReplicaSet) string {
	for i := len(l.KnownGood) - 1; i >= 0; i-- {
		if e := l.KnownGood[i]; e.UID != newRS.UID {
			if hash, ok := strings.CutPrefix(e.ReplicaSet, d.Name+"-"); ok && hash != "" && !strings.Contains(hash, "-") && len(validation.IsValidLabelValue(hash)) == 0 {
				return hash
			}
			return ""
		}
	}
	return ""
}

// measure runs one measurement of m on the revision: the query rendered
// for it, and its result judged. A query that cannot be run or judged is an
// Error, with why in Value.
func (r *DeploymentReconciler) measure(ctx context.Context, m checks.Metric, vars promscope.Vars, now time.Time) Measured {
	q, err := m.Query.Render(vars)
	if errors.Is(err, promscope.ErrNoBaseline) {
		// Nothing to compare with (a first revision): not known either way.
		return Measured{Phase: analysis.PhaseInconclusive, Value: "the query compares with the known-good revision ({{ .StablePodTemplateHash }}), and there is none", Query: m.Query.String()}
	}
	if err != nil {
		return Measured{Phase: analysis.PhaseError, Value: "the query cannot be rendered: " + err.Error(), Query: m.Query.String()}
	}
	start := time.Now()
	val, err := r.Checks.Prometheus.Query(ctx, q, now)
	r.Metrics.checkQueryDuration.Observe(time.Since(start).Seconds())
	if err != nil {
		return Measured{Phase: analysis.PhaseError, Value: err.Error(), Query: q}
	}
	phase, err := m.Check.Evaluate(val)
	if err != nil {
		return Measured{Phase: analysis.PhaseError, Value: val.String() + ", which the conditions cannot judge: " + err.Error(), Query: q}
	}
	return Measured{Phase: phase, Value: val.String(), Query: q}
}

// checkFailure is the failure a check declared on the newRS, as the
// Progressing condition a deadline would be: the rollback phase acts on it
// as on fail-fast's declaration, through the same path (ShouldRollBack).
func checkFailure(d *appsv1.Deployment, rss []*appsv1.ReplicaSet) *appsv1.DeploymentCondition {
	l, _ := rollout.ReadLedger(d)
	if l.Checks == nil {
		return nil
	}
	at, failed := l.Checks.FailedTime()
	newRS := rollout.FindNewReplicaSet(d, rss)
	if !failed || newRS == nil {
		return nil
	}
	if rev, _ := rollout.Revision(newRS); !l.Checks.Of(newRS.Name, rev) {
		return nil
	}
	return &appsv1.DeploymentCondition{
		Type: appsv1.DeploymentProgressing, Status: corev1.ConditionFalse, Reason: vocab.ProgressDeadlineExceeded,
		LastTransitionTime: metav1.NewTime(at), LastUpdateTime: metav1.NewTime(at),
		Message: DeclaredFailureMessage(newRS.Name, l.Checks.Evidence),
	}
}

// checkFailedFirst is when the first failed measurement of a check was taken,
// if a check's failure is what dec rolls back (not a deadline or fail-fast
// that overtook a check still measuring).
func checkFailedFirst(d *appsv1.Deployment, dec Decision) (time.Time, bool) {
	l, _ := rollout.ReadLedger(d)
	if l.Checks == nil || dec.NewRS == nil || l.Checks.Revision != dec.FailedRevision || dec.Deadline == nil ||
		dec.Deadline.Message != DeclaredFailureMessage(dec.NewRS.Name, l.Checks.Evidence) {
		return time.Time{}, false
	}
	return l.Checks.FirstFailedTime()
}

// actionMeasure is the Event action of the metric checks.
const actionMeasure = "Measure"

func kindLabel(kind string) string {
	if kind == checks.ClusterKind {
		return "cluster"
	}
	return "namespaced"
}

func formatTime(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// cut shortens s to at most n bytes, at a rune boundary, marking the cut.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := n - len("…")
	for i > 0 && (s[i]&0xC0) == 0x80 {
		i--
	}
	return s[:i] + "…"
}
