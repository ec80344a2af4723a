package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/test/harness"
)

// The local cluster's own kwok stages (test/harness/stages) put pods into the
// states a kubelet reports for broken rollouts, each selected by something a
// test writes into the pod template. Each test here creates a Deployment whose
// pods match one stage and waits for the status the stage promises.

// stageDeployment is a Deployment that the guard leaves alone whatever its
// pods do: upstream's ten-minute progress deadline, automatic rollback and
// fail-fast off.
func stageDeployment(ns, name, image string) *appsv1.Deployment {
	d := harness.Deployment(ns, name, image, slowDeadline)
	d.Annotations = map[string]string{vocab.AnnotationAutoRollback: "false", vocab.AnnotationFailFast: "false"}
	return d
}

// waitPods waits until the Deployment has its replicas' worth of pods and
// every one satisfies cond (which says what it saw of a pod that does not). A
// pod that is ever seen Ready fails the test unless mayBeReady: the failure
// stages promise it never is.
func waitPods(t *testing.T, d *appsv1.Deployment, timeout time.Duration, msg string, mayBeReady bool, cond func(p *corev1.Pod) (bool, string)) []corev1.Pod {
	t.Helper()
	var pods []corev1.Pod
	harness.WaitFor(t, timeout, msg, func(ctx context.Context) (bool, string, error) {
		pods = pods[:0]
		for _, p := range podsOf(ctx, t, d.Namespace, d) {
			if p.DeletionTimestamp == nil {
				pods = append(pods, p)
			}
		}
		var states []string
		ok := len(pods) == int(*d.Spec.Replicas)
		for i := range pods {
			p := &pods[i]
			if !mayBeReady && podReady(p) {
				return false, "", fmt.Errorf("pod %s is Ready: %s", p.Name, podState(p))
			}
			good, state := cond(p)
			ok = ok && good
			states = append(states, p.Name+": "+state)
		}
		return ok, fmt.Sprintf("%d pods; %s", len(pods), strings.Join(states, "; ")), nil
	})
	return pods
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func podCondition(p *corev1.Pod, typ corev1.PodConditionType) *corev1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == typ {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

func containerStatus(p *corev1.Pod, name string) *corev1.ContainerStatus {
	for _, list := range [][]corev1.ContainerStatus{p.Status.ContainerStatuses, p.Status.InitContainerStatuses} {
		for i := range list {
			if list[i].Name == name {
				return &list[i]
			}
		}
	}
	return nil
}

func containerState(s corev1.ContainerState) string {
	switch {
	case s.Running != nil:
		return "running"
	case s.Terminated != nil:
		return fmt.Sprintf("terminated %s (exit %d)", s.Terminated.Reason, s.Terminated.ExitCode)
	case s.Waiting != nil:
		return fmt.Sprintf("waiting %s %q", s.Waiting.Reason, s.Waiting.Message)
	}
	return "none"
}

// podState describes a pod in one line: phase, Ready, each container.
func podState(p *corev1.Pod) string {
	var cs []string
	for _, list := range [][]corev1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses} {
		for _, c := range list {
			cs = append(cs, fmt.Sprintf("%s ready=%v restarts=%d %s, last %s", c.Name, c.Ready, c.RestartCount, containerState(c.State), containerState(c.LastTerminationState)))
		}
	}
	return fmt.Sprintf("%s, Ready=%v, [%s]", p.Status.Phase, podReady(p), strings.Join(cs, "; "))
}

// assertSettled asserts that nothing changes the pod for a while: the stage
// that put it where it is finds nothing more to patch.
func assertSettled(t *testing.T, p *corev1.Pod, quiet time.Duration) {
	t.Helper()
	cfg, err := local.Cluster.RESTConfig()
	require.NoError(t, err)
	wc, err := client.NewWithWatch(cfg, client.Options{Scheme: local.Scheme})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), quiet)
	defer cancel()
	w, err := wc.Watch(ctx, &corev1.PodList{}, client.InNamespace(p.Namespace),
		client.MatchingFields{"metadata.name": p.Name}, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: p.ResourceVersion}})
	require.NoError(t, err)
	defer w.Stop()
	for ev := range w.ResultChan() {
		if ev.Type == watch.Modified || ev.Type == watch.Deleted {
			if q, ok := ev.Object.(*corev1.Pod); ok {
				assert.Fail(t, "a pod changed after settling", "pod %s (%s): %s", p.Name, ev.Type, podState(q))
			}
			return
		}
	}
}

// image-pull-backoff.yaml: an image whose tag is 404 or that contains
// "no-such" is never pulled.
func TestStageImagePullBackOff(t *testing.T) {
	t.Parallel()
	ns := harness.NewNamespace(t, local.Client)
	d := stageDeployment(ns, "web", "app:no-such-tag")
	require.NoError(t, local.Client.Create(context.Background(), d))
	pods := waitPods(t, d, 30*time.Second, "pods not in ImagePullBackOff", false, func(p *corev1.Pod) (bool, string) {
		c := containerStatus(p, "app")
		return p.Status.Phase == corev1.PodPending && c != nil && c.State.Waiting != nil && c.State.Waiting.Reason == "ImagePullBackOff" && !c.Ready, podState(p)
	})
	c := containerStatus(&pods[0], "app")
	assert.Contains(t, c.State.Waiting.Message, `Back-off pulling image "app:no-such-tag"`)
	assert.Equal(t, "ContainersNotReady", podCondition(&pods[0], corev1.PodReady).Reason)
	assertSettled(t, &pods[0], 3*time.Second)
}

// crash-loop-backoff.yaml: an image that contains "crashloop" starts, exits
// with an error and is restarted with a growing back-off; the pod is never
// Ready. Every state of the loop is seen on the way to three restarts.
func TestStageCrashLoopBackOff(t *testing.T) {
	t.Parallel()
	ns := harness.NewNamespace(t, local.Client)
	d := stageDeployment(ns, "web", "app:2-crashloop")
	require.NoError(t, local.Client.Create(context.Background(), d))
	start := time.Now()
	seen := map[string]bool{}
	pods := waitPods(t, d, 45*time.Second, "pods not crash-looping with 3 restarts", false, func(p *corev1.Pod) (bool, string) {
		c := containerStatus(p, "app")
		if c == nil {
			return false, podState(p)
		}
		switch {
		case c.State.Running != nil:
			seen["running"] = true
		case c.State.Terminated != nil && c.State.Terminated.Reason == "Error" && c.State.Terminated.ExitCode == 1:
			seen["terminated Error"] = true
		case c.State.Waiting != nil && c.State.Waiting.Reason == "CrashLoopBackOff":
			seen["CrashLoopBackOff"] = true
			if last := c.LastTerminationState.Terminated; last == nil || last.Reason != "Error" || last.ExitCode != 1 {
				seen["CrashLoopBackOff without the Error in lastState"] = true
			}
		}
		return c.RestartCount >= 3 && c.State.Waiting != nil && c.State.Waiting.Reason == "CrashLoopBackOff", podState(p)
	})
	t.Logf("3 restarts and CrashLoopBackOff %s after the Deployment was created", time.Since(start).Round(100*time.Millisecond))
	assert.Equal(t, map[string]bool{"running": true, "terminated Error": true, "CrashLoopBackOff": true}, seen)
	for _, p := range pods {
		c := containerStatus(&p, "app")
		assert.Equal(t, corev1.PodRunning, p.Status.Phase)
		assert.False(t, c.Ready)
		assert.Regexp(t, `^back-off \d+s restarting failed container=app pod=`+p.Name+`_`+ns+`\(`+string(p.UID)+`\)$`, c.State.Waiting.Message)
		require.NotNil(t, c.LastTerminationState.Terminated)
		assert.Equal(t, "Error", c.LastTerminationState.Terminated.Reason)
		assert.Equal(t, int32(1), c.LastTerminationState.Terminated.ExitCode)
		assert.Equal(t, "ContainersNotReady", podCondition(&p, corev1.PodReady).Reason)
	}
}

// oom-killed.yaml: an image that contains "oomkill" is OOM-killed at every
// start, in CrashLoopBackOff between.
func TestStageOOMKilled(t *testing.T) {
	t.Parallel()
	ns := harness.NewNamespace(t, local.Client)
	d := stageDeployment(ns, "web", "app:oomkill")
	require.NoError(t, local.Client.Create(context.Background(), d))
	pods := waitPods(t, d, 45*time.Second, "pods not OOM-killed twice", false, func(p *corev1.Pod) (bool, string) {
		c := containerStatus(p, "app")
		return c != nil && c.RestartCount >= 2 && c.State.Waiting != nil && c.State.Waiting.Reason == "CrashLoopBackOff", podState(p)
	})
	for _, p := range pods {
		last := containerStatus(&p, "app").LastTerminationState.Terminated
		require.NotNil(t, last)
		assert.Equal(t, "OOMKilled", last.Reason)
		assert.Equal(t, int32(137), last.ExitCode)
	}
}

// create-container-config-error.yaml: a container whose environment comes
// from a ConfigMap named missing… (envFrom or a key reference, not optional)
// is never created; the pod's other containers run. An init container fails
// the same way and holds the pod's containers in PodInitializing.
func TestStageCreateContainerConfigError(t *testing.T) {
	t.Parallel()
	ns := harness.NewNamespace(t, local.Client)
	ctx := context.Background()
	d := stageDeployment(ns, "web", "app:1")
	spec := &d.Spec.Template.Spec
	spec.Containers[0].EnvFrom = []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{
		LocalObjectReference: corev1.LocalObjectReference{Name: "missing-settings"}}}}
	spec.Containers = append(spec.Containers,
		corev1.Container{Name: "keyref", Image: "app:1", Env: []corev1.EnvVar{{Name: "MODE", ValueFrom: &corev1.EnvVarSource{
			ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "missing-keys"}, Key: "mode"}}}}},
		corev1.Container{Name: "optional", Image: "app:1", EnvFrom: []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: "missing-optional"}, Optional: ptr(true)}}}},
	)
	require.NoError(t, local.Client.Create(ctx, d))

	withInit := stageDeployment(ns, "migrated", "app:1")
	withInit.Spec.Template.Spec.InitContainers = []corev1.Container{{Name: "migrate", Image: "app:1",
		EnvFrom: []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "missing-db"}}}}}}
	require.NoError(t, local.Client.Create(ctx, withInit))

	waiting := func(c *corev1.ContainerStatus, reason string) bool {
		return c != nil && c.State.Waiting != nil && c.State.Waiting.Reason == reason && !c.Ready
	}
	pods := waitPods(t, d, 30*time.Second, "containers not in CreateContainerConfigError", false, func(p *corev1.Pod) (bool, string) {
		opt := containerStatus(p, "optional")
		return p.Status.Phase == corev1.PodPending &&
			waiting(containerStatus(p, "app"), "CreateContainerConfigError") &&
			waiting(containerStatus(p, "keyref"), "CreateContainerConfigError") &&
			opt != nil && opt.State.Running != nil && opt.Ready, podState(p)
	})
	assert.Equal(t, `configmap "missing-settings" not found`, containerStatus(&pods[0], "app").State.Waiting.Message)
	assert.Equal(t, `configmap "missing-keys" not found`, containerStatus(&pods[0], "keyref").State.Waiting.Message)
	assert.Equal(t, "containers with unready status: [app keyref]", podCondition(&pods[0], corev1.PodReady).Message)

	initPods := waitPods(t, withInit, 30*time.Second, "init container not in CreateContainerConfigError", false, func(p *corev1.Pod) (bool, string) {
		init := podCondition(p, corev1.PodInitialized)
		return p.Status.Phase == corev1.PodPending && init != nil && init.Status == corev1.ConditionFalse &&
			waiting(containerStatus(p, "migrate"), "CreateContainerConfigError") &&
			waiting(containerStatus(p, "app"), "PodInitializing"), podState(p)
	})
	assert.Equal(t, `configmap "missing-db" not found`, containerStatus(&initPods[0], "migrate").State.Waiting.Message)
	assertSettled(t, &pods[0], 3*time.Second)
}

// ready-after.yaml: a pod annotated stages.deployguard.io/ready-after runs at
// once and becomes Ready only that long after it started; a pod without the
// annotation is Ready at once.
func TestStageReadyAfter(t *testing.T) {
	t.Parallel()
	const after = 8 * time.Second
	ns := harness.NewNamespace(t, local.Client)
	ctx := context.Background()
	d := stageDeployment(ns, "slow", "app:1")
	d.Spec.Template.Annotations = map[string]string{"stages.deployguard.io/ready-after": after.String()}
	require.NoError(t, local.Client.Create(ctx, d))
	require.NoError(t, local.Client.Create(ctx, stageDeployment(ns, "quick", "app:1")))

	// Running, every container started, not Ready.
	pods := waitPods(t, d, 30*time.Second, "pods not running", false, func(p *corev1.Pod) (bool, string) {
		c := containerStatus(p, "app")
		return p.Status.Phase == corev1.PodRunning && c != nil && c.State.Running != nil && c.Started != nil && *c.Started && !c.Ready, podState(p)
	})
	running := time.Now()
	for _, p := range pods {
		ready := podCondition(&p, corev1.PodReady)
		require.NotNil(t, ready)
		assert.Equal(t, corev1.ConditionFalse, ready.Status)
		assert.Equal(t, "ContainersNotReady", ready.Reason)
		assert.NotEmpty(t, p.Status.PodIP)
	}
	waitAvailable(t, ns, "quick", 30*time.Second)
	assert.Less(t, time.Since(running), after/2, "a pod without the annotation is Ready at once")

	pods = waitPods(t, d, after+20*time.Second, "pods not Ready", true, func(p *corev1.Pod) (bool, string) {
		return podReady(p), podState(p)
	})
	readyAfter := time.Since(running)
	t.Logf("Ready %s after first seen running", readyAfter.Round(100*time.Millisecond))
	assert.GreaterOrEqual(t, readyAfter, after-500*time.Millisecond, "Ready too early")
	for _, p := range pods {
		ready := podCondition(&p, corev1.PodReady)
		assert.GreaterOrEqual(t, ready.LastTransitionTime.Sub(p.Status.StartTime.Time), after, "Ready %s after startTime", ready.LastTransitionTime.Sub(p.Status.StartTime.Time))
		assert.Empty(t, ready.Reason)
		c := containerStatus(&p, "app")
		assert.True(t, c.Ready)
		assert.Equal(t, int32(0), c.RestartCount)
	}
	waitAvailable(t, ns, "slow", 30*time.Second)
	assertSettled(t, &pods[0], 2*time.Second)
}

// pull-blip.yaml: a pod annotated stages.deployguard.io/pull-fails-until
// cannot reach the registry (ImagePullBackOff, a dial i/o timeout) until that
// time, then runs and is Ready; a permanent pull failure's stage
// (image-pull-backoff.yaml) says "manifest unknown" for such an image.
func TestStagePullBlip(t *testing.T) {
	t.Parallel()
	ns := harness.NewNamespace(t, local.Client)
	ctx := context.Background()
	clears := time.Now().Add(12 * time.Second)
	d := stageDeployment(ns, "blip", "app:1")
	d.Spec.Template.Annotations = map[string]string{"stages.deployguard.io/pull-fails-until": clears.UTC().Format(time.RFC3339)}
	require.NoError(t, local.Client.Create(ctx, d))
	unknown := stageDeployment(ns, "unknown", "app:manifest-unknown")
	require.NoError(t, local.Client.Create(ctx, unknown))

	pods := waitPods(t, d, 10*time.Second, "pods not failing to pull", false, func(p *corev1.Pod) (bool, string) {
		c := containerStatus(p, "app")
		return p.Status.Phase == corev1.PodPending && c != nil && c.State.Waiting != nil && c.State.Waiting.Reason == "ImagePullBackOff", podState(p)
	})
	assert.Contains(t, containerStatus(&pods[0], "app").State.Waiting.Message, "dial tcp 203.0.113.10:443: i/o timeout")
	pods = waitPods(t, d, time.Until(clears)+20*time.Second, "pods not Ready after the blip", true, func(p *corev1.Pod) (bool, string) {
		return podReady(p), podState(p)
	})
	assert.False(t, time.Now().Before(clears), "Ready before the blip cleared")
	assert.Equal(t, corev1.PodRunning, pods[0].Status.Phase)
	assert.NotEmpty(t, pods[0].Status.PodIP)

	pods = waitPods(t, unknown, 30*time.Second, "pods not in ImagePullBackOff", false, func(p *corev1.Pod) (bool, string) {
		c := containerStatus(p, "app")
		return c != nil && c.State.Waiting != nil && c.State.Waiting.Reason == "ImagePullBackOff", podState(p)
	})
	assert.Contains(t, containerStatus(&pods[0], "app").State.Waiting.Message, "unknown: manifest unknown")
}
