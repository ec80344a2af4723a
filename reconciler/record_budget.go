package reconciler

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/vocab"
)

// Defaults of the record budget, the same as the config file's.
const (
	// DefaultRecordsPerNamespace is how many records the deletions of one
	// namespace keep in the guard's namespace.
	DefaultRecordsPerNamespace = 20
	// DefaultRecordBytesPerNamespace is how many bytes of record data they
	// keep there: four records of the largest size.
	DefaultRecordBytesPerNamespace = 4 << 20
	// MaxConfigMapBytes is the most data the API server accepts in one
	// ConfigMap (corev1 validation: keys and values together); a record
	// larger than that cannot be written at all.
	MaxConfigMapBytes = 1 << 20
	// DefaultMaxRecordBytes is the largest record the guard writes.
	DefaultMaxRecordBytes = MaxConfigMapBytes
)

// RecordBudget bounds what the deletions of one namespace keep in the guard's
// namespace, where no tenant's ResourceQuota applies: at most Records records
// and Bytes bytes of record data, each record at most RecordBytes. Past the
// count or the bytes, the oldest records of that namespace go to make room for
// the newest; a record larger than RecordBytes is not written. A deletion is
// never held or refused for it (deletion stays deletion). Zero fields mean
// the defaults.
type RecordBudget struct {
	Records     int
	Bytes       int64
	RecordBytes int64
}

// withDefaults fills the zero fields with the defaults.
func (b RecordBudget) withDefaults() RecordBudget {
	if b.Records <= 0 {
		b.Records = DefaultRecordsPerNamespace
	}
	if b.Bytes <= 0 {
		b.Bytes = DefaultRecordBytesPerNamespace
	}
	if b.RecordBytes <= 0 {
		b.RecordBytes = DefaultMaxRecordBytes
	}
	return b
}

// RecordBytes is the size of a record's data as the API server counts a
// ConfigMap's against its 1 MiB limit: every key and value.
func RecordBytes(cm *corev1.ConfigMap) int64 {
	var n int64
	for k, v := range cm.Data {
		n += int64(len(k) + len(v))
	}
	for k, v := range cm.BinaryData {
		n += int64(len(k) + len(v))
	}
	return n
}

// recordBytesOf returns the size in a record's bytes annotation; a record
// without a readable one is counted at the largest a record may be, so that
// nothing unreadable lets a namespace keep more than its budget.
func recordBytesOf(m metav1.Object, budget RecordBudget) int64 {
	n, err := strconv.ParseInt(m.GetAnnotations()[vocab.AnnotationRecordBytes], 10, 64)
	if err != nil || n < 0 {
		return budget.RecordBytes
	}
	return n
}

// RecordsToEvict returns the records (of one namespace) to delete, oldest
// first, so that they fit budget together with the record named keep of
// keepBytes bytes, which is never among them (written now, or about to be).
// The oldest is the first to expire (every record is kept for the same
// retention from when it was written); a record without a readable expiry
// counts as the oldest, then by name, so that two guards choose alike.
func RecordsToEvict(records []metav1.PartialObjectMetadata, keep string, keepBytes int64, budget RecordBudget) []*metav1.PartialObjectMetadata {
	budget = budget.withDefaults()
	others := make([]*metav1.PartialObjectMetadata, 0, len(records))
	count, bytes := 1, keepBytes
	for i := range records {
		if records[i].Name == keep {
			continue
		}
		others = append(others, &records[i])
		count++
		bytes += recordBytesOf(&records[i], budget)
	}
	slices.SortFunc(others, func(a, b *metav1.PartialObjectMetadata) int {
		ta, aok := RecordExpiry(a)
		tb, bok := RecordExpiry(b)
		switch {
		case aok && bok && !ta.Equal(tb):
			return ta.Compare(tb)
		case aok != bok:
			if !aok {
				return -1
			}
			return 1
		}
		return cmp.Compare(a.Name, b.Name)
	})
	var evict []*metav1.PartialObjectMetadata
	for _, m := range others {
		if count <= budget.Records && bytes <= budget.Bytes {
			break
		}
		evict = append(evict, m)
		count--
		bytes -= recordBytesOf(m, budget)
	}
	return evict
}

// makeRoomForRecord deletes the oldest records of Deployments of namespace ns
// (by their label, read as metadata only from the API server) until they fit
// the budget with record keep of keepBytes bytes. It is run before the record
// is written and again after, so that two deletions in the same namespace
// written at once end within the budget too (each sees the other's record
// then). Every delete is conditional on the UID and resourceVersion listed: a
// record replaced meanwhile is decided again at the next pass. It returns the
// Deployments whose records went.
func (r *DeploymentReconciler) makeRoomForRecord(ctx context.Context, ns, keep string, keepBytes int64) ([]string, error) {
	recordNS := r.Options.RecordNamespace
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("ConfigMapList"))
	if err := r.APIReader.List(ctx, list, client.InNamespace(recordNS),
		client.MatchingLabels{vocab.LabelRecord: "true", vocab.LabelRecordNamespace: ns}); err != nil {
		return nil, fmt.Errorf("listing the records of namespace %s: %w", ns, err)
	}
	var gone []string
	for _, m := range RecordsToEvict(list.Items, keep, keepBytes, r.Options.RecordBudget) {
		m.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("ConfigMap"))
		uid, rv := m.UID, m.ResourceVersion
		switch err := r.Client.Delete(ctx, m, client.Preconditions{UID: &uid, ResourceVersion: &rv}); {
		case err == nil:
			r.Metrics.recordsEvicted.Inc()
			of := types.NamespacedName{Namespace: m.Annotations[vocab.AnnotationRecordNamespace], Name: m.Annotations[vocab.AnnotationRecordOf]}
			gone = append(gone, of.String())
			ctrl.LoggerFrom(ctx).Info("Deleted the oldest record of the namespace to keep its records within their budget", "configMap", klog.KObj(m), "deployment", of.String())
		case apierrors.IsNotFound(err), apierrors.IsConflict(err):
			// Gone or replaced meanwhile (the sweeper, or the other pass).
		default:
			return gone, fmt.Errorf("deleting record %s/%s to keep namespace %s within its budget: %w", recordNS, m.Name, ns, err)
		}
	}
	return gone, nil
}

// evictedMessage says which records went, and why.
func (r *DeploymentReconciler) evictedMessage(ns string, gone []string) string {
	b := r.Options.RecordBudget.withDefaults()
	return fmt.Sprintf("Deleted the oldest records of namespace %s (%s) to keep the records of its deletions within their budget of %d records and %d bytes (cleanup.recordsPerNamespace, cleanup.recordBytesPerNamespace); those Deployments can no longer be restored with deployguard restore.",
		ns, strings.Join(gone, ", "), b.Records, b.Bytes)
}
