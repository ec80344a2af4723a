package reconciler

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

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
// first, so that they fit budget together with own, the record of own
// bytes, expiring at ownExpires, that the pass has just written (or found
// written). The oldest is the first to expire (every record is kept for the
// same retention from when it was written); a record without a readable
// expiry counts as the oldest, then by name, so that two guards choose
// alike.
//
// A pass never deletes a record newer than its own: that is the record of
// a deletion made since, whose own pass makes room for it. Two deletions of
// a namespace recorded at once thus never evict each other's record (the
// newer one's pass evicts for both), and the config requires room for two
// records of the largest size (cleanup.recordBytesPerNamespace and
// recordsPerNamespace), so that the two newest always fit together. When
// the records older than own are gone and the namespace is still past its
// budget, own itself is the oldest past it, and goes too (when records
// holds it): records written in another order than their age (a flood of
// deletions, several workers) still end within the budget, the newest
// kept, whichever pass runs last.
func RecordsToEvict(records []metav1.PartialObjectMetadata, own string, ownExpires time.Time, ownBytes int64, budget RecordBudget) []*metav1.PartialObjectMetadata {
	budget = budget.withDefaults()
	others := make([]*metav1.PartialObjectMetadata, 0, len(records))
	var listed *metav1.PartialObjectMetadata
	count, bytes := 1, ownBytes
	for i := range records {
		if records[i].Name == own {
			listed = &records[i]
			continue
		}
		others = append(others, &records[i])
		count++
		bytes += recordBytesOf(&records[i], budget)
	}
	slices.SortFunc(others, compareRecordAge)
	ownAge := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: own, Annotations: map[string]string{
		vocab.AnnotationRecordExpires: ownExpires.UTC().Format(time.RFC3339),
	}}}
	fits := func() bool { return count <= budget.Records && bytes <= budget.Bytes }
	var evict []*metav1.PartialObjectMetadata
	for _, m := range others {
		if fits() || compareRecordAge(m, ownAge) >= 0 {
			// Within the budget, or newer than own: all that follow are.
			break
		}
		evict = append(evict, m)
		count--
		bytes -= recordBytesOf(m, budget)
	}
	if !fits() && listed != nil {
		evict = append(evict, listed)
	}
	return evict
}

// compareRecordAge orders records oldest first: by expiry, a record without
// a readable one first, then by name.
func compareRecordAge(a, b *metav1.PartialObjectMetadata) int {
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
}

// makeRoomForRecord deletes the oldest records of Deployments of namespace ns
// (by their label, read as metadata only from the API server), none newer
// than record keep of keepBytes bytes expiring at keepExpires, until they
// fit the budget (RecordsToEvict). It is run once the record is written, so
// that a failed write evicts nothing and deletions of the same namespace
// recorded at once end within the budget too (the last pass sees every
// record). Every delete is conditional on the UID and resourceVersion
// listed: a record replaced meanwhile is decided again at the next pass. It
// returns the Deployments whose records went, whether keep was among them
// (RecordsToEvict), and the first error, after trying the other deletes.
func (r *DeploymentReconciler) makeRoomForRecord(ctx context.Context, ns, keep string, keepExpires time.Time, keepBytes int64) (gone []string, ownGone bool, err error) {
	recordNS := r.Options.RecordNamespace
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("ConfigMapList"))
	if err := r.APIReader.List(ctx, list, client.InNamespace(recordNS),
		client.MatchingLabels{vocab.LabelRecord: "true", vocab.LabelRecordNamespace: ns}); err != nil {
		return nil, false, fmt.Errorf("listing the records of namespace %s: %w", ns, err)
	}
	var first error
	for _, m := range RecordsToEvict(list.Items, keep, keepExpires, keepBytes, r.Options.RecordBudget) {
		m.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("ConfigMap"))
		uid, rv := m.UID, m.ResourceVersion
		switch err := r.Client.Delete(ctx, m, client.Preconditions{UID: &uid, ResourceVersion: &rv}); {
		case err == nil:
			r.Metrics.recordsEvicted.Inc()
			of := types.NamespacedName{Namespace: m.Annotations[vocab.AnnotationRecordNamespace], Name: m.Annotations[vocab.AnnotationRecordOf]}
			gone = append(gone, of.String())
			ownGone = ownGone || m.Name == keep
			ctrl.LoggerFrom(ctx).Info("Deleted the oldest record of the namespace to keep its records within their budget", "configMap", klog.KObj(m), "deployment", of.String())
		case apierrors.IsNotFound(err), apierrors.IsConflict(err):
			// Gone or replaced meanwhile (the sweeper, or the other pass).
		case first == nil:
			first = fmt.Errorf("deleting record %s/%s to keep namespace %s within its budget: %w", recordNS, m.Name, ns, err)
		}
	}
	return gone, ownGone, first
}

// evictedMessage says which records went, and why.
func (r *DeploymentReconciler) evictedMessage(ns string, gone []string) string {
	b := r.Options.RecordBudget.withDefaults()
	return fmt.Sprintf("Deleted the oldest records of namespace %s (%s) to keep the records of its deletions within their budget of %d records and %d bytes (cleanup.recordsPerNamespace, cleanup.recordBytesPerNamespace); those Deployments can no longer be restored with deployguard restore.",
		ns, strings.Join(gone, ", "), b.Records, b.Bytes)
}

// maxBudgetErrorBytes is what a budget failure's Event keeps of the API
// server's answer.
const maxBudgetErrorBytes = 300

// budgetFailedMessage says that the records of namespace ns could not be
// kept within their budget now, and what happens instead.
func (r *DeploymentReconciler) budgetFailedMessage(ns string, err error) string {
	b := r.Options.RecordBudget.withDefaults()
	return fmt.Sprintf("Could not keep the records of namespace %s within their budget of %d records and %d bytes (cleanup.recordsPerNamespace, cleanup.recordBytesPerNamespace): %s. The deletion goes on; the oldest records go at the namespace's next record.",
		ns, b.Records, b.Bytes, truncate(err.Error(), maxBudgetErrorBytes))
}
