package integration

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/vocab"
)

func TestEmptySelectorIsRepairedFromStableLabels(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t, nil)
	c, _ := clientAs(t, "")

	d := deployment(ns, "shop", func(d *appsv1.Deployment) {
		d.Spec.Selector = nil
		d.Spec.Template.Labels = map[string]string{"app.kubernetes.io/name": "shop", "app.kubernetes.io/version": "1.2"}
	})
	require.NoError(t, c.Create(ctx, d))

	got := &appsv1.Deployment{}
	require.NoError(t, k8s.Get(ctx, client.ObjectKeyFromObject(d), got))
	assert.Equal(t, map[string]string{"app.kubernetes.io/name": "shop"}, got.Spec.Selector.MatchLabels,
		"the selector comes from the stable label, never from the version")
	assert.Contains(t, got.Annotations[vocab.AnnotationDefaulted], "spec.selector")
	assert.Equal(t, vocab.CanonicalFinalizers(), got.Finalizers)
	assert.Equal(t, intstr.FromInt32(0), *got.Spec.Strategy.RollingUpdate.MaxUnavailable)
}

func TestEmptySelectorWithoutStableLabelsIsRefusedWithTheGuardsMessage(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t, nil)
	d := deployment(ns, "nolabels", func(d *appsv1.Deployment) {
		d.Spec.Selector = nil
		d.Spec.Template.Labels = map[string]string{"version": "v3"}
	})
	err := k8s.Create(ctx, d)
	require.Error(t, err)
	assert.True(t, apierrors.IsInvalid(err), "want 422 Invalid, got %v", err)
	assert.Contains(t, err.Error(), "admission webhook \"default.deployments.deployguard.io\" denied the request")
	assert.Contains(t, err.Error(), "Add one to spec.template.metadata.labels (for example app.kubernetes.io/name: nolabels)")
}

func TestOverlappingSelectorsAreRefused(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t, nil)
	require.NoError(t, k8s.Create(ctx, deployment(ns, "web", func(d *appsv1.Deployment) {
		d.Spec.Selector.MatchLabels = map[string]string{"app.kubernetes.io/name": "web", "track": "stable"}
		d.Spec.Template.Labels = map[string]string{"app.kubernetes.io/name": "web", "track": "stable"}
	})))
	// The guard lists from its cache: wait until it has seen "web".
	broad := deployment(ns, "web-all", func(d *appsv1.Deployment) {
		d.Spec.Selector.MatchLabels = map[string]string{"app.kubernetes.io/name": "web"}
		d.Spec.Template.Labels = map[string]string{"app.kubernetes.io/name": "web"}
	})
	var err error
	require.Eventually(t, func() bool {
		err = k8s.Create(ctx, broad.DeepCopy(), client.DryRunAll)
		return err != nil
	}, waitShort, tick, "an overlapping Deployment was admitted")
	assert.Contains(t, err.Error(), `also selects the pods of Deployment "web"`)

	err = k8s.Create(ctx, broad.DeepCopy())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "spec.selector")
	assert.True(t, apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(broad), &appsv1.Deployment{})))
}

func TestWarningsReachTheClient(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t, nil)
	c, warnings := clientAs(t, "")
	d := deployment(ns, "noprobe", func(d *appsv1.Deployment) {
		d.Spec.Template.Spec.Containers[0].ReadinessProbe = nil
		d.Spec.Replicas = ptr(int32(3))
		d.Spec.Strategy.Type = appsv1.RecreateDeploymentStrategyType
	})
	require.NoError(t, c.Create(ctx, d))
	all := strings.Join(warnings.all(), "\n")
	assert.Contains(t, all, "no container has a readinessProbe")
	assert.Contains(t, all, "Recreate stops all 3 replicas")
}

func TestServerSideDryRun(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t, nil)
	d := deployment(ns, "dry", func(d *appsv1.Deployment) { d.Spec.Selector = nil })
	require.NoError(t, k8s.Create(ctx, d, client.DryRunAll), "sideEffects: None makes dry runs possible")
	assert.Equal(t, map[string]string{"app.kubernetes.io/name": "dry"}, d.Spec.Selector.MatchLabels, "the dry run shows the guard's defaults")
	assert.True(t, apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(d), &appsv1.Deployment{})), "a dry run stores nothing")

	bad := deployment(ns, "dry-bad", func(d *appsv1.Deployment) {
		d.Spec.Strategy.RollingUpdate = &appsv1.RollingUpdateDeployment{MaxUnavailable: ptr(intstr.FromString("100%"))}
	})
	err := k8s.Create(ctx, bad, client.DryRunAll)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "resolves to 2 of 2 replicas")
}

func TestRefusedUpdateLeavesTheStoredObjectUnchanged(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t, nil)
	d := deployment(ns, "steady")
	require.NoError(t, k8s.Create(ctx, d))
	before := &appsv1.Deployment{}
	require.NoError(t, k8s.Get(ctx, client.ObjectKeyFromObject(d), before))

	upd := before.DeepCopy()
	upd.Spec.Strategy.RollingUpdate.MaxUnavailable = ptr(intstr.FromString("100%"))
	upd.Spec.RevisionHistoryLimit = ptr(int32(1000))
	err := k8s.Update(ctx, upd)
	require.Error(t, err)
	// Every problem at once, each with its path.
	assert.Contains(t, err.Error(), "spec.strategy.rollingUpdate.maxUnavailable")
	assert.Contains(t, err.Error(), "spec.revisionHistoryLimit")

	after := &appsv1.Deployment{}
	require.NoError(t, k8s.Get(ctx, client.ObjectKeyFromObject(d), after))
	assert.Equal(t, before.ResourceVersion, after.ResourceVersion)
	assert.Equal(t, before.Spec, after.Spec)
}

func TestFinalizersAreTheGuardsToRemove(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t, nil)
	d := deployment(ns, "fin")
	require.NoError(t, k8s.Create(ctx, d))
	require.Equal(t, vocab.CanonicalFinalizers(), d.Finalizers)

	// A user cannot drop them...
	patch := client.MergeFrom(d.DeepCopy())
	d.Finalizers = nil
	err := k8s.Patch(ctx, d, patch)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "may be removed or reordered only by deployguard itself")

	// ...the guard can.
	guard, _ := clientAs(t, guardUser)
	cur := &appsv1.Deployment{}
	require.NoError(t, k8s.Get(ctx, client.ObjectKeyFromObject(d), cur))
	patch = client.MergeFrom(cur.DeepCopy())
	cur.Finalizers = []string{vocab.FinalizerRecord}
	require.NoError(t, guard.Patch(ctx, cur, patch))
	assert.Equal(t, []string{vocab.FinalizerRecord}, cur.Finalizers, "the mutating webhook does not put a removed finalizer back")

	// Unknown finalizers in the guard's domain are refused.
	patch = client.MergeFrom(cur.DeepCopy())
	cur.Finalizers = append(cur.Finalizers, "deployguard.io/snapshot")
	err = k8s.Patch(ctx, cur, patch)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `Unsupported value: "deployguard.io/snapshot"`)
}

func TestProtectedDeploymentCannotBeDeleted(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t, nil)
	d := deployment(ns, "precious", func(d *appsv1.Deployment) {
		d.Annotations = map[string]string{vocab.AnnotationProtected: "true"}
	})
	require.NoError(t, k8s.Create(ctx, d))
	err := k8s.Delete(ctx, d)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "kubectl annotate deployment precious -n "+ns+" deployguard.io/protected-")
	got := &appsv1.Deployment{}
	require.NoError(t, k8s.Get(ctx, client.ObjectKeyFromObject(d), got))
	assert.Nil(t, got.DeletionTimestamp)
}

func TestOptedOutNamespaceIsNotGuarded(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t, map[string]string{vocab.LabelGuard: vocab.LabelGuardDisabled})
	d := deployment(ns, "free")
	require.NoError(t, k8s.Create(ctx, d))
	assert.Empty(t, d.Finalizers)
	assert.NotContains(t, d.Annotations, vocab.AnnotationDefaulted)
	assert.Equal(t, intstr.FromString("25%"), *d.Spec.Strategy.RollingUpdate.MaxUnavailable)
}

func TestSystemNamespacesAreNotGuarded(t *testing.T) {
	ctx := context.Background()
	d := deployment("kube-system", "system-thing", func(d *appsv1.Deployment) {
		d.Spec.RevisionHistoryLimit = ptr(int32(1000)) // the guard would refuse this
	})
	require.NoError(t, k8s.Create(ctx, d))
	assert.Empty(t, d.Finalizers)
	require.NoError(t, k8s.Delete(ctx, d))
}
