// Package vocab holds the names that deployguard's webhooks and reconciler share:
// finalizers, annotations, labels, event reasons and the identity of a pod template.
// Keeping them in one place means the two halves of the guard can never disagree
// about what a name means.
package vocab

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// Domain is the guard's own name domain; every annotation, label and finalizer of
// the guard lives under it.
const Domain = "deployguard.io"

// The guard's cleanup finalizers. The reconciler runs one step per finalizer, in
// the order of metadata.finalizers; the mutating webhook adds them in canonical
// order (record, then drain), and only to a Deployment that asks for its
// cleanup (AnnotationCleanup, or the cluster's default steps): a finalizer
// holds a deletion, and deletion must stay deletion for every client that did
// not ask otherwise.
const (
	// FinalizerRecord saves a restorable record of the Deployment. It runs
	// first, while the Deployment and its ReplicaSets are still whole.
	FinalizerRecord = Domain + "/record"
	// FinalizerDrain scales the Deployment to zero and waits until every one of
	// its pods has been told to stop.
	FinalizerDrain = Domain + "/drain"
)

// Cleanup steps, as AnnotationCleanup and the config file name them.
const (
	StepRecord = "record"
	StepDrain  = "drain"
	// StepNone in AnnotationCleanup asks for no cleanup, whatever the
	// cluster's default.
	StepNone = "none"
)

// CanonicalFinalizers returns the guard's finalizers in the order their steps run.
// A new slice each call, so callers may modify it.
func CanonicalFinalizers() []string {
	return []string{FinalizerRecord, FinalizerDrain}
}

// stepFinalizers maps each step to its finalizer, in canonical order.
var stepFinalizers = []struct{ step, finalizer string }{
	{StepRecord, FinalizerRecord},
	{StepDrain, FinalizerDrain},
}

// CleanupSteps returns every value AnnotationCleanup accepts in its list.
func CleanupSteps() []string { return []string{StepRecord, StepDrain, StepNone} }

// ParseCleanupSteps parses a comma-separated list of cleanup steps (the value
// of AnnotationCleanup) into the finalizers that run them, in canonical order
// whatever the order written. "none" alone, or an empty list, gives none. An
// unknown step is an error that names it, so that a typo never silently
// leaves a Deployment without the cleanup its owner asked for.
func ParseCleanupSteps(s string) ([]string, error) {
	want := map[string]bool{}
	for _, x := range strings.Split(s, ",") {
		x = strings.ToLower(strings.TrimSpace(x))
		switch x {
		case "":
		case StepRecord, StepDrain, StepNone:
			want[x] = true
		default:
			return nil, fmt.Errorf("unknown cleanup step %q: the steps are %q and %q (comma-separated), or %q", x, StepRecord, StepDrain, StepNone)
		}
	}
	if want[StepNone] && len(want) > 1 {
		return nil, fmt.Errorf("%q cannot be combined with other cleanup steps", StepNone)
	}
	var out []string
	for _, sf := range stepFinalizers {
		if want[sf.step] {
			out = append(out, sf.finalizer)
		}
	}
	return out, nil
}

// DesiredFinalizers returns the guard's finalizers a live Deployment should
// carry, in canonical order: the steps of its AnnotationCleanup when it has
// one, otherwise the cluster's default (finalizers, as ParseCleanupSteps
// returns them). An annotation that does not parse is an error; callers then
// leave the finalizers as they are.
func DesiredFinalizers(annotations map[string]string, clusterDefault []string) ([]string, error) {
	v, ok := annotations[AnnotationCleanup]
	if !ok {
		return slices.Clone(clusterDefault), nil
	}
	return ParseCleanupSteps(v)
}

// IsCleanupFinalizer reports whether f is one of the guard's cleanup
// finalizers (a known one; IsGuardFinalizer also covers unknown names in the
// guard's domain).
func IsCleanupFinalizer(f string) bool { return f == FinalizerRecord || f == FinalizerDrain }

// WithGuardFinalizers returns finalizers with the guard's cleanup finalizers
// set to want (in want's order, after the others, which keep their places),
// and whether that changed anything. The input is not modified.
func WithGuardFinalizers(finalizers, want []string) ([]string, bool) {
	if slices.Equal(GuardFinalizers(finalizers), want) {
		return finalizers, false
	}
	out := append(slices.DeleteFunc(slices.Clone(finalizers), IsCleanupFinalizer), want...)
	if len(out) == 0 {
		out = nil
	}
	return out, true
}

// GuardFinalizers returns the guard's cleanup finalizers in f, in their order.
func GuardFinalizers(f []string) []string {
	var out []string
	for _, x := range f {
		if IsCleanupFinalizer(x) {
			out = append(out, x)
		}
	}
	return out
}

// IsGuardFinalizer reports whether f is in the guard's domain (known or not).
func IsGuardFinalizer(f string) bool {
	return len(f) > len(Domain)+1 && f[:len(Domain)+1] == Domain+"/"
}

// Annotations on Deployments, then those of earlier releases.
const (
	// AnnotationDefaulted lists, comma-separated, the fields the mutating webhook
	// filled in, so a user can see why the stored object differs from the manifest.
	AnnotationDefaulted = Domain + "/defaulted"
	// AnnotationAutoRollback set to "false" turns automatic rollback off.
	AnnotationAutoRollback = Domain + "/auto-rollback"
	// AnnotationRollbackStatus says, in words, what the guard last decided about a
	// failed rollout and why (no known-good revision, loop stopped, …).
	AnnotationRollbackStatus = Domain + "/rollback-status"
	// AnnotationQuarantinedTemplates lists, comma-separated, the hashes of pod
	// templates whose rollout failed its deadline.
	AnnotationQuarantinedTemplates = Domain + "/quarantined-templates"
	// AnnotationAllowTemplate names one quarantined template hash that the user
	// deliberately brings back.
	AnnotationAllowTemplate = Domain + "/allow-template"
	// AnnotationProtected set to "true" makes the validating webhook refuse DELETE.
	AnnotationProtected = Domain + "/protected"
	// AnnotationFailFast set to "false" turns fail-fast off for a Deployment
	// (it then waits for its progress deadline); a duration ("5m") sets its
	// window instead of the cluster's.
	AnnotationFailFast = Domain + "/fail-fast"
	// AnnotationCleanup asks for the guard's cleanup on deletion: a
	// comma-separated list of steps ("record", "drain") or "none". Without it,
	// the cluster's default applies (none unless the platform team configures
	// cleanup.steps). Only a Deployment that asks carries the guard's
	// finalizers, so only its deletion waits for the steps.
	AnnotationCleanup = Domain + "/cleanup"
	// AnnotationSkipCleanup set to "true" on a Deployment makes the guard remove
	// its finalizers on deletion without running the cleanup steps.
	AnnotationSkipCleanup = Domain + "/skip-cleanup"
	// AnnotationDrainStarted is the RFC 3339 time at which the guard started
	// draining a Deployment being deleted; the drain timeout counts from it, across
	// restarts of the guard.
	AnnotationDrainStarted = Domain + "/drain-started"
	// AnnotationDrainReplicas is spec.replicas as it was before the drain scaled
	// the Deployment to zero; the record restores it.
	AnnotationDrainReplicas = Domain + "/drain-replicas"
	// AnnotationAcceptRollback set to the failed revision (the guard's
	// rollback Event, its Stalled condition and the LabelRolledBack label
	// name it) says a person accepts the guard's rollback
	// of it: the Deployment no longer reads as failed. The revision, not
	// "true", so that a value kept in a manifest never hides the next failure.
	AnnotationAcceptRollback = Domain + "/accept-rollback"

	// Annotations of earlier releases, which kept the reconciler's facts where
	// any tenant can write them and where upstream copies them (the Deployment
	// controller onto new ReplicaSets, `kubectl rollout undo` back onto the
	// Deployment). This release keeps them in the Deployment's status
	// (ConditionLedger) and reads these only once, to adopt an earlier release's
	// history (reconciler.AdoptLegacy); it never writes them.
	//
	// On ReplicaSets: the RFC 3339 time the rollout completed, and the
	// ReplicaSet's own pod-template-hash (which told the mark from a copy).
	LegacyAnnotationKnownGood     = Domain + "/known-good"
	LegacyAnnotationKnownGoodHash = Domain + "/known-good-hash"
	// On Deployments: the newest known-good revision, the revision rolled back
	// from and the ReplicaSet restored, the revision fail-fast decided about,
	// the deadline decided about and when failure evidence was first seen.
	LegacyAnnotationKnownGoodRevision  = Domain + "/known-good-revision"
	LegacyAnnotationRolledBackRevision = Domain + "/rolled-back-revision"
	LegacyAnnotationRolledBackTo       = Domain + "/rolled-back-to"
	LegacyAnnotationFailFastRevision   = Domain + "/fail-fast-revision"
	LegacyAnnotationHandledDeadline    = Domain + "/handled-deadline"
	LegacyAnnotationFailingSince       = Domain + "/failing-since"
)

// ConditionLedger is the type of the Deployment status condition in which the
// reconciler keeps every fact it acts on (rollout.Ledger, as JSON in the
// message). Tenants cannot write a Deployment's status, upstream copies no
// condition anywhere, and the Deployment controller keeps condition types it
// does not own.
const ConditionLedger = Domain + "/Ledger"

// Annotations on the record ConfigMaps the cleanup's record step writes, in
// the guard's own namespace.
const (
	// AnnotationRecordOf is the name of the Deployment the record was made of.
	AnnotationRecordOf = Domain + "/record-of"
	// AnnotationRecordNamespace is the namespace of the Deployment the record
	// was made of, where `deployguard restore` recreates it. An earlier
	// release's records, in the Deployment's own namespace, have none.
	AnnotationRecordNamespace = Domain + "/record-namespace"
	// AnnotationRecordUID is the UID of the deleted Deployment: a record of the
	// same UID is already done; one of another UID is an earlier Deployment of the
	// same name, which the new record replaces.
	AnnotationRecordUID = Domain + "/record-uid"
	// AnnotationRecordExpires is the RFC 3339 time after which the guard deletes
	// the record (the configured retention after it was made).
	AnnotationRecordExpires = Domain + "/record-expires"
	// AnnotationRecordBytes is the size of the record's data in bytes (keys
	// and values, as the API server counts a ConfigMap's): what the record
	// takes of its namespace's budget, read from a metadata-only list.
	AnnotationRecordBytes = Domain + "/record-bytes"
	// LabelRecordNamespace, on a record, is the namespace of the Deployment
	// it was made of (as AnnotationRecordNamespace), so that the records of
	// one namespace are listed by a label selector, metadata only, to keep
	// them within their budget. Records of earlier releases have none.
	LabelRecordNamespace = Domain + "/record-namespace"
)

// Annotations on config snapshots (LabelSnapshot): immutable copies of the
// ConfigMaps (and Secrets) a known-good revision ran with, in its namespace,
// owned by its ReplicaSet (package reconciler/snapshot). Tenants can write
// these too: the guard trusts a snapshot only by its name and recomputed
// content hash, recorded in its ledger.
const (
	// AnnotationSnapshotOf names the object a snapshot was taken of.
	AnnotationSnapshotOf = Domain + "/snapshot-of"
	// AnnotationSnapshotHash is the content hash of its data, for people:
	// the guard recomputes it.
	AnnotationSnapshotHash = Domain + "/snapshot-hash"
)

// Labels.
const (
	// LabelGuard set to "disabled" on a namespace takes it out of the guard's
	// webhooks and reconciler.
	LabelGuard = Domain + "/guard"
	// LabelGuardDisabled is the value of LabelGuard that opts a namespace out.
	LabelGuardDisabled = "disabled"
	// LabelRolledBack, on a Deployment, says the guard's rollback verdict
	// stands (its value is the failed revision). It
	// lets the API server send the guard the status writes of those
	// Deployments alone (the verdict webhook's objectSelector), and lets a
	// person list them: kubectl get deploy -A -l deployguard.io/rolled-back.
	LabelRolledBack = Domain + "/rolled-back"
	// LabelQuarantined, on a Deployment, says that it has quarantined
	// templates (AnnotationQuarantinedTemplates; its value is "true"). The
	// failing-closed validating webhook entry selects on it
	// (objectSelector), so that the API server spends nothing on the
	// updates of the other Deployments for the quarantine; a person lists
	// them with kubectl get deploy -A -l deployguard.io/quarantined.
	LabelQuarantined = Domain + "/quarantined"
	// LabelQuarantinedValue is LabelQuarantined's value.
	LabelQuarantinedValue = "true"
	// LabelPolicy set to "true" on a ConfigMap in the guard's namespace makes its
	// data a Rego policy.
	LabelPolicy = Domain + "/policy"
	// LabelRecord set to "true" marks a ConfigMap as a restorable record of a
	// deleted Deployment (`deployguard restore NAMESPACE/NAME`). The guard
	// reads and sweeps records in its own namespace only: the label on a
	// ConfigMap elsewhere, which a tenant can write, makes nothing of it.
	LabelRecord = Domain + "/record"
	// LabelSnapshot set to "true" marks a config snapshot (kubectl get cm -l
	// deployguard.io/snapshot lists them).
	LabelSnapshot = Domain + "/snapshot"
)

// Upstream Deployment condition reasons (k8s.io/kubernetes
// pkg/controller/deployment/util), repeated here because that package is not a
// library.
const (
	NewReplicaSetAvailable   = "NewReplicaSetAvailable"
	ProgressDeadlineExceeded = "ProgressDeadlineExceeded"
	DeploymentPaused         = "DeploymentPaused"
	DeploymentResumed        = "DeploymentResumed"
	// RevisionAnnotation is the revision of a ReplicaSet and its Deployment.
	RevisionAnnotation = "deployment.kubernetes.io/revision"
)

// ConditionStalled is the condition type kstatus (sigs.k8s.io/cli-utils, and
// Flux's and Helm 4's copies of it) reads, on any kind, before the kind's own
// rules: Stalled=True is Failed. The Deployment controller copies conditions
// it does not own from one sync to the next (calculateStatus), so the guard's
// verdict on a rollback it made survives the rollout it starts. Its reason is
// ReasonAutoRollback.
const ConditionStalled = "Stalled"

// Event reasons the guard emits.
const (
	ReasonKnownGood           = "KnownGoodRevision"
	ReasonAutoRollback        = "AutoRollback"
	ReasonNoKnownGoodRevision = "NoKnownGoodRevision"
	ReasonRollbackFailed      = "RollbackFailed"
	ReasonRollbackLoop        = "RollbackLoopStopped"
	// ReasonRollbackRefused: the known-good template is one the admission
	// policies in force refuse (changed since it ran); the guard does not
	// restore it.
	ReasonRollbackRefused = "RollbackRefusedByPolicy"
	// ReasonAnnotationsIgnored: a Deployment or its ReplicaSets carry
	// annotations the guard ignores (an earlier release's marks, forged or
	// copied); said once.
	ReasonAnnotationsIgnored = "AnnotationsIgnored"
	// ReasonRolloutFailing: fail-fast found a rollout failing and did not
	// roll it back (automatic rollback is off for it).
	ReasonRolloutFailing = "RolloutFailing"
	// Metric checks (reconciler/analysis): a check failed a revision
	// (MetricCheckFailed; rolled back unless in dry run or without a
	// known-good revision), could not judge it (MetricCheckInconclusive),
	// could not measure it (MetricCheckError: Prometheus unreachable, a
	// query that errs; past consecutiveErrorLimit the revision is
	// unchecked), or measured it and passed (MetricCheckPassed, at the end
	// of the bake window). A check that selects a Deployment but cannot be
	// compiled is MetricCheckInvalid. Inconclusive and Error never roll back.
	ReasonCheckFailed       = "MetricCheckFailed"
	ReasonCheckInconclusive = "MetricCheckInconclusive"
	ReasonCheckError        = "MetricCheckError"
	ReasonCheckPassed       = "MetricCheckPassed"
	ReasonCheckInvalid      = "MetricCheckInvalid"
	// ReasonRollbackDeferred: a rollout past its progress deadline whose new
	// pods fail only transiently (a registry blip) is not rolled back before
	// the transient window ends.
	ReasonRollbackDeferred = "RollbackDeferred"
	// ReasonScaleUpStalled: a Deployment whose template did not change has
	// stayed short of its replicas past its progress deadline, its missing
	// pods failing (the Stalled condition's reason and the Event's).
	// ReasonScaleUpRecovered: it is back at its replicas, or scaled down.
	// ReasonConfigNotKept: a revision recorded known-good references config
	// the guard kept no snapshot of (over the bound, or refused); a rollback
	// to it restores the template alone for that config.
	ReasonConfigNotKept    = "ConfigSnapshotSkipped"
	ReasonScaleUpStalled   = "ScaleUpStalled"
	ReasonScaleUpRecovered = "ScaleUpRecovered"

	// Cleanup on deletion, one step per finalizer.
	ReasonDrainStarted     = "DrainStarted"
	ReasonDrained          = "Drained"
	ReasonDrainTimedOut    = "DrainTimedOut"
	ReasonDrainSkipped     = "DrainSkipped"
	ReasonRecorded         = "Recorded"
	ReasonRecordFailed     = "RecordFailed"
	ReasonRecordsEvicted   = "RecordsEvicted"
	ReasonCleanupSkipped   = "CleanupSkipped"
	ReasonCleanupShortened = "CleanupShortened"
	ReasonUnknownFinalizer = "UnknownFinalizerRemoved"
	ReasonScaleRefused     = "ScaleRefused"
	ReasonRemovalRefused   = "FinalizerRemovalRefused"
)

// TemplateHash identifies a pod template for quarantine: the same template, as
// stored by the API server, always gives the same hash, and the ReplicaSet's
// pod-template-hash label is ignored so that a ReplicaSet's template and its
// Deployment's template compare equal.
func TemplateHash(t *corev1.PodTemplateSpec) string {
	c := t.DeepCopy()
	delete(c.Labels, appsv1.DefaultDeploymentUniqueLabelKey)
	if len(c.Labels) == 0 {
		c.Labels = nil
	}
	// encoding/json sorts map keys, so equal templates marshal to equal bytes.
	b, err := json.Marshal(c)
	if err != nil {
		// A PodTemplateSpec always marshals; keep the function total anyway.
		return ""
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// QuarantinedTemplates returns the template hashes listed in the Deployment's
// AnnotationQuarantinedTemplates, oldest first, without empty entries. It returns
// nil when there are none.
func QuarantinedTemplates(d *appsv1.Deployment) []string {
	return SplitList(d.Annotations[AnnotationQuarantinedTemplates])
}

// Quarantined reports whether d has quarantined templates: whether it
// should carry LabelQuarantined.
func Quarantined(d *appsv1.Deployment) bool {
	return len(QuarantinedTemplates(d)) > 0
}

// SplitList splits a comma-separated list (template hashes, a flag's names), dropping
// blanks and surrounding spaces.
func SplitList(s string) []string {
	var out []string
	for _, h := range strings.Split(s, ",") {
		if h = strings.TrimSpace(h); h != "" {
			out = append(out, h)
		}
	}
	return out
}
