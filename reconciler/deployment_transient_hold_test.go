package reconciler

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
)

func TestDecideTransientHold(t *testing.T) {
	now := time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)
	const window = 5 * time.Minute
	transient := func(pod string) PodState {
		return PodState{Name: pod, Failure: &PodFailure{Pod: pod, Reason: "ImagePullBackOff", Class: ClassTransient, Cause: "i/o timeout"}}
	}
	permanent := PodState{Name: "p", Failure: &PodFailure{Pod: "p", Reason: "ErrImagePull", Class: ClassPermanent, Cause: "manifest unknown"}}
	crash := PodState{Name: "c", Failure: &PodFailure{Pod: "c", Reason: "CrashLoopBackOff"}}
	for _, tc := range []struct {
		name  string
		pods  []PodState
		since time.Time
		wait  time.Duration
		held  bool
	}{
		{"a blip seen for the first time waits the whole window", []PodState{transient("a"), transient("b")}, time.Time{}, window, false},
		{"a blip seen 2 minutes ago waits the rest", []PodState{transient("a")}, now.Add(-2 * time.Minute), 3 * time.Minute, false},
		{"a blip past its window rolls back", []PodState{transient("a")}, now.Add(-6 * time.Minute), 0, false},
		{"a permanent failure next to it rolls back", []PodState{transient("a"), permanent}, time.Time{}, 0, false},
		{"a crash loop next to it rolls back", []PodState{transient("a"), crash}, time.Time{}, 0, false},
		{"no evidence: upstream's deadline stands", []PodState{{Name: "x"}, {Name: "y", Ready: true}}, time.Time{}, 0, false},
		{"a record in the future counts from now", []PodState{transient("a")}, now.Add(time.Hour), window, false},
		// The blip is over: the pods pull and become Ready a moment before
		// upstream's condition says the rollout progresses again.
		{"a deferred rollback holds while its pods recover", []PodState{{Name: "a", Ready: true}, {Name: "b"}}, now.Add(-time.Minute), 4 * time.Minute, true},
		{"a deferred rollback whose pods now fail for good rolls back", []PodState{permanent}, now.Add(-time.Minute), 0, true},
		{"a deferred rollback past its window rolls back", []PodState{{Name: "a"}}, now.Add(-6 * time.Minute), 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := DecideTransientHold(tc.pods, tc.since, now, window, tc.held)
			assert.Equal(t, tc.wait, h.Wait)
		})
	}
	h := DecideTransientHold([]PodState{transient("a"), transient("b")}, now.Add(-time.Minute), now, window, false)
	assert.Equal(t, "; a transient failure (i/o timeout) for the whole transient window of 5m0s", h.RollbackSuffix())
	assert.True(t, h.Until.Equal(now.Add(4*time.Minute)), "until %s", h.Until)
	assert.Empty(t, DecideTransientHold([]PodState{permanent}, time.Time{}, now, window, false).RollbackSuffix(),
		"a permanent failure's rollback says nothing of a transient window")
	msg := h.DeferMessage(Decision{FailedRevision: 2, NewRS: &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "web-5d8f"}}})
	for _, want := range []string{"Revision 2 (ReplicaSet web-5d8f) exceeded its progress deadline", "fail only transiently (i/o timeout)", "not rolling back before 2026-11-24T10:04:00Z"} {
		assert.Contains(t, msg, want)
	}
}

// A deferral is about one deadline: the same revision failing at a later
// deadline is not taken for one already held.
func TestDeferralIsAboutOneDeadline(t *testing.T) {
	rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "web-5d8f"}}
	at := func(s int) *appsv1.DeploymentCondition {
		return &appsv1.DeploymentCondition{LastTransitionTime: metav1.NewTime(time.Date(2026, 11, 24, 10, 0, s, 0, time.UTC))}
	}
	assert.NotEqual(t, deferralKey(rs, at(0)), deferralKey(rs, at(1)), "a later deadline matches the first's deferral")
	first := deferredPrefix(Decision{FailedRevision: 2, NewRS: rs, Deadline: at(0)})
	assert.False(t, strings.HasPrefix(first, deferredPrefix(Decision{FailedRevision: 2, NewRS: rs, Deadline: at(1)})),
		"a later deadline's words match the first's deferral %q", first)
}

// Whether a rollback is held is read from the ledger only: the words in
// rollback-status, which the edit role can write, hold nothing.
func TestDeferralIsReadFromTheLedgerOnly(t *testing.T) {
	tmpl := corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "web"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "web:2"}}},
	}
	rs := &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: "web-5d8f", Annotations: map[string]string{"deployment.kubernetes.io/revision": "2"}},
		Spec:       appsv1.ReplicaSetSpec{Template: tmpl},
	}
	deadline := appsv1.DeploymentCondition{
		Type: appsv1.DeploymentProgressing, Status: corev1.ConditionFalse, Reason: vocab.ProgressDeadlineExceeded,
		LastTransitionTime: metav1.NewTime(time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)),
	}
	deployment := func() *appsv1.Deployment {
		return &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: "web", Annotations: map[string]string{}},
			Spec:       appsv1.DeploymentSpec{Template: tmpl},
			Status:     appsv1.DeploymentStatus{Conditions: []appsv1.DeploymentCondition{deadline}},
		}
	}
	rss := []*appsv1.ReplicaSet{rs}

	forged := deployment()
	forged.Annotations[vocab.AnnotationRollbackStatus] = deferredPrefix(Decision{FailedRevision: 2, NewRS: rs, Deadline: &deadline}) + ": forged"
	assert.False(t, deferralStands(forged, rss), "a deferral written in rollback-status alone holds the rollback")

	recorded := deployment()
	require.True(t, rollout.SetLedger(&recorded.Status, rollout.Ledger{DeferredFor: deferralKey(rs, &deadline)}, time.Now()), "setting the ledger")
	assert.True(t, deferralStands(recorded, rss), "the deferral the ledger records does not hold the rollback")

	// As the release before this one recorded it: the ReplicaSet alone.
	earlier := deployment()
	require.True(t, rollout.SetLedger(&earlier.Status, rollout.Ledger{DeferredFor: rs.Name}, time.Now()))
	assert.True(t, deferralStands(earlier, rss), "a hold the earlier release recorded no longer holds")
}
