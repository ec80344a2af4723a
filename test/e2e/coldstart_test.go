package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/test/harness"
)

// TestColdStartWithoutTheGuard starts a whole cluster whose guard webhooks are
// registered while no guard runs, as after a cluster stop and start, before
// the guard's own pod is up. Nothing may wait on the guard to start the
// guard: the control plane comes up, the guard's own Deployment (in its
// excluded namespace) rolls out a new revision, scaling through the scale
// subresource works for every Deployment, and an ordinary create in a guarded
// namespace goes through (the validating webhook takes it in its Ignore
// entry), while the native policies still refuse what needs only the object;
// only what an enforced rule needs the guard for is refused, until the guard
// is back.
//
// A rollout is followed up to the pods the new ReplicaSet creates and the
// scheduler binds: every write on the way (the Deployment, the ReplicaSet,
// the pods, their binding) goes through admission, where the guard could
// block it. Whether the pods then run is the kubelet's part, kwok's here,
// which no webhook of the guard sees; after a restart kwok takes its nodes
// back only once their leases expire, and was once seen not to within three
// minutes on a loaded machine, so the test does not wait on it.
func TestColdStartWithoutTheGuard(t *testing.T) {
	l, _ := ownCluster(t, "cold")
	ctx := context.Background()
	ns := harness.NewNamespace(t, local.Client)
	require.NoError(t, l.Client.Create(ctx, harness.Deployment(ns, "web", "app:1", shortDeadline)))
	waitAvailable(t, ns, "web", time.Minute)
	// A stand-in for the guard's own Deployment, where config/ installs it.
	own := harness.Deployment(harness.GuardNamespace, "deployguard", "deployguard:dev", shortDeadline)
	require.NoError(t, l.Client.Create(ctx, own))
	waitAvailable(t, harness.GuardNamespace, "deployguard", time.Minute)

	port := l.Guard.Opts.WebhookPort
	require.NoError(t, l.Guard.Stop())
	require.NoError(t, l.Cluster.StopControlPlane(ctx))
	started := time.Now()
	require.NoError(t, l.Cluster.StartControlPlane(ctx))
	t.Logf("control plane ready %s after its start, with the guard's webhooks registered and no guard", time.Since(started).Round(100*time.Millisecond))

	// The guard's own Deployment rolls out a new revision (as an upgrade or
	// a node drain would need) without the guard.
	require.NoError(t, update(t, harness.GuardNamespace, "deployguard", func(d *appsv1.Deployment) {
		d.Spec.Template.Annotations = map[string]string{"kubectl.kubernetes.io/restartedAt": time.Now().Format(time.RFC3339)}
	}))
	placed := podsPlaced(t, l.Client, harness.GuardNamespace, "deployguard", 1,
		"the guard's own Deployment did not roll out a new revision without the guard")
	t.Logf("the guard's own Deployment: new ReplicaSet %s, its pods created and bound %s after the control plane's start", placed, time.Since(started).Round(100*time.Millisecond))
	// kube-system is excluded too.
	require.NoError(t, l.Client.Create(ctx, harness.Deployment("kube-system", "addon", "addon:1", shortDeadline)))
	// Scaling a guarded Deployment goes through the scale subresource, which
	// the webhooks do not intercept: an HPA keeps working.
	scale := &autoscalingv1.Scale{Spec: autoscalingv1.ScaleSpec{Replicas: 3}}
	require.NoError(t, l.Client.SubResource("scale").Update(ctx, get(ctx, t, ns, "web"), client.WithSubResourceBody(scale)))
	podsPlaced(t, l.Client, ns, "web", 3, "the scale of a guarded Deployment was not carried out")
	// An ordinary create goes through; the floor holds in the API server.
	require.NoError(t, l.Client.Create(ctx, harness.Deployment(ns, "new", "app:1", shortDeadline)), "an ordinary create needs no guard")
	allDown := harness.Deployment(ns, "all-down", "app:1", shortDeadline)
	allDown.Spec.Replicas = ptr(int32(2))
	allDown.Spec.Strategy.RollingUpdate = &appsv1.RollingUpdateDeployment{MaxUnavailable: ptr(intstr.FromString("100%")), MaxSurge: ptr(intstr.FromInt32(0))}
	err := l.Client.Create(ctx, allDown)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "deployguard-refusals", "refused by the native policy, without the guard")
	// Bringing back a quarantined template is the guard's to decide: refused
	// (failurePolicy Fail), and the error says why.
	held := harness.Deployment(ns, "held", "app:1", shortDeadline)
	// As a rollback writes it: the list and the label the enforce entry
	// selects on.
	held.Annotations = map[string]string{vocab.AnnotationQuarantinedTemplates: "0123456789"}
	held.Labels = map[string]string{vocab.LabelQuarantined: vocab.LabelQuarantinedValue}
	require.NoError(t, l.Client.Create(ctx, held))
	err = update(t, ns, "held", func(d *appsv1.Deployment) { d.Spec.Template.Spec.Containers[0].Image = "app:2" })
	require.Error(t, err)
	assert.Contains(t, err.Error(), `failed calling webhook "enforce.deployments.deployguard.io"`, "refused because the guard is not there, and the error says so")

	start := time.Now()
	require.NoError(t, l.StartGuard(ctx, port))
	require.NoError(t, update(t, ns, "held", func(d *appsv1.Deployment) { d.Spec.Template.Spec.Containers[0].Image = "app:2" }))
	t.Logf("guard started after the cold start: admitting again %s after its start", time.Since(start).Round(100*time.Millisecond))
	var pods corev1.PodList
	require.NoError(t, l.Client.List(ctx, &pods, client.InNamespace(harness.GuardNamespace)))
	assert.NotEmpty(t, pods.Items)
}

// podsPlaced waits until the ReplicaSet of the Deployment's current revision
// wants at least want pods and has created them all, each bound to a node,
// and returns its name.
func podsPlaced(t *testing.T, c client.Client, ns, name string, want int32, msg string) string {
	t.Helper()
	var placed string
	harness.WaitFor(t, 3*time.Minute, msg, func(ctx context.Context) (bool, string, error) {
		d := &appsv1.Deployment{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, d); err != nil {
			return false, err.Error(), nil
		}
		revision := d.Annotations["deployment.kubernetes.io/revision"]
		if d.Status.ObservedGeneration != d.Generation || revision == "" {
			return false, "the Deployment controller has not seen the change: " + describe(d), nil
		}
		var sets appsv1.ReplicaSetList
		if err := c.List(ctx, &sets, client.InNamespace(ns)); err != nil {
			return false, err.Error(), nil
		}
		for _, rs := range sets.Items {
			if !metav1.IsControlledBy(&rs, d) || rs.Annotations["deployment.kubernetes.io/revision"] != revision {
				continue
			}
			if rs.Spec.Replicas == nil || *rs.Spec.Replicas < want {
				return false, fmt.Sprintf("ReplicaSet %s of revision %s wants %v pods", rs.Name, revision, rs.Spec.Replicas), nil
			}
			var pods corev1.PodList
			if err := c.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{"pod-template-hash": rs.Labels["pod-template-hash"]}); err != nil {
				return false, err.Error(), nil
			}
			bound := int32(0)
			for _, p := range pods.Items {
				if p.DeletionTimestamp == nil && p.Spec.NodeName != "" {
					bound++
				}
			}
			placed = rs.Name
			return bound >= *rs.Spec.Replicas, fmt.Sprintf("ReplicaSet %s: %d of %d pods created and bound", rs.Name, bound, *rs.Spec.Replicas), nil
		}
		return false, "no ReplicaSet of revision " + revision + " yet", nil
	})
	return placed
}
