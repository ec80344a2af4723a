package reconciler

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/deployguard/deployguard/reconciler/vocab"
)

// DefaultRecordSweepInterval is how often, at the most, the RecordSweeper lists
// the records; it also wakes at the earliest expiry it knows of.
const DefaultRecordSweepInterval = 10 * time.Minute

// minSweepWait keeps a sweeper whose next expiry is due from spinning.
const minSweepWait = time.Second

// RecordExpiry returns the time in a record's expiry annotation. A record
// without a readable one never expires: the guard deletes nothing it is unsure
// of.
func RecordExpiry(cm metav1.Object) (time.Time, bool) {
	return timeAnnotation(cm.GetAnnotations(), vocab.AnnotationRecordExpires)
}

// RecordExpired reports whether the ConfigMap (whole, or its metadata) is a
// record of the guard whose retention has passed at now.
func RecordExpired(cm metav1.Object, now time.Time) bool {
	if cm.GetLabels()[vocab.LabelRecord] != "true" {
		return false
	}
	t, ok := RecordExpiry(cm)
	return ok && !now.Before(t)
}

// RecordSweeper deletes the records of deleted Deployments once their
// retention has passed, in the guard's own namespace only: a ConfigMap
// labelled as a record anywhere else is not the guard's (a tenant may write
// one in its namespace) and is neither read nor deleted. It is a manager
// Runnable that runs on the leader only:
// at start (so records that expired while no guard ran go at once), then at the
// earliest expiry it saw or after Interval, whichever comes first (a record
// made meanwhile expires a whole retention later, at least Interval away).
//
// A periodic list rather than a watch: records are rare and long-lived; a
// label-selected list of one namespace from the API server every Interval
// costs next to nothing. It lists metadata only, 500 records a page: the
// expiry is in an annotation, and a record's data (up to 1 MiB) is never
// read, so a sweep's memory does not grow with what tenants deleted.
type RecordSweeper struct {
	// Namespace is the guard's own, where the records are (Options.RecordNamespace).
	Namespace string
	// Reader lists records from the API server; Client deletes them.
	Reader client.Reader
	Client client.Writer
	Clock  clock.Clock
	// Interval is the longest time between two sweeps.
	Interval time.Duration
	Metrics  *Metrics
}

var _ manager.LeaderElectionRunnable = &RecordSweeper{}

// NeedLeaderElection: only the leader deletes records.
func (s *RecordSweeper) NeedLeaderElection() bool { return true }

// Start sweeps until ctx is done. A failed sweep is logged and tried again at
// the next wake.
func (s *RecordSweeper) Start(ctx context.Context) error {
	log := ctrl.Log.WithName("record-sweeper")
	ctx = ctrl.LoggerInto(ctx, log)
	for {
		wait, err := s.Sweep(ctx)
		if err != nil {
			log.Error(err, "Sweeping expired records")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-s.Clock.After(wait):
		}
	}
}

// Sweep deletes every expired record once and returns how long to wait before
// the next sweep. Each delete is conditional on the record's UID and
// resourceVersion, so a record replaced meanwhile (a newer deletion of a
// Deployment of the same name, with a new expiry) is not deleted.
func (s *RecordSweeper) Sweep(ctx context.Context) (time.Duration, error) {
	log := ctrl.LoggerFrom(ctx)
	now := s.Clock.Now()
	wait := s.Interval
	if s.Namespace == "" {
		return wait, errors.New("the record sweeper has no namespace: it deletes records in the guard's namespace only")
	}
	opts := []client.ListOption{client.InNamespace(s.Namespace), client.MatchingLabels{vocab.LabelRecord: "true"}, client.Limit(500)}
	for {
		list := &metav1.PartialObjectMetadataList{}
		list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("ConfigMapList"))
		if err := s.Reader.List(ctx, list, opts...); err != nil {
			return wait, fmt.Errorf("listing records: %w", err)
		}
		for i := range list.Items {
			cm := &list.Items[i]
			cm.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("ConfigMap"))
			expires, ok := RecordExpiry(cm)
			if !ok {
				log.V(1).Info("Record without a readable expiry; kept", "configMap", klog.KObj(cm))
				continue
			}
			if !RecordExpired(cm, now) {
				wait = min(wait, expires.Sub(now))
				continue
			}
			err := s.Client.Delete(ctx, cm, client.Preconditions{UID: &cm.UID, ResourceVersion: &cm.ResourceVersion})
			switch {
			case err == nil:
				s.Metrics.recordsExpired.Inc()
				log.Info("Deleted expired record", "configMap", klog.KObj(cm), "deployment",
					klog.KRef(cm.Annotations[vocab.AnnotationRecordNamespace], cm.Annotations[vocab.AnnotationRecordOf]), "expired", expires)
			case apierrors.IsNotFound(err), apierrors.IsConflict(err):
				// Gone or replaced meanwhile; the next sweep sees the new one.
			default:
				return wait, fmt.Errorf("deleting expired record %s/%s: %w", cm.Namespace, cm.Name, err)
			}
		}
		if list.Continue == "" {
			break
		}
		opts = append(opts[:3], client.Continue(list.Continue))
	}
	return max(wait, minSweepWait), nil
}
