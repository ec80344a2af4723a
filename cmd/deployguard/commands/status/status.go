package status

import (
	"context"
	"fmt"
	"io"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/cmd/deployguard/cli"
	"github.com/deployguard/deployguard/reconciler"
	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/snapshot"
	"github.com/deployguard/deployguard/reconciler/vocab"
)

// deploymentStatus is what `deployguard status` tells about one Deployment; its
// JSON form is `status -o json`.
type deploymentStatus struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Deleted: the Deployment does not exist; Record says whether the guard
	// kept a restorable record of it (in the guard's namespace).
	Deleted bool `json:"deleted,omitempty"`
	Record  bool `json:"record,omitempty"`

	Revision          int64  `json:"revision,omitempty"`
	KnownGoodRevision string `json:"knownGoodRevision,omitempty"`
	AutoRollback      bool   `json:"autoRollback"`
	// LastDecision is the guard's last decision about a failed rollout, in
	// words (annotation deployguard.io/rollback-status).
	LastDecision string `json:"lastDecision,omitempty"`
	// Verdict is set while a rollback by the guard stands: the Deployment
	// reads as failed to deploying tools (condition Stalled) until a new
	// template is applied or the rollback is accepted.
	Verdict *verdictStatus `json:"verdict,omitempty"`
	// ScaleUpStalled is the guard's report of a scale-up that never
	// completed (condition Stalled, reason ScaleUpStalled), in words.
	ScaleUpStalled string              `json:"scaleUpStalled,omitempty"`
	Revisions      []revisionStatus    `json:"revisions"`
	Quarantined    []quarantinedStatus `json:"quarantined"`
	Rollout        rolloutStatus       `json:"rollout"`
	// Checks is what the metric checks measured of the newest revision
	// they measured (the guard's ledger): nil when none did.
	Checks  *rollout.CheckRun `json:"checks,omitempty"`
	Cleanup *cleanupStatus    `json:"cleanup,omitempty"`
	// Events are the guard's events about the Deployment, oldest first.
	Events []guardEvent `json:"events"`
	// EventsUnavailable says why the events could not be read (RBAC); the
	// rest still is, from the objects' annotations.
	EventsUnavailable string `json:"eventsUnavailable,omitempty"`
}

// revisionStatus is one ReplicaSet of the Deployment, as `kubectl rollout
// history` lists it, with the guard's marks.
type revisionStatus struct {
	Revision     int64    `json:"revision"`
	ReplicaSet   string   `json:"replicaSet"`
	TemplateHash string   `json:"templateHash"`
	Current      bool     `json:"current,omitempty"`
	KnownGood    bool     `json:"knownGood,omitempty"`
	KnownGoodAt  string   `json:"knownGoodAt,omitempty"`
	Quarantined  bool     `json:"quarantined,omitempty"`
	Replicas     int32    `json:"replicas"`
	Ready        int32    `json:"ready"`
	Images       []string `json:"images"`
	ChangeCause  string   `json:"changeCause,omitempty"`
	// PreviousRevisions are the revisions this ReplicaSet had before a
	// rollback brought it back (deployment.kubernetes.io/revision-history).
	PreviousRevisions string `json:"previousRevisions,omitempty"`
	// Failure is set when the guard found this revision failing.
	Failure *revisionFailure `json:"failure,omitempty"`
	// Config is the config its template references, and what the guard
	// kept of it when the revision completed.
	Config []configStatus `json:"config,omitempty"`
}

// configStatus is one ConfigMap or Secret a revision references.
type configStatus struct {
	Kind string `json:"kind"`
	Name string `json:"name"`
	// Snapshot is the snapshot the guard kept of it when the revision
	// completed (known-good revisions); SnapshotOf, the object it is a
	// snapshot of, when the template references a snapshot (a revision
	// restored with its config).
	Snapshot   string `json:"snapshot,omitempty"`
	SnapshotOf string `json:"snapshotOf,omitempty"`
	// Absent: it did not exist when the revision completed; Skipped: why
	// no snapshot was kept.
	Absent  bool   `json:"absent,omitempty"`
	Skipped string `json:"skipped,omitempty"`
}

// revisionFailure says how a revision failed and what the guard did.
type revisionFailure struct {
	// By is "progress-deadline" or "fail-fast".
	By      string `json:"by"`
	Reason  string `json:"reason"` // the guard's event reason
	Message string `json:"message"`
	At      string `json:"at,omitempty"`
}

// verdictStatus is the guard's standing word on a rolled-back Deployment.
type verdictStatus struct {
	FailedRevision string `json:"failedRevision"`
	Message        string `json:"message"`
	// Accept is the command that accepts the rollback.
	Accept string `json:"accept"`
}

// quarantinedStatus is a pod template the webhook refuses until overridden.
type quarantinedStatus struct {
	Hash        string   `json:"hash"`
	ReplicaSets []string `json:"replicaSets,omitempty"`
	// Override is the annotation that lets this exact template back.
	Override string `json:"override"`
	Command  string `json:"command"`
}

// rolloutStatus is the rollout in progress (or the last one, completed).
type rolloutStatus struct {
	// State is complete, progressing, paused, deadline-exceeded or scaled-to-zero.
	State     string `json:"state"`
	Replicas  int32  `json:"replicas"`
	Updated   int32  `json:"updated"`
	Ready     int32  `json:"ready"`
	Available int32  `json:"available"`
	Message   string `json:"message,omitempty"`
	// FailingSince is when fail-fast first saw failure evidence on the new
	// pods (its window runs from then), and on which ReplicaSet.
	FailingSince      string `json:"failingSince,omitempty"`
	FailingReplicaSet string `json:"failingReplicaSet,omitempty"`
}

// cleanupStatus is the cleanup asked for on deletion, and its progress once
// the Deployment is being deleted.
type cleanupStatus struct {
	Deleting     bool     `json:"deleting"`
	DeletionTime string   `json:"deletionTime,omitempty"`
	PendingSteps []string `json:"pendingSteps"`
	SkipCleanup  bool     `json:"skipCleanup,omitempty"`
	DrainStarted string   `json:"drainStarted,omitempty"`
	// DrainReplicas is spec.replicas before the drain, which a restore brings back.
	DrainReplicas string `json:"drainReplicas,omitempty"`
	// OtherFinalizers are other controllers' finalizers, which the guard
	// leaves alone and the deletion waits for too.
	OtherFinalizers []string `json:"otherFinalizers,omitempty"`
	Pods            int32    `json:"pods"`
}

type guardEvent struct {
	Time    string `json:"time"`
	Type    string `json:"type"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// statusInput is everything status reads from the cluster.
type statusInput struct {
	Deployment  *appsv1.Deployment
	ReplicaSets []appsv1.ReplicaSet
	Events      []eventsv1.Event
}

// failureReasons are the guard's event reasons that tell a revision failed.
var failureReasons = map[string]bool{
	vocab.ReasonAutoRollback:        true,
	vocab.ReasonNoKnownGoodRevision: true,
	vocab.ReasonRollbackLoop:        true,
	vocab.ReasonRolloutFailing:      true,
	vocab.ReasonRollbackFailed:      true,
	vocab.ReasonCheckFailed:         true,
}

// The reconciler's messages name the failed revision's ReplicaSet first:
// "Revision 2 (ReplicaSet web-5c8b) …" or "Rolled back from revision 2
// (ReplicaSet web-5c8b) …".
var failedReplicaSetRE = regexp.MustCompile(`[Rr]evision \d+ \(ReplicaSet ([^)\s]+)\)`)

// buildStatus turns the fetched objects into the status; it talks to nothing.
func buildStatus(in statusInput) deploymentStatus {
	d := in.Deployment
	st := deploymentStatus{
		Namespace:         d.Namespace,
		Name:              d.Name,
		KnownGoodRevision: knownGoodRevision(d),
		AutoRollback:      d.Annotations[vocab.AnnotationAutoRollback] != "false",
		LastDecision:      d.Annotations[vocab.AnnotationRollbackStatus],
		Revisions:         []revisionStatus{},
		Quarantined:       []quarantinedStatus{},
		Events:            []guardEvent{},
	}
	st.Revision, _ = rollout.Revision(d)
	ledger, _ := rollout.ReadLedger(d)

	events := guardEventsOf(d, in.Events)
	failures := failuresByReplicaSet(events, st.LastDecision)

	quarantined := vocab.QuarantinedTemplates(d)
	rsByHash := map[string][]string{}
	currentHash := vocab.TemplateHash(&d.Spec.Template)
	for i := range in.ReplicaSets {
		rs := &in.ReplicaSets[i]
		if !metav1.IsControlledBy(rs, d) {
			continue
		}
		rev, _ := rollout.Revision(rs)
		hash := vocab.TemplateHash(&rs.Spec.Template)
		r := revisionStatus{
			Revision:          rev,
			ReplicaSet:        rs.Name,
			TemplateHash:      hash,
			Current:           hash == currentHash,
			KnownGood:         reconciler.IsKnownGood(d, rs),
			Quarantined:       slices.Contains(quarantined, hash),
			Replicas:          rs.Status.Replicas,
			Ready:             rs.Status.ReadyReplicas,
			Images:            images(&rs.Spec.Template),
			ChangeCause:       rs.Annotations["kubernetes.io/change-cause"],
			PreviousRevisions: rs.Annotations["deployment.kubernetes.io/revision-history"],
			Failure:           failures[rs.Name],
		}
		if e := ledger.KnownGoodEntryOf(rs); e != nil {
			r.KnownGoodAt = e.At
		}
		r.Config = configOf(rs, ledger)
		rsByHash[hash] = append(rsByHash[hash], rs.Name)
		st.Revisions = append(st.Revisions, r)
	}
	sort.Slice(st.Revisions, func(i, j int) bool { return st.Revisions[i].Revision < st.Revisions[j].Revision })

	for _, h := range quarantined {
		st.Quarantined = append(st.Quarantined, quarantinedStatus{
			Hash:        h,
			ReplicaSets: rsByHash[h],
			Override:    vocab.AnnotationAllowTemplate + "=" + h,
			Command:     fmt.Sprintf("kubectl annotate deployment -n %s %s %s=%s --overwrite", d.Namespace, d.Name, vocab.AnnotationAllowTemplate, h),
		})
	}
	st.Rollout = rolloutOf(d)
	st.Checks = ledger.Checks
	rss := make([]*appsv1.ReplicaSet, 0, len(in.ReplicaSets))
	for i := range in.ReplicaSets {
		if metav1.IsControlledBy(&in.ReplicaSets[i], d) {
			rss = append(rss, &in.ReplicaSets[i])
		}
	}
	if v := rollout.DecideVerdict(d, rss); v.Stalled {
		failed := strconv.FormatInt(ledger.RolledBackRevision, 10)
		st.Verdict = &verdictStatus{FailedRevision: failed, Message: v.Message,
			Accept: fmt.Sprintf("kubectl annotate deployment -n %s %s %s=%s", d.Namespace, d.Name, vocab.AnnotationAcceptRollback, failed)}
	}
	for _, c := range d.Status.Conditions {
		if c.Type == vocab.ConditionStalled && c.Status == corev1.ConditionTrue && c.Reason == vocab.ReasonScaleUpStalled {
			st.ScaleUpStalled = c.Message
		}
	}
	st.Cleanup = cleanupOf(d)
	for _, e := range events {
		st.Events = append(st.Events, guardEvent{Time: eventTime(e).UTC().Format(time.RFC3339), Type: e.Type, Reason: e.Reason, Message: e.Note})
	}
	return st
}

// configOf is the config rs's template references (Secrets included: only
// their names), with what the ledger recorded of it: the snapshot kept when
// rs completed, and which object a referenced snapshot was taken of.
func configOf(rs *appsv1.ReplicaSet, l rollout.Ledger) []configStatus {
	recorded := map[snapshot.Key]rollout.ConfigSnapshot{}
	if e := l.KnownGoodEntryOf(rs); e != nil {
		for _, c := range e.Config {
			recorded[snapshot.Key{Kind: c.Kind, Name: c.Name}] = c
		}
	}
	snapshotOf := map[snapshot.Key]string{}
	for _, e := range l.KnownGood {
		for _, c := range e.Config {
			if c.Snapshot != "" && c.Snapshot != c.Name {
				snapshotOf[snapshot.Key{Kind: c.Kind, Name: c.Snapshot}] = c.Name
			}
		}
	}
	var out []configStatus
	for _, ref := range snapshot.Refs(&rs.Spec.Template.Spec, true) {
		c := configStatus{Kind: ref.Kind, Name: ref.Name, SnapshotOf: snapshotOf[ref.Key()]}
		if rec, ok := recorded[ref.Key()]; ok {
			c.Absent, c.Skipped = rec.Absent, rec.Skipped
			if rec.Snapshot != rec.Name {
				c.Snapshot = rec.Snapshot
			}
		}
		out = append(out, c)
	}
	return out
}

// configWords says a revision's config for people.
func configWords(cs []configStatus) string {
	parts := make([]string, 0, len(cs))
	for _, c := range cs {
		w := c.Kind + " " + c.Name
		switch {
		case c.SnapshotOf != "":
			w += " (the guard's snapshot of " + c.SnapshotOf + ")"
		case c.Snapshot != "":
			w += " (kept as " + c.Snapshot + ")"
		case c.Absent:
			w += " (absent when it completed)"
		case c.Skipped != "":
			w += " (not kept: " + c.Skipped + ")"
		}
		parts = append(parts, w)
	}
	return strings.Join(parts, ", ")
}

// guardEventsOf returns the guard's events about d (this very object, by UID
// when the event has one), oldest first.
func guardEventsOf(d *appsv1.Deployment, all []eventsv1.Event) []eventsv1.Event {
	var out []eventsv1.Event
	for _, e := range all {
		if e.Regarding.Kind != "Deployment" || e.Regarding.Name != d.Name || (e.Regarding.UID != "" && e.Regarding.UID != d.UID) {
			continue
		}
		if !strings.Contains(e.ReportingController, "deployguard") {
			continue
		}
		out = append(out, e)
	}
	sort.SliceStable(out, func(i, j int) bool { return eventTime(out[i]).Before(eventTime(out[j])) })
	return out
}

func eventTime(e eventsv1.Event) time.Time {
	switch {
	case e.Series != nil && !e.Series.LastObservedTime.IsZero():
		return e.Series.LastObservedTime.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	case !e.DeprecatedLastTimestamp.IsZero():
		return e.DeprecatedLastTimestamp.Time
	}
	return e.CreationTimestamp.Time
}

// failuresByReplicaSet reads which ReplicaSets failed from the guard's events
// and, as events expire (an hour by default), from its last decision on the
// Deployment. Newer evidence about a ReplicaSet replaces older.
func failuresByReplicaSet(events []eventsv1.Event, lastDecision string) map[string]*revisionFailure {
	out := map[string]*revisionFailure{}
	if m := failedReplicaSetRE.FindStringSubmatch(lastDecision); m != nil {
		out[m[1]] = &revisionFailure{By: failedBy(lastDecision), Message: lastDecision}
	}
	for _, e := range events {
		if !failureReasons[e.Reason] {
			continue
		}
		m := failedReplicaSetRE.FindStringSubmatch(e.Note)
		if m == nil {
			continue
		}
		out[m[1]] = &revisionFailure{By: failedBy(e.Note), Reason: e.Reason, Message: e.Note, At: eventTime(e).UTC().Format(time.RFC3339)}
	}
	return out
}

// failedBy tells the progress deadline's decisions from fail-fast's and the
// metric checks' by the words the reconciler uses for each.
func failedBy(message string) string {
	if strings.Contains(message, "metric check ") {
		return "metric-check"
	}
	if strings.Contains(message, "progress deadline") {
		return "progress-deadline"
	}
	return "fail-fast"
}

func images(t *corev1.PodTemplateSpec) []string {
	out := []string{}
	for _, c := range t.Spec.Containers {
		out = append(out, c.Image)
	}
	return out
}

func rolloutOf(d *appsv1.Deployment) rolloutStatus {
	r := rolloutStatus{
		Replicas:  d.Status.Replicas,
		Updated:   d.Status.UpdatedReplicas,
		Ready:     d.Status.ReadyReplicas,
		Available: d.Status.AvailableReplicas,
	}
	if l, _ := rollout.ReadLedger(d); l.FailingSince != "" {
		at, rs, _ := strings.Cut(l.FailingSince, " ")
		r.FailingSince, r.FailingReplicaSet = at, rs
	}
	want := rollout.Replicas(d)
	progressing := rollout.ProgressingCondition(d)
	if progressing != nil {
		r.Message = progressing.Message
	}
	switch {
	case d.Spec.Paused:
		r.State = "paused"
	case d.Status.ObservedGeneration < d.Generation:
		r.State = "progressing"
		r.Message = "the Deployment controller has not yet seen the newest spec"
	case progressing != nil && progressing.Reason == vocab.ProgressDeadlineExceeded:
		r.State = "deadline-exceeded"
	case want == 0 && d.Status.Replicas == 0:
		r.State = "scaled-to-zero"
	case d.Status.UpdatedReplicas == want && d.Status.Replicas == want && d.Status.AvailableReplicas == want:
		r.State = "complete"
	default:
		r.State = "progressing"
	}
	return r
}

// cleanupOf is the cleanup asked for, and its progress when the Deployment is
// being deleted; nil when the Deployment asks for none and is not being deleted.
func cleanupOf(d *appsv1.Deployment) *cleanupStatus {
	pending := []string{}
	var others []string
	for _, f := range d.Finalizers {
		switch {
		case f == vocab.FinalizerRecord:
			pending = append(pending, vocab.StepRecord)
		case f == vocab.FinalizerDrain:
			pending = append(pending, vocab.StepDrain)
		case vocab.IsGuardFinalizer(f):
			pending = append(pending, f)
		default:
			others = append(others, f)
		}
	}
	if d.DeletionTimestamp == nil && len(pending) == 0 {
		return nil
	}
	c := &cleanupStatus{
		Deleting:        d.DeletionTimestamp != nil,
		PendingSteps:    pending,
		SkipCleanup:     d.Annotations[vocab.AnnotationSkipCleanup] == "true",
		DrainStarted:    d.Annotations[vocab.AnnotationDrainStarted],
		DrainReplicas:   d.Annotations[vocab.AnnotationDrainReplicas],
		OtherFinalizers: others,
		Pods:            d.Status.Replicas,
	}
	if d.DeletionTimestamp != nil {
		c.DeletionTime = d.DeletionTimestamp.UTC().Format(time.RFC3339)
	}
	return c
}

// printStatus writes the status for people.
func printStatus(w io.Writer, st deploymentStatus) {
	if st.Deleted {
		fmt.Fprintf(w, "Deployment %s/%s does not exist.\n", st.Namespace, st.Name)
		if st.Record {
			fmt.Fprintf(w, "deployguard kept a record of it: deployguard restore %s/%s\n", st.Namespace, st.Name)
		}
		return
	}
	kg := st.KnownGoodRevision
	if kg == "" {
		kg = "none yet"
	}
	fmt.Fprintf(w, "Deployment %s/%s: revision %d, known-good revision %s", st.Namespace, st.Name, st.Revision, kg)
	if !st.AutoRollback {
		fmt.Fprintf(w, ", automatic rollback off")
	}
	fmt.Fprintln(w)
	r := st.Rollout
	fmt.Fprintf(w, "Rollout: %s: %d updated, %d ready, %d available of %d\n", r.State, r.Updated, r.Ready, r.Available, r.Replicas)
	if r.Message != "" && r.State != "complete" {
		fmt.Fprintf(w, "  %s\n", r.Message)
	}
	if r.FailingSince != "" {
		fmt.Fprintf(w, "  fail-fast: new pods of ReplicaSet %s failing since %s\n", r.FailingReplicaSet, r.FailingSince)
	}
	if st.LastDecision != "" {
		fmt.Fprintf(w, "Last decision: %s\n", st.LastDecision)
	}
	if v := st.Verdict; v != nil {
		fmt.Fprintf(w, "Reads as failed (Stalled): revision %s was rolled back and is not running. Apply a fixed template, or accept the rollback: %s\n", v.FailedRevision, v.Accept)
	}
	if st.ScaleUpStalled != "" {
		fmt.Fprintf(w, "Scale-up stalled (Stalled, ScaleUpStalled): %s\n", st.ScaleUpStalled)
	}

	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "REVISION\tREPLICASET\tPODS\tSTATUS\tIMAGES\tCHANGE-CAUSE")
	for _, rv := range st.Revisions {
		fmt.Fprintf(tw, "%d\t%s\t%d/%d\t%s\t%s\t%s\n", rv.Revision, rv.ReplicaSet, rv.Ready, rv.Replicas, revisionMarks(rv), strings.Join(rv.Images, ","), orNone(rv.ChangeCause))
	}
	_ = tw.Flush()

	if c := st.Checks; c != nil {
		printChecks(w, c)
	}

	var withConfig []revisionStatus
	for _, rv := range st.Revisions {
		if len(rv.Config) > 0 {
			withConfig = append(withConfig, rv)
		}
	}
	if len(withConfig) > 0 {
		fmt.Fprintln(w, "\nConfig each revision runs with:")
		for _, rv := range withConfig {
			fmt.Fprintf(w, "  %d (%s): %s\n", rv.Revision, rv.ReplicaSet, configWords(rv.Config))
		}
	}

	var failed []revisionStatus
	for _, rv := range st.Revisions {
		if rv.Failure != nil {
			failed = append(failed, rv)
		}
	}
	if len(failed) > 0 {
		fmt.Fprintln(w, "\nFailed revisions:")
		for _, rv := range failed {
			fmt.Fprintf(w, "  %d (%s), %s: %s\n", rv.Revision, rv.ReplicaSet, rv.Failure.By, rv.Failure.Message)
		}
	}
	if len(st.Quarantined) > 0 {
		fmt.Fprintln(w, "\nQuarantined templates (the webhook refuses them until overridden):")
		for _, q := range st.Quarantined {
			from := ""
			if len(q.ReplicaSets) > 0 {
				from = " (ReplicaSet " + strings.Join(q.ReplicaSets, ", ") + ")"
			}
			fmt.Fprintf(w, "  %s%s: to bring it back deliberately, apply it with the annotation %s\n", q.Hash, from, q.Override)
		}
	}
	if c := st.Cleanup; c != nil {
		fmt.Fprintln(w)
		if !c.Deleting {
			fmt.Fprintf(w, "Cleanup on deletion: %s\n", strings.Join(c.PendingSteps, ", "))
		} else {
			fmt.Fprintf(w, "Being deleted since %s; %d pods left\n", c.DeletionTime, c.Pods)
			switch {
			case len(c.PendingSteps) > 0:
				fmt.Fprintf(w, "  cleanup steps left: %s (next: %s)\n", strings.Join(c.PendingSteps, ", "), c.PendingSteps[0])
			default:
				fmt.Fprintln(w, "  the guard's cleanup is done")
			}
			if c.DrainStarted != "" {
				fmt.Fprintf(w, "  drain started %s (replicas before: %s)\n", c.DrainStarted, c.DrainReplicas)
			}
			if c.SkipCleanup {
				fmt.Fprintf(w, "  %s=true: the steps are skipped\n", vocab.AnnotationSkipCleanup)
			}
			if len(c.OtherFinalizers) > 0 {
				fmt.Fprintf(w, "  also waiting for other finalizers: %s\n", strings.Join(c.OtherFinalizers, ", "))
			}
		}
	}
	if st.EventsUnavailable != "" {
		fmt.Fprintf(w, "\nEvents: not readable (%s)\n", st.EventsUnavailable)
	}
	if len(st.Events) > 0 {
		fmt.Fprintln(w, "\nEvents (deployguard):")
		for _, e := range st.Events {
			fmt.Fprintf(w, "  %s  %-7s  %s: %s\n", e.Time, e.Type, e.Reason, e.Message)
		}
	}
}

// printChecks prints what the metric checks measured of a revision: each
// metric's verdict (or "measuring"), its counts and its last value.
func printChecks(w io.Writer, c *rollout.CheckRun) {
	fmt.Fprintf(w, "\nMetric checks of revision %d (%s), measured since %s", c.Revision, c.ReplicaSet, c.Started)
	if c.BakeUntil != "" {
		fmt.Fprintf(w, ", baking until %s", c.BakeUntil)
	}
	fmt.Fprintln(w, ":")
	for _, m := range c.Metrics {
		phase := string(m.Phase)
		if phase == "" {
			phase = "measuring"
		}
		if m.DryRun {
			phase += " (dry run)"
		}
		fmt.Fprintf(w, "  %s: %s; %d measured (%d successful, %d failed, %d inconclusive), %d errors; last %s at %s",
			m.Key, phase, m.Counts.Count, m.Counts.Successful, m.Counts.Failed, m.Counts.Inconclusive, m.Counts.Error, orNone(m.Value), m.Last)
		if m.Message != "" {
			fmt.Fprintf(w, "; %s", m.Message)
		}
		fmt.Fprintln(w)
	}
	if c.Evidence != "" {
		fmt.Fprintf(w, "  failed the revision: %s\n", c.Evidence)
	}
}

func revisionMarks(rv revisionStatus) string {
	var m []string
	if rv.Current {
		m = append(m, "current")
	}
	if rv.KnownGood {
		m = append(m, "known-good")
	}
	if rv.Failure != nil {
		m = append(m, "failed ("+rv.Failure.By+")")
	}
	if rv.Quarantined {
		m = append(m, "quarantined")
	}
	if rv.PreviousRevisions != "" {
		m = append(m, "was "+rv.PreviousRevisions)
	}
	if len(m) == 0 {
		return "-"
	}
	return strings.Join(m, ",")
}

func orNone(s string) string {
	if s == "" {
		return "<none>"
	}
	return s
}

// NewCommand is `deployguard status NAMESPACE/NAME` (and `kubectl
// deployguard status`).
func NewCommand(s cli.Streams) *cobra.Command {
	var output, drain, guardNamespace string
	cluster := cli.NewCluster()
	cmd := cli.NewClusterCommand(s, cluster, &cobra.Command{
		Use:   "status [flags] NAMESPACE/NAME | NAME -n NAMESPACE | --drain NODE",
		Short: "revisions, known-good and failed ones, quarantine, rollout and cleanup of a Deployment",
		Long: `Shows what deployguard knows about a Deployment: its revisions (which are
known-good, which failed and why, which templates are quarantined and the
annotation that overrides the quarantine), the rollout in progress, and the
cleanup of a Deployment being deleted.

With --drain, lists instead the Deployments whose pods on NODE the Eviction
API would refuse now (a PodDisruptionBudget that allows no disruption, more
than one budget on a pod), and why: where a drain of the node would stop.`,
		Example: `  kubectl deployguard status shop/web
  kubectl deployguard status web -n shop -o json
  kubectl deployguard status --drain node-1`,
		ValidArgsFunction: func(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
			return cluster.CompleteDeployment(cmd, args, toComplete)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != "text" && output != "json" {
				return cli.Usage(cmd, "-o is text or json")
			}
			if drain != "" {
				if len(args) > 0 {
					return cli.Usage(cmd, "--drain NODE takes no Deployment")
				}
				return cluster.Do(cmd, time.Minute, func(ctx context.Context, c client.Client) error {
					st, err := fetchDrain(ctx, c, drain)
					if err == nil {
						write(s.Out, output, st, func() { printDrain(s.Out, st) })
					}
					return err
				})
			}
			ns, name, err := cli.NamespacedName(args, cluster)
			if err != nil {
				return cli.ArgsError(cmd, err)
			}
			return cluster.Do(cmd, time.Minute, func(ctx context.Context, c client.Client) error {
				st, err := fetchStatus(ctx, c, guardNamespace, ns, name)
				if err == nil {
					write(s.Out, output, st, func() { printStatus(s.Out, st) })
				}
				return err
			})
		},
	})
	cmd.Flags().StringVarP(&output, "output", "o", "text", "output format: text or json")
	cmd.Flags().StringVar(&drain, "drain", "", "a node: list the Deployments whose pods on it cannot be evicted now, and why")
	cmd.Flags().StringVar(&guardNamespace, "guard-namespace", "deployguard-system", "the guard's own namespace (deployguard serve --namespace), where the records of deleted Deployments are")
	cli.CompleteWords(cmd, "output", "text", "json")
	return cmd
}

// write prints v as indented JSON for -o json, otherwise as text does.
func write(w io.Writer, output string, v any, text func()) {
	if output != "json" {
		text()
		return
	}
	cli.WriteJSON(w, v)
}

// fetchStatus reads the Deployment, its ReplicaSets and the events of its
// namespace, and builds the status; of a Deployment that is gone, whether the
// guard's namespace holds its record.
func fetchStatus(ctx context.Context, c client.Client, guardNamespace, ns, name string) (deploymentStatus, error) {
	d := &appsv1.Deployment{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, d); err != nil {
		if !apierrors.IsNotFound(err) {
			return deploymentStatus{}, fmt.Errorf("reading Deployment %s/%s: %w", ns, name, err)
		}
		st := deploymentStatus{Namespace: ns, Name: name, Deleted: true}
		cm := &corev1.ConfigMap{}
		switch err := c.Get(ctx, client.ObjectKey{Namespace: guardNamespace, Name: reconciler.RecordName(ns, name)}, cm); {
		case err == nil:
			of, ok := reconciler.RecordOf(cm)
			st.Record = ok && of == client.ObjectKey{Namespace: ns, Name: name}
		case !apierrors.IsNotFound(err):
			return deploymentStatus{}, fmt.Errorf("reading the record of Deployment %s/%s: %w", ns, name, err)
		}
		return st, nil
	}
	in := statusInput{Deployment: d}
	var rss appsv1.ReplicaSetList
	if err := c.List(ctx, &rss, client.InNamespace(ns)); err != nil {
		return deploymentStatus{}, fmt.Errorf("listing the ReplicaSets of %s/%s: %w", ns, name, err)
	}
	in.ReplicaSets = rss.Items
	var events eventsv1.EventList
	// The events API selects on regarding only through the core/v1 field
	// names; listing the namespace and filtering is as cheap for one object.
	var unavailable string
	switch err := c.List(ctx, &events, client.InNamespace(ns)); {
	case apierrors.IsForbidden(err):
		// Events only add detail and time; the decisions are annotations.
		unavailable = err.Error()
	case err != nil:
		return deploymentStatus{}, fmt.Errorf("listing the events of %s/%s: %w", ns, name, err)
	}
	in.Events = events.Items
	st := buildStatus(in)
	st.EventsUnavailable = unavailable
	return st, nil
}

// knownGoodRevision is the revision of the ledger's newest known-good entry,
// "" when there is none.
func knownGoodRevision(d *appsv1.Deployment) string {
	l, _ := rollout.ReadLedger(d)
	if n := l.Newest(); n != nil {
		return strconv.FormatInt(n.Revision, 10)
	}
	return ""
}
