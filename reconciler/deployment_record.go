package reconciler

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
)

// Keys of a record ConfigMap's data.
const (
	// RecordKeyDeployment is the Deployment to recreate, as YAML: its name,
	// labels, user annotations and spec, with the replica count it had before
	// the drain.
	RecordKeyDeployment = "deployment.yaml"
	// RecordKeyKnownGoodTemplate is the pod template of the newest known-good
	// ReplicaSet, as YAML (`kubectl rollout undo` form: no pod-template-hash).
	// Absent when no revision had completed.
	RecordKeyKnownGoodTemplate = "known-good-template.yaml"
	// RecordKeyRevision is the Deployment's revision when it was deleted.
	RecordKeyRevision = "revision"
	// RecordKeyKnownGoodRevision is the revision of the known-good template.
	RecordKeyKnownGoodRevision = "known-good-revision"
)

// recordPrefix starts the name of every record ConfigMap.
const recordPrefix = "deployguard-record-"

// RecordName is the name of the ConfigMap, in the guard's own namespace, that
// holds the record of Deployment namespace/deployment:
// deployguard-record-NAMESPACE.NAME. A namespace name holds no dot, so no two
// Deployments share a record's name. A name too long for a ConfigMap (253
// characters) is cut and ends with a hash of the namespace and name; the
// record's annotations (RecordOf) say whose it is.
func RecordName(namespace, deployment string) string {
	return fitRecordName(recordPrefix+namespace+"."+deployment, namespace+"/"+deployment, 8)
}

// LegacyRecordName is the name an earlier release gave the record of the
// Deployment named deployment, in the Deployment's own namespace, where
// anyone who may write ConfigMaps there could have written it. Only
// `deployguard restore --legacy-record` reads it.
func LegacyRecordName(deployment string) string {
	return fitRecordName(recordPrefix+deployment, deployment, 4)
}

// fitRecordName returns name, or, when it is too long for a ConfigMap, name
// cut and ended with the first hashBytes bytes of the SHA-256 of key, in hex.
func fitRecordName(name, key string, hashBytes int) string {
	if len(name) <= validation.DNS1123SubdomainMaxLength {
		return name
	}
	sum := sha256.Sum256([]byte(key))
	suffix := "-" + hex.EncodeToString(sum[:hashBytes])
	return strings.TrimRight(name[:validation.DNS1123SubdomainMaxLength-len(suffix)], ".-") + suffix
}

// RecordOf returns the Deployment a record was made of, from its
// annotations; false when cm is not a record (no label vocab.LabelRecord=true)
// or does not name both the Deployment's namespace and name, as an earlier
// release's records do not.
func RecordOf(cm *corev1.ConfigMap) (types.NamespacedName, bool) {
	key := types.NamespacedName{Namespace: cm.Annotations[vocab.AnnotationRecordNamespace], Name: cm.Annotations[vocab.AnnotationRecordOf]}
	if cm.Labels[vocab.LabelRecord] != "true" || key.Namespace == "" || key.Name == "" {
		return types.NamespacedName{}, false
	}
	return key, true
}

// RecordAction is what the record step does now.
type RecordAction string

// The actions that write the record.
const (
	// RecordCreate creates the record.
	RecordCreate RecordAction = "Create"
	// RecordReplace overwrites the record of an earlier Deployment of the same
	// name (another UID) with this one's.
	RecordReplace RecordAction = "Replace"
)

// The actions that write nothing: the step ends, or is given up.
const (
	// RecordSkip: the namespace is terminating, and refuses new ConfigMaps.
	RecordSkip RecordAction = "Skip"
	// RecordDone: this Deployment's record exists (a guard restarted between
	// writing it and removing the finalizer).
	RecordDone RecordAction = "Done"
	// RecordNameTaken: a ConfigMap that is not a record has the name; the guard
	// does not overwrite it, and gives the step up.
	RecordNameTaken RecordAction = "NameTaken"
	// RecordOfAnother: a record of another Deployment has the name (two long
	// names whose hashes meet, or a record written by hand); the guard does
	// not overwrite it, and gives the step up.
	RecordOfAnother RecordAction = "OfAnother"
)

// DecideRecord decides the record step of Deployment key, of the given UID,
// from the ConfigMap that has the record's name (nil if none).
func DecideRecord(existing *corev1.ConfigMap, key types.NamespacedName, uid types.UID, namespaceTerminating bool) RecordAction {
	switch {
	case namespaceTerminating:
		return RecordSkip
	case existing == nil:
		return RecordCreate
	case existing.Labels[vocab.LabelRecord] != "true":
		return RecordNameTaken
	}
	if of, ok := RecordOf(existing); !ok || of != key {
		return RecordOfAnother
	}
	if existing.Annotations[vocab.AnnotationRecordUID] == string(uid) {
		return RecordDone
	}
	return RecordReplace
}

// restoreSkipAnnotations are the Deployment annotations a record does not keep:
// the Deployment controller's revision bookkeeping and the guard's state about
// the deleted object. What the user chose (protection, opt-outs, the
// quarantine list, change-cause, kubectl's last-applied configuration) is kept.
var restoreSkipAnnotations = map[string]bool{
	vocab.RevisionAnnotation:                    true,
	"deployment.kubernetes.io/revision-history": true,
	vocab.AnnotationDefaulted:                   true,
	vocab.AnnotationRollbackStatus:              true,
	vocab.AnnotationDrainStarted:                true,
	vocab.AnnotationDrainReplicas:               true,
	vocab.AnnotationSkipCleanup:                 true,
	// An earlier release's state (isLegacyMark), and copies of it.
	vocab.LegacyAnnotationKnownGoodRevision:  true,
	vocab.LegacyAnnotationRolledBackRevision: true,
	vocab.LegacyAnnotationRolledBackTo:       true,
	vocab.LegacyAnnotationHandledDeadline:    true,
	vocab.LegacyAnnotationFailFastRevision:   true,
	vocab.LegacyAnnotationFailingSince:       true,
	vocab.LegacyAnnotationKnownGood:          true,
	vocab.LegacyAnnotationKnownGoodHash:      true,
}

// withoutRolledBack is labels without the guard's rollback verdict, which
// is about the deleted object (a copy when there was one to remove).
func withoutRolledBack(labels map[string]string) map[string]string {
	if _, ok := labels[vocab.LabelRolledBack]; !ok {
		return labels
	}
	out := maps.Clone(labels)
	delete(out, vocab.LabelRolledBack)
	return out
}

// RestorableDeployment is the Deployment a record recreates: name, namespace,
// labels, the annotations the user chose, and the spec, with the replica count
// it had before the drain scaled it to zero. No status, finalizers (the
// mutating webhook adds them again) or server-set fields.
func RestorableDeployment(d *appsv1.Deployment) *appsv1.Deployment {
	out := &appsv1.Deployment{
		TypeMeta: metav1.TypeMeta{APIVersion: appsv1.SchemeGroupVersion.String(), Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      d.Name,
			Namespace: d.Namespace,
			Labels:    withoutRolledBack(d.Labels),
		},
		Spec: *d.Spec.DeepCopy(),
	}
	for k, v := range d.Annotations {
		if !restoreSkipAnnotations[k] {
			if out.Annotations == nil {
				out.Annotations = map[string]string{}
			}
			out.Annotations[k] = v
		}
	}
	if n, ok := drainReplicas(d); ok {
		out.Spec.Replicas = &n
	}
	return out
}

// NewestKnownGood returns the ReplicaSet of the ledger's newest known-good
// entry, the template that last completed a rollout, with its revision; nil
// when there is none, or when that ReplicaSet is gone or changed since.
func NewestKnownGood(d *appsv1.Deployment, rss []*appsv1.ReplicaSet) (*appsv1.ReplicaSet, int64) {
	l, _ := rollout.ReadLedger(d)
	n := l.Newest()
	if n == nil {
		return nil, -1
	}
	for _, rs := range rss {
		if l.KnownGoodEntryOf(rs) == n {
			v, _ := rollout.Revision(rs)
			return rs, v
		}
	}
	return nil, -1
}

// BuildRecord makes the record ConfigMap of a Deployment being deleted, from
// the Deployment and its ReplicaSets, in namespace (the guard's own), to
// expire at expires.
func BuildRecord(d *appsv1.Deployment, rss []*appsv1.ReplicaSet, namespace string, expires time.Time) (*corev1.ConfigMap, error) {
	manifest, err := yaml.Marshal(RestorableDeployment(d))
	if err != nil {
		return nil, fmt.Errorf("encoding the Deployment: %w", err)
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{
			Name:      RecordName(d.Namespace, d.Name),
			Namespace: namespace,
			Labels:    map[string]string{vocab.LabelRecord: "true", vocab.LabelRecordNamespace: d.Namespace},
			Annotations: map[string]string{
				vocab.AnnotationRecordNamespace: d.Namespace,
				vocab.AnnotationRecordOf:        d.Name,
				vocab.AnnotationRecordUID:       string(d.UID),
				vocab.AnnotationRecordExpires:   expires.UTC().Format(time.RFC3339),
			},
		},
		Data: map[string]string{RecordKeyDeployment: string(manifest)},
	}
	if v, ok := d.Annotations[vocab.RevisionAnnotation]; ok {
		cm.Data[RecordKeyRevision] = v
	}
	if rs, revision := NewestKnownGood(d, rss); rs != nil {
		tmpl, err := yaml.Marshal(RollbackTemplate(rs))
		if err != nil {
			return nil, fmt.Errorf("encoding the known-good template: %w", err)
		}
		cm.Data[RecordKeyKnownGoodTemplate] = string(tmpl)
		cm.Data[RecordKeyKnownGoodRevision] = rollout.FormatRevision(revision)
	}
	cm.Annotations[vocab.AnnotationRecordBytes] = strconv.FormatInt(RecordBytes(cm), 10)
	return cm, nil
}

// ErrNotARecord is returned by DeploymentFromRecord for a ConfigMap that is
// not a record of the guard.
var ErrNotARecord = errors.New("not a deployguard record")

// DeploymentFromRecord decodes the Deployment a record recreates, as
// Deployment key: the caller has checked that the record is key's (RecordOf,
// or an earlier release's record-of annotation), and a record that holds a
// Deployment of another name is refused. With knownGood, its pod template is
// the record's known-good template instead of the one it had when it was
// deleted.
func DeploymentFromRecord(cm *corev1.ConfigMap, key types.NamespacedName, knownGood bool) (*appsv1.Deployment, error) {
	if cm.Labels[vocab.LabelRecord] != "true" {
		return nil, fmt.Errorf("ConfigMap %s/%s has no label %s=true: %w", cm.Namespace, cm.Name, vocab.LabelRecord, ErrNotARecord)
	}
	raw, ok := cm.Data[RecordKeyDeployment]
	if !ok {
		return nil, fmt.Errorf("record %s/%s has no %s", cm.Namespace, cm.Name, RecordKeyDeployment)
	}
	d := &appsv1.Deployment{}
	if err := yaml.UnmarshalStrict([]byte(raw), d); err != nil {
		return nil, fmt.Errorf("decoding %s of record %s/%s: %w", RecordKeyDeployment, cm.Namespace, cm.Name, err)
	}
	if d.Name != key.Name {
		return nil, fmt.Errorf("record %s/%s holds Deployment %q, not %q", cm.Namespace, cm.Name, d.Name, key.Name)
	}
	if knownGood {
		raw, ok := cm.Data[RecordKeyKnownGoodTemplate]
		if !ok {
			return nil, fmt.Errorf("record %s/%s has no known-good template: no revision of the Deployment had completed a rollout", cm.Namespace, cm.Name)
		}
		t := corev1.PodTemplateSpec{}
		if err := yaml.UnmarshalStrict([]byte(raw), &t); err != nil {
			return nil, fmt.Errorf("decoding %s of record %s/%s: %w", RecordKeyKnownGoodTemplate, cm.Namespace, cm.Name, err)
		}
		d.Spec.Template = t
	}
	d.Namespace = key.Namespace
	return d, nil
}

// reconcileRecord runs the record step: save a restorable record of the
// Deployment in a ConfigMap of the guard's own namespace
// (Options.RecordNamespace), where tenants cannot write: `deployguard restore`
// recreates what a record says, so a record is a fact only the guard may
// state. The ConfigMap is read from the API server; its existence, with this
// Deployment's UID, is the step's state: a guard restarted after writing it
// finds it and goes on.
func (r *DeploymentReconciler) reconcileRecord(ctx context.Context, d *appsv1.Deployment, ns namespaceState) (stepOutcome, error) {
	begin := r.Clock.Now()
	recordNS := r.Options.RecordNamespace
	name := RecordName(d.Namespace, d.Name)
	failed := func(msg string, args ...any) stepOutcome {
		return stepOutcome{done: true, result: resultFailed, eventType: corev1.EventTypeWarning, reason: vocab.ReasonRecordFailed,
			message: fmt.Sprintf(msg, args...)}
	}
	if recordNS == "" {
		// SetupWithManager refuses this; a reconciler built by hand writes
		// no record anywhere else.
		return failed("No record saved: the guard has no namespace of its own configured for records."), nil
	}
	var existing *corev1.ConfigMap
	cm := &corev1.ConfigMap{}
	switch err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: recordNS, Name: name}, cm); {
	case err == nil:
		existing = cm
	case !apierrors.IsNotFound(err):
		return stepOutcome{}, fmt.Errorf("reading record %s/%s: %w", recordNS, name, err)
	}

	expires := r.Clock.Now().Add(r.Options.recordRetention())
	budget := r.Options.RecordBudget.withDefaults()
	action := DecideRecord(existing, client.ObjectKeyFromObject(d), d.UID, ns.Terminating)
	switch action {
	case RecordSkip:
		// A record could be written (it lives in the guard's namespace), but
		// this release keeps the earlier one's rule: a Deployment deleted
		// with its namespace is not recorded.
		return stepOutcome{done: true, result: resultSkipped, eventType: corev1.EventTypeWarning, reason: vocab.ReasonCleanupShortened,
			message: fmt.Sprintf("namespace %s is terminating: no record saved (a Deployment deleted with its namespace is not recorded), so the Deployment cannot be restored with deployguard restore.", ns.Name)}, nil
	case RecordNameTaken:
		return failed("No record saved: ConfigMap %s/%s exists and is not a deployguard record (no label %s=true); the guard does not overwrite it.", recordNS, name, vocab.LabelRecord), nil
	case RecordOfAnother:
		of, _ := RecordOf(existing)
		return failed("No record saved: ConfigMap %s/%s is the record of another Deployment (%q, annotations %s and %s); the guard does not overwrite it.",
			recordNS, name, of.String(), vocab.AnnotationRecordNamespace, vocab.AnnotationRecordOf), nil
	case RecordDone:
		expires = recordExpiresOr(existing, expires)
		// A guard stopped between writing the record and making room for it
		// makes room now.
		if r.keepWithinBudget(ctx, d, ns, name, expires, recordBytesOf(existing, budget)) {
			return r.ownRecordEvicted(d, recordNS, name), nil
		}
	case RecordCreate, RecordReplace:
		full, rss, err := r.wholeForRecord(ctx, d)
		if err != nil {
			return stepOutcome{}, err
		}
		rec, err := BuildRecord(full, rss, recordNS, expires)
		if err != nil {
			return stepOutcome{}, err
		}
		size := RecordBytes(rec)
		if size > budget.RecordBytes {
			// Refused, not cut: a record that restores part of a Deployment
			// would restore something nobody wrote. The deletion goes on.
			return failed("No record saved: it would hold %d bytes, more than the %d bytes one record may hold (cleanup.maxRecordBytes), so the Deployment cannot be restored with deployguard restore.", size, budget.RecordBytes), nil
		}
		// Room is made once the record is written, not before: a write that
		// fails evicts nothing.
		if action == RecordCreate {
			err = r.Client.Create(ctx, rec)
		} else {
			rec.ResourceVersion = existing.ResourceVersion
			err = r.Client.Update(ctx, rec)
		}
		switch {
		case apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause):
			// The guard's own namespace is being deleted: the guard is being
			// uninstalled, and its records go with the namespace.
			return failed("No record saved: the guard's namespace %s is terminating (the guard is being uninstalled), so the Deployment cannot be restored with deployguard restore.", recordNS), nil
		case apierrors.IsAlreadyExists(err):
			// Created meanwhile (by this very step, before a restart the cache
			// had not seen): decided again from a fresh read.
			return stepOutcome{}, apierrors.NewConflict(corev1.Resource("configmaps"), name, err)
		case err != nil:
			return stepOutcome{}, fmt.Errorf("writing record %s/%s: %w", recordNS, name, err)
		}
		ctrl.LoggerFrom(ctx).Info("Record saved", "configMap", klog.KObj(rec), "action", action, "bytes", size)
		// Room is made now: the oldest go, none newer than this record (a
		// newer one's own step makes room for it), this record too if it is
		// among the oldest past the budget (RecordsToEvict).
		if r.keepWithinBudget(ctx, d, ns, name, expires, size) {
			return r.ownRecordEvicted(d, recordNS, name), nil
		}
	}
	msg := fmt.Sprintf("Saved a record of the Deployment in ConfigMap %s/%s, kept until %s; restore it with: deployguard restore %s/%s",
		recordNS, name, expires.UTC().Format(time.RFC3339), d.Namespace, d.Name)
	return stepOutcome{done: true, result: resultCompleted, duration: r.Clock.Since(begin), eventType: corev1.EventTypeNormal, reason: vocab.ReasonRecorded, message: msg}, nil
}

// keepWithinBudget deletes the oldest records of the Deployment's namespace
// past its budget (makeRoomForRecord), none newer than record name of size
// bytes expiring at expires, and says so in a Warning Event about the
// Deployment being deleted. It reports whether record name itself went (the
// oldest past the budget, newer deletions of the namespace recorded at the
// same time). A list or delete that fails is logged and told in a Warning
// Event too, and the step goes on: a deletion is never held for the budget
// (deletion stays deletion); the namespace's next record catches up.
func (r *DeploymentReconciler) keepWithinBudget(ctx context.Context, d *appsv1.Deployment, ns namespaceState, name string, expires time.Time, size int64) bool {
	gone, ownGone, err := r.makeRoomForRecord(ctx, d.Namespace, name, expires, size)
	if len(gone) > 0 {
		r.emitCleanupEvent(d, ns, corev1.EventTypeWarning, vocab.ReasonRecordsEvicted, actionRecord, r.evictedMessage(d.Namespace, gone))
	}
	if err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Keeping the namespace's records within their budget; the deletion goes on", "namespace", d.Namespace)
		r.emitCleanupEvent(d, ns, corev1.EventTypeWarning, vocab.ReasonRecordsEvicted, actionRecord, r.budgetFailedMessage(d.Namespace, err))
	}
	return ownGone
}

// ownRecordEvicted is the outcome of a record step whose record was the
// oldest of its namespace's past the budget once written.
func (r *DeploymentReconciler) ownRecordEvicted(d *appsv1.Deployment, recordNS, name string) stepOutcome {
	return stepOutcome{done: true, result: resultFailed, eventType: corev1.EventTypeWarning, reason: vocab.ReasonRecordFailed,
		message: fmt.Sprintf("No record kept: ConfigMap %s/%s was written, then deleted as the oldest of namespace %s's records past their budget (newer deletions of the namespace were recorded at the same time), so the Deployment cannot be restored with deployguard restore.",
			recordNS, name, d.Namespace)}
}

// wholeForRecord reads what a record keeps from the API server: the
// Deployment with its pod template (the cache holds it without, see
// CacheOptions) and its newest known-good ReplicaSet, whose template the
// record keeps too. The other ReplicaSets are the cached ones: the record
// reads only their marks and revisions.
func (r *DeploymentReconciler) wholeForRecord(ctx context.Context, d *appsv1.Deployment) (*appsv1.Deployment, []*appsv1.ReplicaSet, error) {
	full := &appsv1.Deployment{}
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(d), full); err != nil {
		return nil, nil, fmt.Errorf("reading Deployment %s: %w", d.Name, err)
	}
	rss, err := r.listReplicaSets(ctx, d)
	if err != nil {
		return nil, nil, err
	}
	if rs, _ := NewestKnownGood(d, rss); rs != nil {
		whole := &appsv1.ReplicaSet{}
		switch err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(rs), whole); {
		case apierrors.IsNotFound(err):
			// Garbage collected already (a foreground deletion): recorded
			// without its template.
			rss = slices.DeleteFunc(rss, func(x *appsv1.ReplicaSet) bool { return x == rs })
		case err != nil:
			return nil, nil, fmt.Errorf("reading the known-good ReplicaSet %s: %w", rs.Name, err)
		default:
			for i := range rss {
				if rss[i] == rs {
					rss[i] = whole
				}
			}
		}
	}
	return full, rss, nil
}

// recordExpiresOr returns the record's expiry, or def if it has none.
func recordExpiresOr(cm metav1.Object, def time.Time) time.Time {
	if t, ok := RecordExpiry(cm); ok {
		return t
	}
	return def
}
