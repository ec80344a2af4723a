package reconciler

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
)

func newPod(name string, mods ...func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "shop:1.4"}}},
		Status: corev1.PodStatus{
			Phase:      corev1.PodPending,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse}},
		},
	}
	for _, m := range mods {
		m(p)
	}
	return p
}

func waiting(reason string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "web", Image: "shop:1.4",
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: reason + " message"}}}}
	}
}

func TestPodStateOf(t *testing.T) {
	now := t0.Add(time.Hour)
	o := DefaultFailFastOptions()
	tests := []struct {
		name   string
		pod    *corev1.Pod
		reason string // "" for no evidence
		ready  bool
	}{
		{name: "image cannot be pulled", pod: newPod("a", waiting("ImagePullBackOff")), reason: "ImagePullBackOff"},
		{name: "pull error before the back-off", pod: newPod("a", waiting("ErrImagePull")), reason: "ErrImagePull"},
		{name: "missing ConfigMap", pod: newPod("a", waiting("CreateContainerConfigError")), reason: "CreateContainerConfigError"},
		{name: "crash loop", pod: newPod("a", waiting("CrashLoopBackOff")), reason: "CrashLoopBackOff"},
		{name: "still creating: slow, not failing", pod: newPod("a", waiting("ContainerCreating"))},
		{name: "init container initialising: not failing", pod: newPod("a", waiting("PodInitializing"))},
		{name: "running, readiness not yet passed: not failing", pod: newPod("a", func(p *corev1.Pod) {
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "web", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}
		})},
		{name: "restarts at the threshold", pod: newPod("a", func(p *corev1.Pod) {
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "web", RestartCount: 3, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}
		}), reason: "Restarts"},
		{name: "restarts below the threshold", pod: newPod("a", func(p *corev1.Pod) {
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "web", RestartCount: 2, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}
		})},
		{name: "OOM-killed again and again", pod: newPod("a", func(p *corev1.Pod) {
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "web", RestartCount: 2,
				State:                corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
				LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "OOMKilled", ExitCode: 137}}}}
		}), reason: "OOMKilled"},
		{name: "a crash loop between two back-offs: running again, last exit an error", pod: newPod("a", func(p *corev1.Pod) {
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "web", RestartCount: 1,
				State:                corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
				LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "Error", ExitCode: 1}}}}
		}), reason: "CrashLoopBackOff"},
		{name: "restarted once after a clean exit: not failing", pod: newPod("a", func(p *corev1.Pod) {
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "web", RestartCount: 1,
				State:                corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
				LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "Completed", ExitCode: 0}}}}
		})},
		{name: "OOM-killed once: not yet", pod: newPod("a", func(p *corev1.Pod) {
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "web", RestartCount: 1,
				State:                corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
				LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "OOMKilled", ExitCode: 137}}}}
		})},
		{name: "init container failing", pod: newPod("a", func(p *corev1.Pod) {
			p.Spec.InitContainers = []corev1.Container{{Name: "migrate", Image: "shop-migrate:1.4"}}
			p.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: "migrate", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}}}
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "web", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "PodInitializing"}}}}
		}), reason: "CrashLoopBackOff"},
		{name: "unschedulable long enough", pod: newPod("a", func(p *corev1.Pod) {
			p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionFalse,
				Reason: corev1.PodReasonUnschedulable, Message: "0/2 nodes are available", LastTransitionTime: metav1.NewTime(now.Add(-6 * time.Minute))})
		}), reason: "Unschedulable"},
		{name: "unschedulable for a moment: the autoscaler may add a node", pod: newPod("a", func(p *corev1.Pod) {
			p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionFalse,
				Reason: corev1.PodReasonUnschedulable, LastTransitionTime: metav1.NewTime(now.Add(-time.Minute))})
		})},
		{name: "ready", pod: newPod("a", waiting("ImagePullBackOff"), func(p *corev1.Pod) {
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		}), ready: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := PodStateOf(tt.pod, now, o)
			assert.Equal(t, tt.ready, st.Ready)
			if tt.reason == "" {
				assert.Nil(t, st.Failure)
				return
			}
			if assert.NotNil(t, st.Failure) {
				assert.Equal(t, tt.reason, st.Failure.Reason)
			}
		})
	}
	t.Run("the image is the container's", func(t *testing.T) {
		st := PodStateOf(newPod("a", waiting("ImagePullBackOff")), now, o)
		assert.Equal(t, PodFailure{Pod: "a", Container: "web", Image: "shop:1.4", Reason: "ImagePullBackOff", Message: "ImagePullBackOff message"}, *st.Failure)
	})
}

func TestDecideFailFast(t *testing.T) {
	now := t0.Add(time.Hour)
	window := time.Minute
	failing := func(name string) PodState {
		return PodState{Name: name, Failure: &PodFailure{Pod: name, Container: "web", Image: "shop:1.4-typo", Reason: "ImagePullBackOff"}}
	}
	starting := func(name string) PodState { return PodState{Name: name} }
	ready := func(name string) PodState { return PodState{Name: name, Ready: true} }
	tests := []struct {
		name    string
		in      FailFastInput
		failing bool
		failed  bool
		since   time.Time
	}{
		{name: "no pods yet", in: FailFastInput{}},
		{name: "evidence seen first: the window starts", in: FailFastInput{Pods: []PodState{failing("a"), failing("b")}}, failing: true, since: now},
		{name: "evidence held through the window: failed", in: FailFastInput{Pods: []PodState{failing("a"), failing("b")}, FailingSince: now.Add(-window)},
			failing: true, failed: true, since: now.Add(-window)},
		{name: "not yet through the window", in: FailFastInput{Pods: []PodState{failing("a")}, FailingSince: now.Add(-window + time.Second)},
			failing: true, since: now.Add(-window + time.Second)},
		{name: "one bad pod of three, the others Ready: not failing", in: FailFastInput{Pods: []PodState{failing("a"), ready("b"), ready("c")}, FailingSince: now.Add(-time.Hour)}},
		{name: "one bad pod, another still starting: not all of them, not failing", in: FailFastInput{Pods: []PodState{failing("a"), starting("b")}, FailingSince: now.Add(-time.Hour)}},
		{name: "configured: one failing pod is enough", in: FailFastInput{Pods: []PodState{failing("a"), starting("b")}, MinFailingPods: 1, FailingSince: now.Add(-time.Hour)},
			failing: true, failed: true, since: now.Add(-time.Hour)},
		{name: "configured minimum, but a pod is Ready: not failing", in: FailFastInput{Pods: []PodState{failing("a"), ready("b")}, MinFailingPods: 1}},
		{name: "a recorded start from the future counts as now", in: FailFastInput{Pods: []PodState{failing("a")}, FailingSince: now.Add(time.Hour)}, failing: true, since: now},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := tt.in
			in.Now, in.Window = now, window
			v := DecideFailFast(in)
			assert.Equal(t, tt.failing, v.Failing, "failing")
			assert.Equal(t, tt.failed, v.Failed, "failed")
			if tt.failing {
				assert.Equal(t, tt.since, v.Since)
				assert.NotEmpty(t, v.Evidence)
			} else {
				assert.Empty(t, v.Evidence)
			}
			if tt.failing && !tt.failed {
				assert.Equal(t, window-now.Sub(tt.since), v.RequeueAfter, "looked at again when the window ends")
			}
		})
	}
}

func TestFailFastSummary(t *testing.T) {
	now := t0.Add(time.Hour)
	v := DecideFailFast(FailFastInput{Now: now, Window: time.Minute, FailingSince: now.Add(-62 * time.Second), Pods: []PodState{
		{Name: "web-7f-a", Failure: &PodFailure{Pod: "web-7f-a", Container: "web", Image: "shop:1.4-typo", Reason: "ImagePullBackOff"}},
		{Name: "web-7f-b", Failure: &PodFailure{Pod: "web-7f-b", Container: "web", Image: "shop:1.4-typo", Reason: "ImagePullBackOff"}},
		{Name: "web-7f-c", Failure: &PodFailure{Pod: "web-7f-c", Container: "web", Image: "shop:1.4-typo", Reason: "ErrImagePull"}},
	}})
	assert.Equal(t, "3/3 new pods 2 ImagePullBackOff, 1 ErrImagePull for 1m2s (container web, image shop:1.4-typo)", FailFastSummary(v, now))
}

// inProgress gives d the status of a rollout of revision 3 under way: one
// new pod created, the old ones serving.
func inProgress(d *appsv1.Deployment) {
	n := *d.Spec.Replicas
	d.Status.Replicas, d.Status.UpdatedReplicas, d.Status.ReadyReplicas, d.Status.AvailableReplicas = n+1, 1, n, n
	setProgressing(d, appsv1.DeploymentCondition{Status: corev1.ConditionTrue, Reason: "ReplicaSetUpdated",
		Message: `ReplicaSet "web-h3" is progressing.`, LastTransitionTime: metav1.NewTime(t0.Add(19 * time.Minute))})
}

// newRSPod is a pod of rs with the given waiting reason ("" for a Ready pod).
func newRSPod(rs *appsv1.ReplicaSet, name, reason string) *corev1.Pod {
	p := pod(rs, name, corev1.PodPending)
	p.Spec.Containers = rs.Spec.Template.Spec.Containers
	if reason == "" {
		p.Status.Phase = corev1.PodRunning
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		return p
	}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse}}
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "web", Image: "web:v3",
		State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason}}}}
	return p
}

func TestFailFastRollsBackOnceTheWindowHasPassed(t *testing.T) {
	d := deployment(inProgress)
	rs1, rs2, rs3 := history(d)
	e := newEnv(t, namespace(nil), d, rs1, rs2, rs3,
		newRSPod(rs3, "web-h3-a", "ImagePullBackOff"), newRSPod(rs3, "web-h3-b", "ImagePullBackOff"))

	res := e.reconcileResult()
	got := e.deployment()
	assert.Equal(t, e.clock.Now().UTC().Format(time.RFC3339)+" web-h3", ledgerOf(t, got).FailingSince, "the window starts, in the ledger")
	assert.NotContains(t, got.Annotations, vocab.LegacyAnnotationFailingSince)
	assert.Equal(t, "web:v3", got.Spec.Template.Spec.Containers[0].Image, "not yet rolled back")
	assert.Positive(t, res.RequeueAfter)
	assert.LessOrEqual(t, res.RequeueAfter, FailFastPollInterval)
	assert.Empty(t, e.events())

	e.clock.Step(30 * time.Second)
	e.reconcileResult()
	assert.Equal(t, "web:v3", e.deployment().Spec.Template.Spec.Containers[0].Image, "half the window: still waiting")

	e.clock.Step(31 * time.Second)
	e.reconcileResult()
	got = e.deployment()
	assert.Equal(t, *RollbackTemplate(rs2), got.Spec.Template, "rolled back to the newest known-good revision, like on a deadline")
	l := ledgerOf(t, got)
	assert.Equal(t, int64(3), l.RolledBackRevision)
	assert.Equal(t, int64(3), l.FailFastRevision)
	assert.Equal(t, "web-h2", l.RolledBackTo)
	assert.Empty(t, l.FailingSince, "the window is over")
	assert.Contains(t, got.Annotations[vocab.AnnotationQuarantinedTemplates], vocab.TemplateHash(&d.Spec.Template), "the failed template is quarantined")
	evs := e.events()
	assert.Equal(t, []string{vocab.ReasonAutoRollback}, eventReasons(evs))
	assert.Contains(t, evs[0], "Rolled back from revision 3 (ReplicaSet web-h3): 2/2 new pods ImagePullBackOff for 1m1s (container web, image web:v3), to known-good revision 2 (ReplicaSet web-h2).")
	assert.Equal(t, 1.0, counterValue(t, e.r.Metrics.failFastDecisions.WithLabelValues("ImagePullBackOff", resultRolledBack)))

	// Once: the same revision is never decided again.
	e.clock.Step(time.Minute)
	e.reconcileResult()
	assert.Empty(t, e.events())
}

func TestFailFastLeavesAlone(t *testing.T) {
	tests := []struct {
		name string
		d    *appsv1.Deployment
		pods func(rs *appsv1.ReplicaSet) []client.Object
	}{
		{name: "one pod of three fails, the others are Ready", d: deployment(inProgress),
			pods: func(rs *appsv1.ReplicaSet) []client.Object {
				return []client.Object{newRSPod(rs, "a", "ImagePullBackOff"), newRSPod(rs, "b", ""), newRSPod(rs, "c", "")}
			}},
		{name: "pods starting slowly", d: deployment(inProgress),
			pods: func(rs *appsv1.ReplicaSet) []client.Object {
				return []client.Object{newRSPod(rs, "a", "ContainerCreating"), newRSPod(rs, "b", "ContainerCreating")}
			}},
		{name: "paused", d: deployment(inProgress, paused),
			pods: func(rs *appsv1.ReplicaSet) []client.Object {
				return []client.Object{newRSPod(rs, "a", "ImagePullBackOff")}
			}},
		{name: "fail-fast off for it", d: deployment(inProgress, annotate(vocab.AnnotationFailFast, "false")),
			pods: func(rs *appsv1.ReplicaSet) []client.Object {
				return []client.Object{newRSPod(rs, "a", "ImagePullBackOff")}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rs1, rs2, rs3 := history(tt.d)
			e := newEnv(t, append([]client.Object{namespace(nil), tt.d, rs1, rs2, rs3}, tt.pods(rs3)...)...)
			for range 3 {
				e.reconcileResult()
				e.clock.Step(time.Minute)
			}
			got := e.deployment()
			assert.Equal(t, "web:v3", got.Spec.Template.Spec.Containers[0].Image)
			l, _ := rollout.ReadLedger(got)
			assert.Empty(t, l.FailingSince)
			assert.Empty(t, l.FailFastRevision)
			assert.Empty(t, e.events())
		})
	}
}

// A window that stops holding starts again: one pod came up Ready.
func TestFailFastWindowResets(t *testing.T) {
	d := deployment(inProgress, withLedger(func(l *rollout.Ledger) { l.FailingSince = rollout.FailingSinceValue(t0.Add(20*time.Minute), "web-h3") }))
	rs1, rs2, rs3 := history(d)
	e := newEnv(t, namespace(nil), d, rs1, rs2, rs3, newRSPod(rs3, "a", "CrashLoopBackOff"), newRSPod(rs3, "b", ""))
	e.reconcileResult()
	l := ledgerOf(t, e.deployment())
	assert.Empty(t, l.FailingSince)
	assert.Equal(t, []string{"web-h1", "web-h2"}, knownGoodNames(l), "the rest of the ledger stays")
}

func TestFailFastWithoutKnownGoodReports(t *testing.T) {
	d := deployment(inProgress, withLedger(func(l *rollout.Ledger) { l.FailingSince = rollout.FailingSinceValue(t0, "web-h3") }))
	rs3 := replicaSet(d, 3, "web:v3")
	e := newEnv(t, namespace(nil), d, rs3, newRSPod(rs3, "a", "CreateContainerConfigError"))

	e.reconcileResult()
	got := e.deployment()
	assert.Equal(t, "web:v3", got.Spec.Template.Spec.Containers[0].Image, "nothing to roll back to")
	assert.Contains(t, got.Annotations[vocab.AnnotationRollbackStatus], "1/1 new pods CreateContainerConfigError")
	evs := e.events()
	assert.Equal(t, []string{vocab.ReasonNoKnownGoodRevision}, eventReasons(evs))
	assert.Contains(t, evs[0], "Revision 3 (ReplicaSet web-h3) is failing: 1/1 new pods CreateContainerConfigError")
	l := ledgerOf(t, got)
	assert.Equal(t, int64(3), l.FailFastRevision, "decided once, in the ledger")
	assert.Empty(t, l.FailingSince)
	assert.NotContains(t, got.Annotations, vocab.LegacyAnnotationFailFastRevision)

	e.clock.Step(time.Minute)
	e.reconcileResult()
	assert.Empty(t, e.events(), "reported once")
}

// The guard restarted between the start of the window and the write: the
// window's start is on the Deployment, so the new guard rolls back once, on
// time.
func TestFailFastAcrossARestart(t *testing.T) {
	d := deployment(inProgress, withLedger(func(l *rollout.Ledger) { l.FailingSince = rollout.FailingSinceValue(t0.Add(19*time.Minute), "web-h3") }))
	rs1, rs2, rs3 := history(d)
	e := newEnv(t, namespace(nil), d, rs1, rs2, rs3, newRSPod(rs3, "a", "RunContainerError"))
	e.reconcileResult()
	got := e.deployment()
	assert.Equal(t, "web:v2", got.Spec.Template.Spec.Containers[0].Image)
	assert.Len(t, e.events(), 1)
	e.reconcileResult()
	assert.Empty(t, e.events())
}

// A scale the Deployment controller has not yet observed (an HPA's, say)
// neither restarts the window nor decides anything: a Deployment scaled more
// often than its window still fails fast, on time.
func TestFailFastWindowSurvivesAScale(t *testing.T) {
	since := t0.Add(19*time.Minute + 30*time.Second).Format(time.RFC3339)
	d := deployment(inProgress, withLedger(func(l *rollout.Ledger) { l.FailingSince = since + " web-h3" }), func(d *appsv1.Deployment) {
		d.Generation++ // scaled: the controller has not caught up
		d.Spec.Replicas = ptr.To[int32](5)
	})
	rs1, rs2, rs3 := history(d)
	e := newEnv(t, namespace(nil), d, rs1, rs2, rs3, newRSPod(rs3, "a", "ImagePullBackOff"))

	e.reconcileResult()
	got := e.deployment()
	assert.Equal(t, since+" web-h3", ledgerOf(t, got).FailingSince, "the window keeps its start")
	assert.Equal(t, "web:v3", got.Spec.Template.Spec.Containers[0].Image)
	assert.Empty(t, e.events())

	// The controller observes the scale; the window has passed since it began.
	got.Status.ObservedGeneration = got.Generation
	require.NoError(t, e.client.Status().Update(context.Background(), got))
	e.clock.Step(31 * time.Second)
	e.reconcileResult()
	assert.Equal(t, "web:v2", e.deployment().Spec.Template.Spec.Containers[0].Image, "rolled back a window after the evidence began, not after the scale")
	assert.Equal(t, []string{vocab.ReasonAutoRollback}, eventReasons(e.events()))
}
