package reconciler

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
)

const actionReport = "Report"

// scaleUpStalled returns the guard's scale-up Stalled condition, or nil.
func scaleUpStalled(s *appsv1.DeploymentStatus) *appsv1.DeploymentCondition {
	for i := range s.Conditions {
		c := &s.Conditions[i]
		if c.Type == vocab.ConditionStalled && c.Reason == vocab.ReasonScaleUpStalled {
			return c
		}
	}
	return nil
}

// scaling reports whether d's only rollout is behind it: the Deployment
// controller has seen its spec, recorded its last rollout complete
// (NewReplicaSetAvailable, which a scale does not change), and no old
// ReplicaSet keeps replicas. Its newRS is returned.
func scaling(d *appsv1.Deployment, rss []*appsv1.ReplicaSet) *appsv1.ReplicaSet {
	if d.Spec.Paused || !rollout.SpecObserved(d) {
		return nil
	}
	c := rollout.ProgressingCondition(d)
	if c == nil || c.Status != corev1.ConditionTrue || c.Reason != vocab.NewReplicaSetAvailable {
		return nil
	}
	newRS := rollout.FindNewReplicaSet(d, rss)
	if newRS == nil {
		return nil
	}
	for _, rs := range rss {
		if rs != newRS && rs.Spec.Replicas != nil && *rs.Spec.Replicas > 0 {
			return nil
		}
	}
	return newRS
}

// reconcileScaleUp reports, as a Stalled condition (reason ScaleUpStalled)
// and an Event, a Deployment that a scale-up left short of its replicas past
// its progress deadline with its missing pods failing (DecideScaleUp), and
// clears the report when it is back at its replicas or scaled down. Pods
// are listed only while the Deployment is short. It returns when to look
// again.
func (r *DeploymentReconciler) reconcileScaleUp(ctx context.Context, d *appsv1.Deployment, rss []*appsv1.ReplicaSet) (time.Duration, error) {
	cur := scaleUpStalled(&d.Status)
	if rollout.GuardStalled(&d.Status) != nil {
		return 0, nil // a rollback's verdict holds the Stalled condition
	}
	newRS := scaling(d, rss)
	desired, available := rollout.Replicas(d), d.Status.AvailableReplicas
	if newRS == nil || desired == 0 || available >= desired {
		if cur != nil && rollout.SpecObserved(d) {
			why := fmt.Sprintf("%d/%d replicas available", available, desired)
			if newRS == nil {
				why = "a new rollout, paused or not yet observed"
			}
			return 0, r.clearScaleUp(ctx, d, why)
		}
		return 0, nil
	}
	pods, err := r.newPods(ctx, d, newRS)
	if err != nil {
		return 0, err
	}
	now := r.Clock.Now()
	o := r.Options.FailFast
	if len(o.Reasons) == 0 {
		o.Reasons = DefaultFailFastReasons()
	}
	o.UnschedulableAfter = 0 // the progress deadline is the wait
	in := ScaleUpInput{Now: now, Desired: desired, Available: available, Deadline: progressDeadline(d), Reported: cur != nil}
	for i := range pods {
		in.Pods = append(in.Pods, ScaleUpPod{PodState: PodStateOf(&pods[i], now, o), Created: pods[i].CreationTimestamp.Time})
	}
	if int32(len(pods)) < desired {
		// Pods missing altogether: the ReplicaSet may be unable to create
		// them (a quota, an admission refusal), which only its status says.
		c, err := r.replicaFailure(ctx, newRS)
		if err != nil {
			return 0, err
		}
		if c != nil {
			in.CreateFailure = &PodFailure{Pod: newRS.Name, Reason: c.Reason, Message: c.Message}
			in.CreateFailureSince = c.LastTransitionTime.Time
		}
	}
	v := DecideScaleUp(in)
	if !v.Stalled || cur != nil {
		return v.RequeueAfter, nil
	}
	msg := ScaleUpMessage(desired, available, v, in.Deadline, now)
	patch := client.MergeFromWithOptions(d.DeepCopy(), client.MergeFromWithOptimisticLock{})
	rollout.SetCondition(&d.Status, appsv1.DeploymentCondition{
		Type: vocab.ConditionStalled, Status: corev1.ConditionTrue, Reason: vocab.ReasonScaleUpStalled, Message: msg,
	}, now)
	if err := r.Client.Status().Patch(ctx, d, patch); err != nil {
		return 0, fmt.Errorf("reporting the stalled scale-up on the Deployment's status: %w", err)
	}
	r.Recorder.Eventf(d, newRS, corev1.EventTypeWarning, vocab.ReasonScaleUpStalled, actionReport, "%s", msg)
	ctrl.LoggerFrom(ctx).Info("Scale-up stalled past the progress deadline; reported", "replicaSet", klog.KObj(newRS),
		"desired", desired, "available", available, "reason", v.Evidence[0].Reason)
	return 0, nil
}

// clearScaleUp removes the scale-up report, with a status write conditional
// on the resourceVersion read.
func (r *DeploymentReconciler) clearScaleUp(ctx context.Context, d *appsv1.Deployment, why string) error {
	patch := client.MergeFromWithOptions(d.DeepCopy(), client.MergeFromWithOptimisticLock{})
	removeCondition(&d.Status, vocab.ConditionStalled)
	if err := r.Client.Status().Patch(ctx, d, patch); err != nil {
		return fmt.Errorf("clearing the stalled scale-up from the Deployment's status: %w", err)
	}
	r.Recorder.Eventf(d, nil, corev1.EventTypeNormal, vocab.ReasonScaleUpRecovered, actionReport, "The scale-up no longer stalls: %s.", why)
	ctrl.LoggerFrom(ctx).Info("Stalled scale-up cleared", "why", why)
	return nil
}

// progressDeadline is spec.progressDeadlineSeconds, upstream's 600 s when
// unset.
func progressDeadline(d *appsv1.Deployment) time.Duration {
	if d.Spec.ProgressDeadlineSeconds == nil {
		return 600 * time.Second
	}
	return time.Duration(*d.Spec.ProgressDeadlineSeconds) * time.Second
}

// ScaleUpCollector exports deployguard_scaleups_stalled: the Deployments the
// guard reports as stalled short of their replicas, read at each scrape
// from the process's cache, so that every replica says the same as the API
// server and nothing is left over from an earlier leadership.
type ScaleUpCollector struct {
	Reader client.Reader
}

var scaleUpsDesc = prometheus.NewDesc("deployguard_scaleups_stalled",
	"Deployments whose scale-up stalled past the progress deadline (condition Stalled, reason ScaleUpStalled).", nil, nil)

// Describe implements prometheus.Collector.
func (c *ScaleUpCollector) Describe(ch chan<- *prometheus.Desc) { ch <- scaleUpsDesc }

// Collect implements prometheus.Collector.
func (c *ScaleUpCollector) Collect(ch chan<- prometheus.Metric) {
	var list appsv1.DeploymentList
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// Read only: the cache's objects as they are, no copy of every
	// Deployment per scrape.
	if err := c.Reader.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		ch <- prometheus.NewInvalidMetric(scaleUpsDesc, err)
		return
	}
	n := 0
	for i := range list.Items {
		if scaleUpStalled(&list.Items[i].Status) != nil {
			n++
		}
	}
	ch <- prometheus.MustNewConstMetric(scaleUpsDesc, prometheus.GaugeValue, float64(n))
}

// replicaFailure is rs's ReplicaFailure condition when it holds, read from
// the API server: the cache keeps of a ReplicaSet's status only its ready
// replicas (StripForCache), not its conditions. A ReplicaSet gone or
// replaced since has none.
func (r *DeploymentReconciler) replicaFailure(ctx context.Context, rs *appsv1.ReplicaSet) (*appsv1.ReplicaSetCondition, error) {
	whole := &appsv1.ReplicaSet{}
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(rs), whole); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("reading ReplicaSet %s/%s: %w", rs.Namespace, rs.Name, err)
	}
	if whole.UID != rs.UID {
		return nil, nil
	}
	for i := range whole.Status.Conditions {
		if c := &whole.Status.Conditions[i]; c.Type == appsv1.ReplicaSetReplicaFailure && c.Status == corev1.ConditionTrue {
			return c, nil
		}
	}
	return nil, nil
}
