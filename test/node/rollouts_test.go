package node

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/test/harness"
)

// app is the test app at tag, from the registry, as harness.Deployment
// builds a Deployment: 2 replicas, with a readiness probe on the app's
// /readyz.
func app(ns, name, tag string, opts ...harness.DeploymentOption) *appsv1.Deployment {
	d := harness.Deployment(ns, name, harness.Registry+"/testapp:"+tag, opts...)
	c := &d.Spec.Template.Spec.Containers[0]
	c.ImagePullPolicy = corev1.PullIfNotPresent
	c.ReadinessProbe = &corev1.Probe{
		ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/readyz", Port: intstr.FromInt32(8080)}},
		PeriodSeconds: 1,
	}
	return d
}

func yamlOf(d *appsv1.Deployment) ([]byte, error) { return yaml.Marshal(d) }

// get reads the Deployment ns/name.
func get(ctx context.Context, ns, name string) (*appsv1.Deployment, error) {
	d := &appsv1.Deployment{}
	return d, cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, d)
}

// completed: every replica of the current template is updated and
// available, as `kubectl rollout status` waits for.
func completed(d *appsv1.Deployment) bool {
	for _, c := range d.Status.Conditions {
		if c.Type == appsv1.DeploymentProgressing && c.Reason == "NewReplicaSetAvailable" {
			return d.Status.ObservedGeneration == d.Generation && d.Status.UpdatedReplicas == *d.Spec.Replicas &&
				d.Status.AvailableReplicas == *d.Spec.Replicas && d.Status.Replicas == *d.Spec.Replicas
		}
	}
	return false
}

// waitDeployment waits until cond holds for ns/name.
func waitDeployment(t *testing.T, ns, name, msg string, timeout time.Duration, cond func(rollout.Ledger, *appsv1.Deployment) bool) *appsv1.Deployment {
	t.Helper()
	var last *appsv1.Deployment
	var state string
	harness.WaitFor(t, timeout, msg, func(ctx context.Context) (bool, string, error) {
		d, err := get(ctx, ns, name)
		if err != nil {
			// The poll's own deadline: the last state seen stays the message.
			if state == "" {
				state = err.Error()
			}
			return false, state, nil
		}
		last = d
		l, _ := rollout.ReadLedger(d)
		state = describe(ctx, d)
		return cond(l, d), state, nil
	})
	return last
}

// describe is what a failed wait prints: the rollout's state and what its
// pods are waiting on.
func describe(ctx context.Context, d *appsv1.Deployment) string {
	var cs []string
	for _, c := range d.Status.Conditions {
		cs = append(cs, fmt.Sprintf("%s=%s/%s: %s", c.Type, c.Status, c.Reason, c.Message))
	}
	return fmt.Sprintf("image %s, replicas %d updated %d available %d, conditions %v, pods: %s",
		d.Spec.Template.Spec.Containers[0].Image, d.Status.Replicas, d.Status.UpdatedReplicas, d.Status.AvailableReplicas, cs,
		strings.Join(podStates(ctx, d.Namespace), "; "))
}

// podStates are the waiting and terminated states of the namespace's pods'
// containers, in the kubelet's words.
func podStates(ctx context.Context, ns string) []string {
	var pods corev1.PodList
	if err := cl.List(ctx, &pods, client.InNamespace(ns)); err != nil {
		return []string{err.Error()}
	}
	var out []string
	for _, p := range pods.Items {
		for _, s := range p.Status.ContainerStatuses {
			if t := s.LastTerminationState.Terminated; t != nil && t.Message != "" {
				out = append(out, fmt.Sprintf("%s last exited %d: %s", p.Name, t.ExitCode, strings.TrimSpace(t.Message)))
			}
			switch {
			case s.State.Waiting != nil:
				out = append(out, fmt.Sprintf("%s waiting %s: %s", p.Name, s.State.Waiting.Reason, s.State.Waiting.Message))
			case s.State.Running != nil:
				out = append(out, fmt.Sprintf("%s running (ready %t, restarts %d)", p.Name, s.Ready, s.RestartCount))
			case s.State.Terminated != nil:
				out = append(out, fmt.Sprintf("%s terminated %s (exit %d)", p.Name, s.State.Terminated.Reason, s.State.Terminated.ExitCode))
			}
		}
	}
	return out
}

// guardNotes are the notes of the guard's Events of reason about ns/name.
func guardNotes(ctx context.Context, t *testing.T, ns, name, reason string) []string {
	t.Helper()
	var list eventsv1.EventList
	require.NoError(t, cl.List(ctx, &list, client.InNamespace(ns)))
	var out []string
	for _, e := range list.Items {
		if e.Regarding.Name == name && e.Reason == reason && strings.Contains(e.ReportingController, "deployguard") {
			out = append(out, e.Note)
		}
	}
	return out
}

// deployGood creates the app at v1 and waits until the guard has recorded
// revision 1 known-good.
func deployGood(ctx context.Context, t *testing.T, ns, name string, opts ...harness.DeploymentOption) {
	t.Helper()
	require.NoError(t, cl.Create(ctx, app(ns, name, "v1", opts...)))
	waitDeployment(t, ns, name, "revision 1 was not recorded known-good", 3*time.Minute, func(l rollout.Ledger, d *appsv1.Deployment) bool {
		n := l.Newest()
		return n != nil && n.Revision == 1 && completed(d)
	})
}

// setImage points the app's container at tag, as `kubectl set image` does.
func setImage(ctx context.Context, t *testing.T, ns, name, tag string) {
	t.Helper()
	r := kubectl(ctx, "set", "image", "-n", ns, "deploy/"+name, "app="+harness.Registry+"/testapp:"+tag)
	require.Zero(t, r.Code, r.String())
}

// rolledBack waits for the guard's rollback of revision 2 to revision 1's
// template, completed on real pods, and returns the rollback's Event.
func rolledBack(ctx context.Context, t *testing.T, ns, name string, timeout time.Duration) string {
	t.Helper()
	waitDeployment(t, ns, name, "revision 2 was not rolled back", timeout, func(l rollout.Ledger, d *appsv1.Deployment) bool {
		return l.RolledBackRevision == 2 && d.Spec.Template.Spec.Containers[0].Image == harness.Registry+"/testapp:v1" && completed(d)
	})
	var notes []string
	harness.WaitFor(t, time.Minute, "no AutoRollback Event", func(ctx context.Context) (bool, string, error) {
		notes = guardNotes(ctx, t, ns, name, vocab.ReasonAutoRollback)
		return len(notes) > 0, fmt.Sprint(notes), nil
	})
	return notes[0]
}

// The evidence the guard saw, in the kubelet's words, for the note.
func logEvidence(ctx context.Context, t *testing.T, ns string) {
	t.Helper()
	for _, s := range podStates(ctx, ns) {
		t.Logf("pod state: %s", s)
	}
}

// The registry stopped for a minute while a rollout pulls: connection
// refused is transient, so the guard waits, and the rollout completes once
// the registry is back. Alone: the other tests' pulls need the registry.
// No test before it may pull the v2 tag: on the node, it would not be
// pulled again.
func TestRegistryOutageIsWaitedOut(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, cl)
	deployGood(ctx, t, ns, "web")
	require.NoError(t, node.StopRegistry())
	stopped := time.Now()
	restarted := false
	t.Cleanup(func() {
		if !restarted {
			require.NoError(t, node.StartRegistry(context.Background()))
		}
	})
	setImage(ctx, t, ns, "web", "v2")
	waitDeployment(t, ns, "web", "the new pods never failed to pull", 2*time.Minute, func(rollout.Ledger, *appsv1.Deployment) bool {
		return strings.Contains(strings.Join(podStates(ctx, ns), ";"), "connection refused")
	})
	logEvidence(ctx, t, ns)
	// A minute of outage, watched: no rollback.
	notRolledBackUntil(ctx, t, ns, "web", stopped.Add(time.Minute), "during a registry outage")
	require.NoError(t, node.StartRegistry(ctx))
	restarted = true
	completesWithoutRollback(ctx, t, ns, "web", "once the registry was back")
	t.Logf("completed %s after the registry stopped", time.Since(stopped).Round(time.Second))
}

// notRolledBackUntil watches ns/name until the time until and fails the
// test as soon as the guard has rolled it back.
func notRolledBackUntil(ctx context.Context, t *testing.T, ns, name string, until time.Time, while string) {
	t.Helper()
	for time.Now().Before(until) {
		d, err := get(ctx, ns, name)
		require.NoError(t, err)
		l, _ := rollout.ReadLedger(d)
		require.Zero(t, l.RolledBackRevision, "rolled back %s: %s", while, describe(ctx, d))
		time.Sleep(time.Second) // a poll of what must not change, not a synchronisation
	}
}

// completesWithoutRollback waits for revision 2 of ns/name to complete and
// be recorded known-good, with no rollback on the way.
func completesWithoutRollback(ctx context.Context, t *testing.T, ns, name, when string) {
	t.Helper()
	waitDeployment(t, ns, name, "revision 2 did not complete "+when, 5*time.Minute, func(l rollout.Ledger, d *appsv1.Deployment) bool {
		n := l.Newest()
		return l.RolledBackRevision == 0 && n != nil && n.Revision == 2 && completed(d)
	})
	assert.Empty(t, guardNotes(ctx, t, ns, name, vocab.ReasonAutoRollback))
}

// A registry that accepts connections and answers nothing, for longer than
// the fail-fast window: each pull ends in containerd's response-header
// timeout (DeadlineExceeded), which is transient, and a pull in progress is
// no evidence at all; once the registry answers again the rollout
// completes, never rolled back. Alone, like the outage.
func TestSlowRegistryIsWaitedOut(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, cl)
	deployGood(ctx, t, ns, "web")
	// A tag the node has not pulled (v2 may be there already).
	require.NoError(t, node.Tag(ctx, "testapp", "v2", "slow"))
	require.NoError(t, node.StopRegistry())
	ln, err := net.Listen("tcp", harness.Registry)
	require.NoError(t, err)
	var held []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c) // read nothing, answer nothing
			mu.Unlock()
		}
	}()
	silent := time.Now()
	answering := false
	answer := func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range held {
			_ = c.Close()
		}
		mu.Unlock()
		require.NoError(t, node.StartRegistry(context.Background()))
		answering = true
	}
	t.Cleanup(func() {
		if !answering {
			answer()
		}
	})
	setImage(ctx, t, ns, "web", "slow")
	waitDeployment(t, ns, "web", "the new pods never failed to pull", 2*time.Minute, func(rollout.Ledger, *appsv1.Deployment) bool {
		return strings.Contains(strings.Join(podStates(ctx, ns), ";"), "ErrImagePull")
	})
	logEvidence(ctx, t, ns)
	// Silent past the fail-fast window (60s): an ordinary failure would be
	// rolled back by now.
	notRolledBackUntil(ctx, t, ns, "web", silent.Add(100*time.Second), "while the registry was slow")
	logEvidence(ctx, t, ns)
	answer()
	completesWithoutRollback(ctx, t, ns, "web", "once the registry answered")
	t.Logf("completed %s after the registry went silent", time.Since(silent).Round(time.Second))
}

// Real pods: a rollout that completes, and the failures the guard rolls
// back, side by side on the node. The tests of later files (uninstall) run
// once these are done.
func TestRealPods(t *testing.T) {
	for name, f := range map[string]func(*testing.T){
		"RolloutCompletes":               rolloutOfRealPodsCompletes,
		"MissingTagIsRolledBack":         missingTagIsRolledBack,
		"CrashLoopIsRolledBack":          crashLoopIsRolledBack,
		"NeverReadyRolledBackAtDeadline": neverReadyIsRolledBackAtTheDeadline,
		"HelmConfigChangeRestored":       helmConfigChangeIsRestoredFromItsSnapshot,
		"RolloutUndoAloneDoesNotHeal":    rolloutUndoAloneDoesNotHealAConfigChange,
		"FluxPrunedConfigRestored":       fluxPrunedConfigIsRestoredFromItsSnapshot,
		"SharedConfigMap":                sharedConfigMapOnlyTheFailedDeploymentIsRestored,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f(t)
		})
	}
}

// A rollout of real pods, from v1 to v2, completes, and both revisions are
// recorded known-good.
func rolloutOfRealPodsCompletes(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, cl)
	deployGood(ctx, t, ns, "web")
	setImage(ctx, t, ns, "web", "v2")
	waitDeployment(t, ns, "web", "revision 2 was not recorded known-good", 3*time.Minute, func(l rollout.Ledger, d *appsv1.Deployment) bool {
		n := l.Newest()
		return n != nil && n.Revision == 2 && completed(d)
	})
}

// A tag the registry does not have: the registry answers "not found", a
// permanent failure, rolled back after the fail-fast window.
func missingTagIsRolledBack(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, cl)
	deployGood(ctx, t, ns, "web")
	setImage(ctx, t, ns, "web", "no-such-tag")
	waitDeployment(t, ns, "web", "the new pods never failed to pull", 2*time.Minute, func(rollout.Ledger, *appsv1.Deployment) bool {
		return strings.Contains(strings.Join(podStates(ctx, ns), ";"), "ImagePull")
	})
	logEvidence(ctx, t, ns)
	note := rolledBack(ctx, t, ns, "web", 4*time.Minute)
	t.Logf("AutoRollback: %s", note)
	assert.Regexp(t, "ImagePullBackOff|ErrImagePull", note)
	assert.Contains(t, note, "no-such-tag")
}

// A container that exits 1 on start: a crash loop, rolled back.
func crashLoopIsRolledBack(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, cl)
	deployGood(ctx, t, ns, "web")
	setImage(ctx, t, ns, "web", "crash")
	note := rolledBack(ctx, t, ns, "web", 4*time.Minute)
	t.Logf("AutoRollback: %s", note)
	assert.Regexp(t, "CrashLoopBackOff|restart", note)
}

// Pods that run but never pass their readiness probe show no evidence: the
// rollout is rolled back at its progress deadline.
func neverReadyIsRolledBackAtTheDeadline(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, cl)
	deployGood(ctx, t, ns, "web", harness.ProgressDeadline(30))
	setImage(ctx, t, ns, "web", "never-ready")
	note := rolledBack(ctx, t, ns, "web", 3*time.Minute)
	t.Logf("AutoRollback: %s", note)
	assert.Contains(t, note, "deadline")
}
