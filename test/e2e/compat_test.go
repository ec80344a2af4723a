package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler"
	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/test/harness"
)

// podsOf lists the pods a Deployment's selector selects.
func podsOf(ctx context.Context, t *testing.T, ns string, d *appsv1.Deployment) []corev1.Pod {
	t.Helper()
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	require.NoError(t, err)
	var pods corev1.PodList
	require.NoError(t, local.Client.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabelsSelector{Selector: sel}))
	return pods.Items
}

// A client that deletes a Deployment and waits for its pods to go (upstream's
// "deployment reaping should cascade to its replica sets and pods") finds the
// Deployment gone too: a default install holds no deletion.
func TestDeleteThenWaitForThePodsFindsTheDeploymentGone(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, local.Client)
	d := harness.Deployment(ns, "reaped", "app:1", shortDeadline)
	d.Spec.Replicas = ptr(int32(3))
	require.NoError(t, local.Client.Create(ctx, d))
	d = waitAvailable(t, ns, "reaped", time.Minute)
	assert.Empty(t, d.Finalizers, "no cleanup asked for, no finalizer")

	require.NoError(t, local.Client.Delete(ctx, d, client.PropagationPolicy(metav1.DeletePropagationBackground)))
	harness.WaitFor(t, 30*time.Second, "the pods did not go", func(ctx context.Context) (bool, string, error) {
		n := len(podsOf(ctx, t, ns, d))
		return n == 0, fmt.Sprintf("%d pods", n), nil
	})
	err := local.Client.Get(ctx, client.ObjectKeyFromObject(d), &appsv1.Deployment{})
	assert.True(t, apierrors.IsNotFound(err), "the Deployment outlived its pods: %v", err)
}

// Deleting a Deployment and creating one by the same name at once (kubectl
// replace --force, CI jobs, Helm's forced replace, upstream's admission-policy
// conformance specs) is never refused as "being deleted".
func TestDeleteAndCreateAgainByName(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, local.Client)
	require.NoError(t, local.Client.Create(ctx, harness.Deployment(ns, "again", "app:1", shortDeadline)))
	waitAvailable(t, ns, "again", time.Minute)
	for i := range 5 {
		require.NoError(t, local.Client.Delete(ctx, get(ctx, t, ns, "again")))
		require.NoError(t, local.Client.Create(ctx, harness.Deployment(ns, "again", fmt.Sprintf("app:%d", i+2), shortDeadline)), "round %d", i)
	}
	waitAvailable(t, ns, "again", time.Minute)

	out, err := local.Cluster.Kubectl(ctx, local.Cluster.Kubeconfig, "get", "deployment", "again", "-n", ns, "-o", "yaml")
	require.NoError(t, err, out)
	path := writeTemp(t, out)
	out, err = local.Cluster.Kubectl(ctx, local.Cluster.Kubeconfig, "replace", "--force", "-f", path)
	require.NoError(t, err, out)
	assert.Contains(t, out, "replaced")
}

// A Deployment that asks for its cleanup, deleted with propagationPolicy
// Orphan, keeps its ReplicaSets and their pods running for a new owner: the
// drain is skipped, the record is still saved.
func TestOrphaningDeletionOfAGuardedDeploymentKeepsItsPods(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, local.Client)
	require.NoError(t, local.Client.Create(ctx, withCleanup(harness.Deployment(ns, "orphaned", "app:1", shortDeadline))))
	d := waitAvailable(t, ns, "orphaned", time.Minute)
	require.Equal(t, vocab.CanonicalFinalizers(), d.Finalizers)

	require.NoError(t, local.Client.Delete(ctx, d, client.PropagationPolicy(metav1.DeletePropagationOrphan)))
	waitGone(t, ns, "orphaned", 30*time.Second)
	waitEvents(t, ns, "orphaned", vocab.ReasonRecorded, vocab.ReasonDrainSkipped)

	var rss appsv1.ReplicaSetList
	require.NoError(t, local.Client.List(ctx, &rss, client.InNamespace(ns)))
	require.Len(t, rss.Items, 1, "the ReplicaSet was orphaned, not deleted")
	assert.Equal(t, int32(2), *rss.Items[0].Spec.Replicas, "nor scaled down")
	assert.Nil(t, metav1.GetControllerOf(&rss.Items[0]))
	pods := podsOf(ctx, t, ns, d)
	assert.Len(t, pods, 2)
	for _, p := range pods {
		assert.Nil(t, p.DeletionTimestamp, "pod %s still runs", p.Name)
	}
	require.NoError(t, local.Client.Get(ctx, client.ObjectKey{Namespace: harness.GuardNamespace, Name: reconciler.RecordName(ns, "orphaned")}, &corev1.ConfigMap{}))
}

// In a namespace whose pod quota is full, a rolling update with upstream's
// default strategy (maxUnavailable 25%: one of four replicas) completes: the
// guard does not change the rollout arithmetic, so no surge pod is needed.
func TestRolloutCompletesUnderAFullPodQuota(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, local.Client)
	quota := &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pods"},
		Spec:       corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("4")}},
	}
	require.NoError(t, local.Client.Create(ctx, quota))
	// Until the quota controller has counted the namespace, the API server
	// refuses every pod ("status unknown for quota").
	harness.WaitFor(t, time.Minute, "the quota was not counted", func(ctx context.Context) (bool, string, error) {
		err := local.Client.Get(ctx, client.ObjectKeyFromObject(quota), quota)
		return err == nil && quota.Status.Hard != nil, fmt.Sprint(quota.Status), err
	})
	d := harness.Deployment(ns, "quota", "app:1", shortDeadline)
	d.Spec.Replicas = ptr(int32(4))
	// A slow rollout here is not a failed one: the deadline is upstream's.
	d.Spec.ProgressDeadlineSeconds = ptr(int32(600))
	d.Spec.Strategy = appsv1.DeploymentStrategy{} // upstream's default, as a manifest leaves it
	require.NoError(t, local.Client.Create(ctx, d))
	d = waitAvailable(t, ns, "quota", time.Minute)
	assert.Equal(t, "25%", d.Spec.Strategy.RollingUpdate.MaxUnavailable.String(), "upstream's default kept")
	assert.NotContains(t, d.Annotations, vocab.AnnotationDefaulted)

	stop := retryPodCreates(t, ns)
	defer stop()
	out, err := local.Cluster.Kubectl(ctx, local.Cluster.Kubeconfig, "set", "image", "deployment/quota", "app=app:2", "-n", ns)
	require.NoError(t, err, out)
	d = waitAvailable(t, ns, "quota", 5*time.Minute)
	assert.Equal(t, "app:2", d.Spec.Template.Spec.Containers[0].Image)
	assert.Equal(t, "2", d.Annotations[vocab.RevisionAnnotation])
	assert.Zero(t, rolledBackRevision(d), "completed, not rolled back")
	assert.NotContains(t, d.Labels, vocab.LabelRolledBack, "completed, not rolled back")
	for _, p := range podsOf(ctx, t, ns, d) {
		if p.DeletionTimestamp == nil {
			assert.Equal(t, "app:2", p.Spec.Containers[0].Image)
		}
	}
}

// retryPodCreates touches, every few seconds, each ReplicaSet in ns that is
// short of its pods, until stop is called. Each step of a rollout under a
// full quota waits for an old pod to go; meanwhile every event on the new
// ReplicaSet's pods makes the ReplicaSet controller try the create again,
// fail, and double its backoff (5 ms doubled a dozen times or more: from 20 s
// to past the progress deadline on a loaded machine). An update of the
// ReplicaSet makes it try at once, as its backoff would later: how long
// upstream waits is not what this test is about.
func retryPodCreates(t *testing.T, ns string) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		n := 0
		_ = wait.PollUntilContextCancel(ctx, 3*time.Second, false, func(ctx context.Context) (bool, error) {
			var rss appsv1.ReplicaSetList
			if err := local.Client.List(ctx, &rss, client.InNamespace(ns)); err != nil {
				return false, nil //nolint:nilerr // a failed list is tried again
			}
			for i := range rss.Items {
				rs := &rss.Items[i]
				if rs.Spec.Replicas == nil || rs.Status.Replicas >= *rs.Spec.Replicas {
					continue
				}
				n++
				patch := fmt.Sprintf(`{"metadata":{"annotations":{"test.deployguard.io/retry":"%d"}}}`, n)
				_ = local.Client.Patch(ctx, rs, client.RawPatch(types.MergePatchType, []byte(patch)))
			}
			return false, nil
		})
	}()
	return func() { cancel(); <-done }
}

// writeTemp writes content to a file of the test's own.
func writeTemp(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "manifest.yaml")
	require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
	return p
}
