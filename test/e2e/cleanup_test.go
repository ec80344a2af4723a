package e2e

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nativeconfig "github.com/deployguard/deployguard/config/native"
	"github.com/deployguard/deployguard/reconciler"
	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/test/harness"
	"github.com/deployguard/deployguard/webhook/native"
	"github.com/deployguard/deployguard/webhook/native/floor"
	"github.com/deployguard/deployguard/webhook/routing"
)

// drainTimeout is cleanup.drainTimeout in the suite's guard config.
const drainTimeout = 45 * time.Second

// timelineEvent is one watch event of the timeline.
type timelineEvent struct {
	kind, name string
	typ        watch.EventType
	// rv is the object's resourceVersion at the event. In this test's own
	// cluster (one etcd) it is the etcd revision of the change, so it orders
	// changes to objects of different kinds, which arrival times on separate
	// watches cannot do reliably.
	rv         uint64
	finalizers []string
	deleting   bool
	// at is when the event arrived.
	at time.Time
}

// timeline watches the Deployments, ReplicaSets, pods and ConfigMaps of a
// namespace.
type timeline struct {
	mu     sync.Mutex
	events []timelineEvent
	stop   context.CancelFunc
	done   sync.WaitGroup
}

func startTimeline(t *testing.T, ns string) *timeline {
	t.Helper()
	cfg, err := local.Cluster.RESTConfig()
	require.NoError(t, err)
	wc, err := client.NewWithWatch(cfg, client.Options{Scheme: local.Scheme})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	tl := &timeline{stop: cancel}
	for kind, list := range map[string]client.ObjectList{
		"Deployment": &appsv1.DeploymentList{}, "ReplicaSet": &appsv1.ReplicaSetList{},
		"Pod": &corev1.PodList{}, "ConfigMap": &corev1.ConfigMapList{},
	} {
		// Records live in the guard's namespace: ConfigMaps are watched there.
		in := ns
		if kind == "ConfigMap" {
			in = harness.GuardNamespace
		}
		w, err := wc.Watch(ctx, list, client.InNamespace(in))
		require.NoError(t, err)
		tl.done.Add(1)
		go func() {
			defer tl.done.Done()
			defer w.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case ev, ok := <-w.ResultChan():
					if !ok {
						return
					}
					o, ok := ev.Object.(client.Object)
					if !ok {
						continue
					}
					rv, _ := strconv.ParseUint(o.GetResourceVersion(), 10, 64)
					tl.mu.Lock()
					tl.events = append(tl.events, timelineEvent{kind: kind, name: o.GetName(), typ: ev.Type, rv: rv,
						finalizers: o.GetFinalizers(), deleting: o.GetDeletionTimestamp() != nil, at: time.Now()})
					tl.mu.Unlock()
				}
			}
		}()
	}
	t.Cleanup(tl.close)
	return tl
}

func (tl *timeline) close() {
	tl.stop()
	tl.done.Wait()
}

// snapshot returns the events seen so far, ordered by resourceVersion.
func (tl *timeline) snapshot() []timelineEvent {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	out := slices.Clone(tl.events)
	slices.SortStableFunc(out, func(a, b timelineEvent) int { return cmp.Compare(a.rv, b.rv) })
	return out
}

func (tl *timeline) filter(kind string, typ watch.EventType) []timelineEvent {
	var out []timelineEvent
	for _, e := range tl.snapshot() {
		if e.kind == kind && e.typ == typ {
			out = append(out, e)
		}
	}
	return out
}

// guardFinalizerSteps is the sequence of the guard's finalizer lists a
// Deployment went through while being deleted, consecutive repeats dropped.
// The removal of the last finalizer is not in it: the API server deletes the
// object in that very write, and the DELETED event carries the object as it
// was before.
func guardFinalizerSteps(events []timelineEvent, name string) [][]string {
	var out [][]string
	for _, e := range events {
		if e.kind != "Deployment" || e.name != name || !e.deleting || e.typ == watch.Deleted {
			continue
		}
		var mine []string
		for _, f := range e.finalizers {
			if vocab.IsGuardFinalizer(f) {
				mine = append(mine, f)
			}
		}
		if len(out) == 0 || !slices.Equal(out[len(out)-1], mine) {
			out = append(out, mine)
		}
	}
	return out
}

// waitGone waits until the Deployment no longer exists.
func waitGone(t *testing.T, ns, name string, timeout time.Duration) {
	t.Helper()
	harness.WaitFor(t, timeout, fmt.Sprintf("Deployment %s/%s was not deleted", ns, name), func(ctx context.Context) (bool, string, error) {
		d := &appsv1.Deployment{}
		err := local.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, d)
		if apierrors.IsNotFound(err) {
			return true, "", nil
		}
		if err != nil {
			return false, err.Error(), nil
		}
		return false, fmt.Sprintf("finalizers %v, %s", d.Finalizers, describe(d)), nil
	})
}

// guard runs the built deployguard binary with the admin kubeconfig and
// returns its combined output.
func guard(ctx context.Context, t *testing.T, args ...string) (string, error) {
	t.Helper()
	bin, err := harness.GuardBinary()
	require.NoError(t, err)
	out, err := exec.CommandContext(ctx, bin, append(args, "--kubeconfig", local.Cluster.Kubeconfig)...).CombinedOutput()
	return string(out), err
}

func count(xs []string, x string) int {
	n := 0
	for _, y := range xs {
		if y == x {
			n++
		}
	}
	return n
}

// withCleanup asks for the guard's cleanup on deletion: record, then drain.
func withCleanup(d *appsv1.Deployment) *appsv1.Deployment {
	if d.Annotations == nil {
		d.Annotations = map[string]string{}
	}
	d.Annotations[vocab.AnnotationCleanup] = "record,drain"
	return d
}

// toldToStop returns, for each pod of the timeline, the resourceVersion at
// which it was first seen terminating or gone.
func toldToStop(events []timelineEvent) map[string]uint64 {
	out := map[string]uint64{}
	for _, e := range events {
		if e.kind != "Pod" || (!e.deleting && e.typ != watch.Deleted) {
			continue
		}
		if _, ok := out[e.name]; !ok {
			out[e.name] = e.rv
		}
	}
	return out
}

// Deleting a Deployment that asks for its cleanup runs the steps in the order
// of its finalizers: the record is saved while the Deployment and its
// ReplicaSets are whole, then the drain scales it to zero and the Deployment
// goes once every pod has been told to stop; only then the garbage collector
// deletes the ReplicaSets. `deployguard restore` brings it back.
func TestDeletingGuardedDeploymentRecordsDrainsAndRestores(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, local.Client)
	d := withCleanup(harness.Deployment(ns, "web", "web:1.0", shortDeadline))
	d.Spec.Replicas = ptr(int32(3))
	d.Annotations["kubernetes.io/change-cause"] = "release 1.0"
	require.NoError(t, local.Client.Create(ctx, d))
	waitAvailable(t, ns, "web", time.Minute)
	waitKnownGood(t, ns, "web", 1)
	orig := get(ctx, t, ns, "web")
	require.Equal(t, vocab.CanonicalFinalizers(), orig.Finalizers)

	tl := startTimeline(t, ns)
	require.NoError(t, local.Client.Delete(ctx, orig))
	waitGone(t, ns, "web", 30*time.Second)
	harness.WaitFor(t, 30*time.Second, "the ReplicaSets were not garbage collected", func(ctx context.Context) (bool, string, error) {
		var rss appsv1.ReplicaSetList
		err := local.Client.List(ctx, &rss, client.InNamespace(ns))
		return err == nil && len(rss.Items) == 0 && len(tl.filter("ReplicaSet", watch.Deleted)) > 0, fmt.Sprintf("%d ReplicaSets", len(rss.Items)), err
	})
	events := tl.snapshot()

	assert.Equal(t, [][]string{{vocab.FinalizerRecord, vocab.FinalizerDrain}, {vocab.FinalizerDrain}},
		guardFinalizerSteps(events, "web"), "record, then drain, each finalizer removed when its step is done")

	stopped := toldToStop(events)
	require.Len(t, stopped, 3, "every pod was told to stop")
	var firstStop, lastStop uint64
	for _, rv := range stopped {
		if firstStop == 0 || rv < firstStop {
			firstStop = rv
		}
		lastStop = max(lastStop, rv)
	}
	var recordCreated, deploymentGone uint64
	for _, e := range tl.filter("ConfigMap", watch.Added) {
		if e.name == reconciler.RecordName(ns, "web") {
			recordCreated = e.rv
		}
	}
	for _, e := range tl.filter("Deployment", watch.Deleted) {
		deploymentGone = e.rv
	}
	rssGone := tl.filter("ReplicaSet", watch.Deleted)
	require.NotZero(t, recordCreated, "the record was created")
	require.NotZero(t, deploymentGone)
	require.NotEmpty(t, rssGone)
	assert.Less(t, recordCreated, firstStop, "the record was saved before any pod was told to stop")
	assert.Less(t, lastStop, deploymentGone, "every pod was told to stop before the Deployment went")
	assert.Less(t, deploymentGone, rssGone[0].rv, "the ReplicaSets went after the Deployment, by garbage collection")

	reasons := waitEvents(t, ns, "web", vocab.ReasonDrainStarted, vocab.ReasonDrained, vocab.ReasonRecorded)
	for _, r := range []string{vocab.ReasonDrainStarted, vocab.ReasonDrained, vocab.ReasonRecorded} {
		assert.Equal(t, 1, count(reasons, r), "one %s event in %v", r, reasons)
	}
	rec := &corev1.ConfigMap{}
	require.NoError(t, local.Client.Get(ctx, client.ObjectKey{Namespace: harness.GuardNamespace, Name: reconciler.RecordName(ns, "web")}, rec))
	assert.Equal(t, "true", rec.Labels[vocab.LabelRecord])
	assert.Equal(t, "1", rec.Data["known-good-revision"])
	assert.NotEmpty(t, rec.Annotations[vocab.AnnotationRecordExpires])

	out, err := guard(ctx, t, "restore", ns+"/web")
	require.NoError(t, err, out)
	assert.Contains(t, out, "deployment.apps/web restored in namespace "+ns)
	restored := waitAvailable(t, ns, "web", time.Minute)
	assert.Equal(t, orig.Spec.Template, restored.Spec.Template, "the same template")
	assert.Equal(t, int32(3), *restored.Spec.Replicas, "the replicas it had before the drain")
	assert.Equal(t, "release 1.0", restored.Annotations["kubernetes.io/change-cause"])
	assert.Equal(t, vocab.CanonicalFinalizers(), restored.Finalizers, "it asks for its cleanup again")

	out, err = guard(ctx, t, "restore", ns+"/web")
	require.Error(t, err, "a second restore must not overwrite the Deployment")
	assert.Contains(t, out, "exists; restore never overwrites a Deployment")
	out, err = guard(ctx, t, "restore", ns+"/never-existed")
	require.Error(t, err)
	assert.Contains(t, out, "no record of Deployment "+ns+"/never-existed")
}

// holdPodDeletions makes the API server refuse every DELETE of a pod in ns,
// with a ValidatingAdmissionPolicy, so that the ReplicaSet controller cannot
// stop the pods of a scaled-down ReplicaSet: that is how a test makes a drain
// wait as long as it needs. It returns once the policy is in force, and the
// function that lifts it.
func holdPodDeletions(ctx context.Context, t *testing.T, ns string) (lift func()) {
	t.Helper()
	name := "e2e-hold-pod-deletions-" + ns
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr(admissionregistrationv1.Fail),
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Delete},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
				},
			}}},
			Validations: []admissionregistrationv1.Validation{{Expression: "false", Message: "pod deletions are held by the test"}},
		},
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
			MatchResources: &admissionregistrationv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}}},
		},
	}
	require.NoError(t, local.Client.Create(ctx, policy))
	require.NoError(t, local.Client.Create(ctx, binding))
	// In force once a dry-run deletion of a pod is refused, lifted once one
	// goes through.
	canary := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "hold-canary"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "canary:1"}}, NodeSelector: map[string]string{"deployguard.io/e2e": "no-such-node"}}}
	held := func(ctx context.Context) bool {
		err := local.Client.Delete(ctx, canary, client.DryRunAll)
		return err != nil && strings.Contains(err.Error(), "held by the test")
	}
	lifted := false
	lift = func() {
		if lifted {
			return
		}
		lifted = true
		_ = client.IgnoreNotFound(local.Client.Delete(context.Background(), binding))
		_ = client.IgnoreNotFound(local.Client.Delete(context.Background(), policy))
		harness.WaitFor(t, 20*time.Second, "the policy holding pod deletions was not lifted", func(ctx context.Context) (bool, string, error) {
			return !held(ctx), "", nil
		})
	}
	t.Cleanup(lift)
	require.NoError(t, local.Client.Create(ctx, canary))
	harness.WaitFor(t, 20*time.Second, "the policy holding pod deletions did not take effect", func(ctx context.Context) (bool, string, error) {
		return held(ctx), "", nil
	})
	return lift
}

// The guard is killed in the middle of a drain: the API server refuses to
// delete the Deployment's pods (an admission policy holds them), so the drain
// waits. The restarted guard finds the drain where it was (its start time and
// scale on the Deployment), waits, and finishes the cleanup once the pods are
// let go, without doing anything twice.
func TestGuardKilledDuringDrainFinishesAfterRestart(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, local.Client)
	require.NoError(t, local.Client.Create(ctx, withCleanup(harness.Deployment(ns, "slow", "app:1", shortDeadline))))
	waitAvailable(t, ns, "slow", time.Minute)
	lift := holdPodDeletions(ctx, t, ns)

	tl := startTimeline(t, ns)
	require.NoError(t, local.Client.Delete(ctx, get(ctx, t, ns, "slow")))
	var draining *appsv1.Deployment
	harness.WaitFor(t, 30*time.Second, "the drain did not start", func(ctx context.Context) (bool, string, error) {
		draining = get(ctx, t, ns, "slow")
		var rss appsv1.ReplicaSetList
		if err := local.Client.List(ctx, &rss, client.InNamespace(ns)); err != nil {
			return false, "", err
		}
		scaled := len(rss.Items) > 0
		for _, rs := range rss.Items {
			scaled = scaled && rs.Spec.Replicas != nil && *rs.Spec.Replicas == 0
		}
		return draining.Annotations[vocab.AnnotationDrainStarted] != "" && scaled, describe(draining), nil
	})
	require.Equal(t, int32(0), *draining.Spec.Replicas)
	require.Equal(t, []string{vocab.FinalizerDrain}, draining.Finalizers, "recorded; the drain waits for the held pods")

	before := leaseHolder(ctx, t)
	require.NoError(t, local.RestartGuard(ctx), "killed in the middle of the drain")
	// The killed guard did not release its lease: the new one leads once it
	// expires.
	harness.WaitFor(t, 40*time.Second, "the restarted guard did not take the lead", func(ctx context.Context) (bool, string, error) {
		h := leaseHolder(ctx, t)
		return h != "" && h != before, h, nil
	})
	assert.Never(t, func() bool {
		d := &appsv1.Deployment{}
		if err := local.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "slow"}, d); err != nil {
			return true
		}
		return !slices.Equal(d.Finalizers, []string{vocab.FinalizerDrain}) || d.Generation != draining.Generation ||
			d.Annotations[vocab.AnnotationDrainStarted] != draining.Annotations[vocab.AnnotationDrainStarted]
	}, 3*time.Second, 100*time.Millisecond, "the restarted guard neither started the drain again nor gave up waiting")

	lift()
	// The ReplicaSet controller retries its refused deletions with a growing
	// backoff; a change to the ReplicaSets brings them back at once.
	var rss appsv1.ReplicaSetList
	require.NoError(t, local.Client.List(ctx, &rss, client.InNamespace(ns)))
	for i := range rss.Items {
		rs := &rss.Items[i]
		patch := client.MergeFrom(rs.DeepCopy())
		metav1.SetMetaDataAnnotation(&rs.ObjectMeta, "e2e.deployguard.io/poke", "1")
		require.NoError(t, local.Client.Patch(ctx, rs, patch))
	}
	waitGone(t, ns, "slow", 30*time.Second)

	reasons := waitEvents(t, ns, "slow", vocab.ReasonDrainStarted, vocab.ReasonDrained, vocab.ReasonRecorded)
	for _, r := range []string{vocab.ReasonDrainStarted, vocab.ReasonDrained, vocab.ReasonRecorded} {
		assert.Equal(t, 1, count(reasons, r), "one %s event in %v", r, reasons)
	}
	assert.NotContains(t, reasons, vocab.ReasonDrainTimedOut)
	var writes []watch.EventType
	for _, e := range tl.snapshot() {
		if e.kind == "ConfigMap" && e.name == reconciler.RecordName(ns, "slow") {
			writes = append(writes, e.typ)
		}
	}
	assert.Equal(t, []watch.EventType{watch.Added}, writes, "the record was written once")
	assert.Equal(t, [][]string{{vocab.FinalizerRecord, vocab.FinalizerDrain}, {vocab.FinalizerDrain}}, guardFinalizerSteps(tl.snapshot(), "slow"))
}

// leaseHolder is the holder of the guard's leader election lease.
func leaseHolder(ctx context.Context, t *testing.T) string {
	t.Helper()
	l := &coordinationv1.Lease{}
	if err := local.Client.Get(ctx, client.ObjectKey{Namespace: harness.GuardNamespace, Name: "deployguard.deployguard.io"}, l); err != nil {
		return ""
	}
	if l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// A protected Deployment survives `kubectl delete`, with the guard's message
// saying how to lift the protection; once lifted, it is deleted through the
// cleanup as any other.
func TestProtectedDeploymentSurvivesKubectlDelete(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, local.Client)
	d := withCleanup(harness.Deployment(ns, "precious", "app:1", shortDeadline))
	d.Annotations[vocab.AnnotationProtected] = "true"
	require.NoError(t, local.Client.Create(ctx, d))
	waitAvailable(t, ns, "precious", time.Minute)

	out, err := local.Cluster.Kubectl(ctx, local.Cluster.Kubeconfig, "delete", "deployment", "precious", "-n", ns)
	require.Error(t, err, out)
	assert.Contains(t, out, "is protected from deletion")
	lift := fmt.Sprintf("kubectl annotate deployment precious -n %s %s-", ns, vocab.AnnotationProtected)
	assert.Contains(t, out, lift, "the message says how to lift the protection")
	got := get(ctx, t, ns, "precious")
	assert.Nil(t, got.DeletionTimestamp, "not being deleted")
	assert.Equal(t, int32(2), got.Status.AvailableReplicas, "still serving")

	_, err = local.Cluster.Kubectl(ctx, local.Cluster.Kubeconfig, strings.Fields(lift)[1:]...)
	require.NoError(t, err)
	_, err = local.Cluster.Kubectl(ctx, local.Cluster.Kubeconfig, "delete", "deployment", "precious", "-n", ns, "--wait=false")
	require.NoError(t, err)
	waitGone(t, ns, "precious", 30*time.Second)
	waitEvents(t, ns, "precious", vocab.ReasonRecorded)
}

// Deleting a namespace of guarded Deployments completes within the drain
// timeout: in a terminating namespace the guard does not wait for the pods
// (the namespace controller deletes them) and saves no record (a Deployment
// deleted with its namespace is not recorded), and says so in Events about
// the Namespace, which land in the default namespace.
func TestDeletingNamespaceOfGuardedDeploymentsCompletes(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, local.Client)
	const n = 5
	names := sets.New[string]()
	for i := range n {
		name := fmt.Sprintf("app-%d", i)
		names.Insert(name)
		require.NoError(t, local.Client.Create(ctx, withCleanup(harness.Deployment(ns, name, "app:1", shortDeadline))))
	}
	for name := range names {
		waitAvailable(t, ns, name, time.Minute)
	}

	tl := startTimeline(t, ns)
	start := time.Now()
	require.NoError(t, local.Client.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	harness.WaitFor(t, drainTimeout, "the namespace was not deleted within the drain timeout", func(ctx context.Context) (bool, string, error) {
		var left appsv1.DeploymentList
		_ = local.Client.List(ctx, &left, client.InNamespace(ns))
		var state []string
		for _, d := range left.Items {
			state = append(state, fmt.Sprintf("%s %v", d.Name, d.Finalizers))
		}
		err := local.Client.Get(ctx, client.ObjectKey{Name: ns}, &corev1.Namespace{})
		return apierrors.IsNotFound(err), strings.Join(state, "; "), nil
	})
	// The guard's share: from the namespace controller's DELETE of the first
	// Deployment to the last one gone.
	var firstDeleting, lastGone time.Time
	for _, e := range tl.snapshot() {
		if e.kind != "Deployment" || !e.deleting {
			continue
		}
		if firstDeleting.IsZero() || e.at.Before(firstDeleting) {
			firstDeleting = e.at
		}
		if e.typ == watch.Deleted && e.at.After(lastGone) {
			lastGone = e.at
		}
	}
	require.False(t, firstDeleting.IsZero() || lastGone.IsZero(), "the Deployments' deletion was seen")
	t.Logf("namespace with %d guarded Deployments deleted in %s; its Deployments went %s after the namespace controller deleted them",
		n, time.Since(start).Round(100*time.Millisecond), lastGone.Sub(firstDeleting).Round(10*time.Millisecond))
	assert.Less(t, lastGone.Sub(firstDeleting), drainTimeout/3, "the guard did not wait for drains in a terminating namespace")

	told := sets.New[string]()
	harness.WaitFor(t, 10*time.Second, "the guard did not say why it shortened the cleanup", func(ctx context.Context) (bool, string, error) {
		var list eventsv1.EventList
		if err := local.Client.List(ctx, &list, client.InNamespace("default")); err != nil {
			return false, "", err
		}
		for _, e := range list.Items {
			if e.Regarding.Kind == "Namespace" && e.Regarding.Name == ns && e.Reason == vocab.ReasonCleanupShortened && e.Related != nil {
				told.Insert(e.Related.Name)
			}
		}
		return told.Equal(names), fmt.Sprintf("told about %v", sets.List(told)), nil
	})
}

// After `deployguard uninstall`, every Deployment the guard guarded can be
// deleted without the guard; other controllers' finalizers are left alone.
// On a cluster of its own: kube-apiserver stops reading ConfigMap params for
// good once the refusals' binding is gone (kubernetes/kubernetes#130887), so
// the shared cluster's native policies could not be put back for the other
// tests without a restart, which kwok's nodes do not survive promptly.
func TestUninstallLeavesEveryDeploymentDeletableWithoutTheGuard(t *testing.T) {
	_, logPath := ownCluster(t, "uninstall")
	ctx := context.Background()
	ns := harness.NewNamespace(t, local.Client)
	const keep = "e2e.deployguard.io/keep"
	require.NoError(t, local.Client.Create(ctx, withCleanup(harness.Deployment(ns, "plain", "app:1", shortDeadline))))
	shared := withCleanup(harness.Deployment(ns, "shared", "app:1", shortDeadline))
	shared.Finalizers = []string{keep}
	require.NoError(t, local.Client.Create(ctx, shared))
	waitAvailable(t, ns, "plain", time.Minute)
	waitAvailable(t, ns, "shared", time.Minute)
	require.Equal(t, append([]string{keep}, vocab.CanonicalFinalizers()...), get(ctx, t, ns, "shared").Finalizers)
	// And one the guard rolled back, which reads as failed until the verdict
	// ends: nothing would end it once the guard is gone.
	rolledOutOnce(t, harness.Deployment(ns, "rolled", "app:1", shortDeadline))
	require.NoError(t, update(t, ns, "rolled", breakImage("app:2")))
	harness.WaitFor(t, 90*time.Second, "not rolled back", func(ctx context.Context) (bool, string, error) {
		d := get(ctx, t, ns, "rolled")
		return condition(d, vocab.ConditionStalled) != nil && d.Labels[vocab.LabelRolledBack] == "2", describe(d), nil
	})

	out, err := guard(ctx, t, "uninstall", "--dry-run")
	require.NoError(t, err, out)
	assert.Contains(t, out, "would delete validatingwebhookconfiguration/deployguard-validating")
	assert.Contains(t, out, fmt.Sprintf("would remove finalizers [%s %s] from deployment %s/shared", vocab.FinalizerRecord, vocab.FinalizerDrain, ns))
	require.NoError(t, local.Client.Get(ctx, client.ObjectKey{Name: "deployguard-validating"}, &admissionregistrationv1.ValidatingWebhookConfiguration{}), "a dry run removes nothing")
	require.Equal(t, vocab.CanonicalFinalizers(), get(ctx, t, ns, "plain").Finalizers)
	assert.Contains(t, out, fmt.Sprintf("would end the rollback verdict on deployment %s/rolled", ns))
	require.NotNil(t, condition(get(ctx, t, ns, "rolled"), vocab.ConditionStalled), "a dry run ends no verdict")

	out, err = guard(ctx, t, "uninstall")
	require.NoError(t, err, out)
	t.Log(out)
	hooksGone := strings.Index(out, "deleted validatingwebhookconfiguration/deployguard-validating")
	firstRemoval := strings.Index(out, "removed finalizers")
	require.GreaterOrEqual(t, hooksGone, 0, out)
	require.GreaterOrEqual(t, firstRemoval, 0, out)
	assert.Less(t, hooksGone, firstRemoval, "the webhooks go first")
	assert.Contains(t, out, "deleted mutatingwebhookconfiguration/deployguard-mutating")
	assert.Contains(t, out, fmt.Sprintf("removed finalizers [%s %s] from deployment %s/plain", vocab.FinalizerRecord, vocab.FinalizerDrain, ns))
	assert.Contains(t, out, fmt.Sprintf("ended the rollback verdict on deployment %s/rolled", ns))

	require.NoError(t, local.Guard.Stop())

	// The rolled-back Deployment no longer reads as failed, and a fix rolls
	// out without the guard's verdict coming back.
	rolled := get(ctx, t, ns, "rolled")
	assert.Nil(t, condition(rolled, vocab.ConditionStalled), describe(rolled))
	assert.NotContains(t, rolled.Labels, vocab.LabelRolledBack)
	ledger, _ := rollout.ReadLedger(rolled)
	assert.Empty(t, ledger.RolledBackTo, "the ledger names no rollback that stands: %s", describe(rolled))
	require.NoError(t, update(t, ns, "rolled", func(d *appsv1.Deployment) { d.Spec.Template.Spec.Containers[0].Image = "app:3" }))
	rolled = waitAvailable(t, ns, "rolled", time.Minute)
	assert.Nil(t, condition(rolled, vocab.ConditionStalled), describe(rolled))

	assert.Empty(t, get(ctx, t, ns, "plain").Finalizers)
	assert.Equal(t, []string{keep}, get(ctx, t, ns, "shared").Finalizers, "only the guard's finalizers were removed")
	// Without the guard nor its webhooks, Deployments come and go as in a
	// cluster that never had it.
	require.NoError(t, local.Client.Create(ctx, withCleanup(harness.Deployment(ns, "after", "app:1", shortDeadline))))
	assert.Empty(t, get(ctx, t, ns, "after").Finalizers)
	for _, name := range []string{"plain", "shared", "after"} {
		require.NoError(t, local.Client.Delete(ctx, get(ctx, t, ns, name)))
	}
	waitGone(t, ns, "plain", 10*time.Second)
	waitGone(t, ns, "after", 10*time.Second)
	d := get(ctx, t, ns, "shared")
	assert.NotNil(t, d.DeletionTimestamp)
	assert.Equal(t, []string{keep}, d.Finalizers, "waits only for its other finalizer")
	patch := client.MergeFrom(d.DeepCopy())
	d.Finalizers = nil
	require.NoError(t, local.Client.Patch(ctx, d, patch))
	waitGone(t, ns, "shared", 10*time.Second)

	// Installed again without a restart of kube-apiserver, which then no
	// longer reads the refusals' params (kubernetes/kubernetes#130887) and,
	// by parameterNotFoundAction: Allow, admits everything, while the
	// policy, its binding and its params are all in place. The guard finds
	// out by asking the API server (its floor probe), says why, and
	// refuses itself what the floor would; an API server without that bug
	// refuses it itself. Either way, the strategy is refused.
	require.NoError(t, harness.InstallWebhooks(ctx, local.Client, local.Guard.URL, nil))
	out, err = local.Cluster.Kubectl(ctx, local.Cluster.Kubeconfig, "apply", "-k", harness.NativeDir())
	require.NoError(t, err, out)
	require.NoError(t, local.StartGuard(ctx, local.Guard.Opts.WebhookPort))
	allDown := harness.Deployment(ns, "all-down", "app:1", shortDeadline)
	allDown.Spec.Strategy.RollingUpdate = &appsv1.RollingUpdateDeployment{MaxUnavailable: ptr(intstr.FromString("100%")), MaxSurge: ptr(intstr.FromInt32(0))}
	// Refused by the policy, or by the guard failing closed: its create
	// entry (Ignore) refuses too, until the leader has routed the refusals
	// to the enforce entry.
	byPolicy := "ValidatingAdmissionPolicy '" + native.Refusals + "'"
	byGuard := `admission webhook "` + routing.EnforceWebhook + `" denied the request`
	var last error
	require.Eventually(t, func() bool {
		last = local.Client.Create(ctx, allDown.DeepCopy(), client.DryRunAll)
		return last != nil && strings.Contains(last.Error(), "may take every replica down at once") &&
			(strings.Contains(last.Error(), byPolicy) || strings.Contains(last.Error(), byGuard))
	}, time.Minute, 100*time.Millisecond, "an all-replicas-down strategy after the reinstall: %v", last)
	t.Logf("after the reinstall: %v", last)
	if strings.Contains(last.Error(), byPolicy) {
		// Refused with the params it kept from before the uninstall, or
		// with those it reads again: its refusal of the probe names them.
		params := &corev1.ConfigMap{}
		require.NoError(t, local.Client.Get(ctx, client.ObjectKey{Namespace: harness.GuardNamespace, Name: nativeconfig.ParamsName}, params))
		err := local.Client.Create(ctx, floor.ProbeDeployment(ns), client.DryRunAll)
		require.Error(t, err)
		if strings.Contains(err.Error(), "(params "+params.ResourceVersion+")") {
			return // this kube-apiserver reads the params again
		}
	}
	harness.WaitFor(t, 30*time.Second, "the guard's log says what it found and what to do", func(context.Context) (bool, string, error) {
		logs, err := os.ReadFile(logPath)
		if err != nil {
			return false, "", err
		}
		// Without params it admits everything; with those it read before
		// the uninstall it refuses with them.
		return (strings.Contains(string(logs), "kube-apiserver admitted a dry-run create that "+native.Refusals+" refuses") ||
			strings.Contains(string(logs), "it no longer reads them")) &&
			strings.Contains(string(logs), "kubernetes/kubernetes#130887"), "", nil
	})
	_, metrics, err := local.Guard.Get(local.Guard.Metrics, "/metrics")
	require.NoError(t, err)
	assert.Contains(t, metrics, "\ndeployguard_native_policies_enforced 0\n")
}
