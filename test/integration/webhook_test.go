package integration

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/test/harness"
	"github.com/deployguard/deployguard/webhook/native"
)

func TestEmptySelectorIsRepairedFromStableLabels(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, k8s, kept)
	c, warnings := clientAs(t, "")

	d := harness.Deployment(ns, "shop", appImage, func(d *appsv1.Deployment) {
		d.Spec.Selector = nil
		d.Spec.Template.Labels = map[string]string{"app.kubernetes.io/name": "shop", "app.kubernetes.io/version": "1.2"}
	})
	require.NoError(t, c.Create(ctx, d))

	got := &appsv1.Deployment{}
	require.NoError(t, k8s.Get(ctx, client.ObjectKeyFromObject(d), got))
	assert.Equal(t, map[string]string{"app.kubernetes.io/name": "shop"}, got.Spec.Selector.MatchLabels,
		"the selector comes from the stable label, never from the version")
	assert.Equal(t, "spec.selector", got.Annotations[vocab.AnnotationDefaulted], "nothing else is changed")
	// The API server's deployguard-selector repaired it and routed the
	// create to the guard by a label; the guard turned its mark into its
	// own record and removed both.
	assert.NotContains(t, got.Annotations, native.AnnotationSelectorRepaired, "the mark is the guard's record now")
	assert.NotContains(t, got.Labels, native.LabelDefaulting, "the routing label is removed")
	assert.NotContains(t, got.Labels, native.LabelRefusals, "and the refusals' label, the refusals having admitted it")
	assert.Empty(t, got.Finalizers, "no cleanup asked for, none held")
	assert.Equal(t, intstr.FromString("25%"), *got.Spec.Strategy.RollingUpdate.MaxUnavailable, "upstream's rollout arithmetic")
	assert.Contains(t, warnings.all(), "spec.selector: the selector was empty; deployguard set it to app.kubernetes.io/name=shop from the template's stable labels: write it into the manifest to keep it")
}

func TestEmptySelectorWithoutStableLabelsIsRefusedWithTheGuardsMessage(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, k8s, kept)
	d := harness.Deployment(ns, "nolabels", appImage, func(d *appsv1.Deployment) {
		d.Spec.Selector = nil
		d.Spec.Template.Labels = map[string]string{"version": "v3"}
	})
	err := k8s.Create(ctx, d)
	require.Error(t, err)
	assert.True(t, apierrors.IsInvalid(err), "want 422 Invalid, got %v", err)
	// deployguard-selector marked it and labelled it for the mutating
	// webhook's entry for creates, which refuses it first.
	assert.Contains(t, err.Error(), "admission webhook \"default-create.deployments.deployguard.io\" denied the request")
	assert.Contains(t, err.Error(), "Add one to spec.template.metadata.labels (for example app.kubernetes.io/name: nolabels)")
}

func TestOverlappingSelectorsAreRefused(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, k8s, kept)
	require.NoError(t, k8s.Create(ctx, harness.Deployment(ns, "web", appImage, func(d *appsv1.Deployment) {
		d.Spec.Selector.MatchLabels = map[string]string{"app.kubernetes.io/name": "web", "track": "stable"}
		d.Spec.Template.Labels = map[string]string{"app.kubernetes.io/name": "web", "track": "stable"}
	})))
	// The guard lists from its cache: wait until it has seen "web".
	broad := harness.Deployment(ns, "web-all", appImage, func(d *appsv1.Deployment) {
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
	ns := harness.NewNamespace(t, k8s, kept)
	c, warnings := clientAs(t, "")
	d := harness.Deployment(ns, "noprobe", appImage, func(d *appsv1.Deployment) {
		d.Spec.Template.Spec.Containers[0].ReadinessProbe = nil
		d.Spec.Replicas = ptr(int32(3))
		d.Spec.Strategy.Type = appsv1.RecreateDeploymentStrategyType
	})
	require.NoError(t, c.Create(ctx, d))
	assert.ElementsMatch(t, []string{
		`[policy probes] spec.template.spec.containers[0].readinessProbe: container "app" has no readinessProbe: add one (httpGet, tcpSocket, grpc or exec), or a rollout of pods that cannot serve completes anyway and is never rolled back`,
		"spec.strategy.type: Recreate stops all 3 replicas before starting new ones, so every rollout is an outage; use RollingUpdate unless the app cannot run two versions at once",
	}, warnings.all(), "one warning per problem")
}

func TestServerSideDryRun(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, k8s, kept)
	d := harness.Deployment(ns, "dry", appImage, func(d *appsv1.Deployment) { d.Spec.Selector = nil })
	require.NoError(t, k8s.Create(ctx, d, client.DryRunAll), "sideEffects: None makes dry runs possible")
	assert.Equal(t, map[string]string{"app.kubernetes.io/name": "dry"}, d.Spec.Selector.MatchLabels, "the dry run shows the guard's defaults")
	assert.True(t, apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(d), &appsv1.Deployment{})), "a dry run stores nothing")

	bad := harness.Deployment(ns, "dry-bad", appImage, func(d *appsv1.Deployment) {
		d.Spec.Strategy.RollingUpdate = &appsv1.RollingUpdateDeployment{MaxUnavailable: ptr(intstr.FromString("100%"))}
	})
	err := k8s.Create(ctx, bad, client.DryRunAll)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "resolves to 2 of 2 replicas")
}

func TestRefusedUpdateLeavesTheStoredObjectUnchanged(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, k8s, kept)
	d := harness.Deployment(ns, "steady", appImage)
	require.NoError(t, k8s.Create(ctx, d))
	before := &appsv1.Deployment{}
	require.NoError(t, k8s.Get(ctx, client.ObjectKeyFromObject(d), before))

	upd := before.DeepCopy()
	upd.Spec.Strategy.RollingUpdate.MaxUnavailable = ptr(intstr.FromString("100%"))
	upd.Finalizers = append(upd.Finalizers, "deployguard.io/snapshot")
	err := k8s.Update(ctx, upd)
	require.Error(t, err)
	// The API server's native policy refuses it, naming the field; it
	// stops at the first of its refusals.
	assert.Contains(t, err.Error(), "ValidatingAdmissionPolicy 'deployguard-refusals'")
	assert.Contains(t, err.Error(), "spec.strategy.rollingUpdate.maxUnavailable: 100% resolves to 2 of 2 replicas")

	after := &appsv1.Deployment{}
	require.NoError(t, k8s.Get(ctx, client.ObjectKeyFromObject(d), after))
	assert.Equal(t, before.ResourceVersion, after.ResourceVersion)
	assert.Equal(t, before.Spec, after.Spec)
}

// A client that sends a whole object built on its own side (Get, modify its
// own copy, Update; kubectl replace) does not know the guard's finalizers.
// Leaving them out is not a request to remove them: they are put back, and
// nothing is refused. Removing them stays possible the documented ways.
func TestGuardFinalizersSurviveClientsThatDoNotKnowThem(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, k8s, kept)
	d := harness.Deployment(ns, "fin", appImage, func(d *appsv1.Deployment) {
		d.Annotations = map[string]string{vocab.AnnotationCleanup: "record,drain"}
	})
	require.NoError(t, k8s.Create(ctx, d))
	require.Equal(t, vocab.CanonicalFinalizers(), d.Finalizers, "asked for: record, then drain")
	assert.NotContains(t, d.Labels, native.LabelDefaulting, "labelled for the guard by the API server, and the label removed by it")
	assert.NotContains(t, d.Labels, native.LabelRefusals, "labelled for the refusals by the API server, and the label removed by the guard")

	t.Run("typed client: Get, modify its own copy, Update", func(t *testing.T) {
		cur := &appsv1.Deployment{}
		require.NoError(t, k8s.Get(ctx, client.ObjectKeyFromObject(d), cur))
		own := harness.Deployment(ns, "fin", appImage, func(o *appsv1.Deployment) {
			o.Annotations = map[string]string{vocab.AnnotationCleanup: "record,drain"}
			o.Labels = map[string]string{"updated": "by-a-client"}
			o.ResourceVersion = cur.ResourceVersion
		})
		require.NoError(t, k8s.Update(ctx, own))
		assert.Equal(t, vocab.CanonicalFinalizers(), own.Finalizers)
		assert.Equal(t, "by-a-client", own.Labels["updated"])
	})

	t.Run("kubectl replace", func(t *testing.T) {
		manifest := harness.Deployment(ns, "fin", appImage, func(o *appsv1.Deployment) {
			o.Annotations = map[string]string{vocab.AnnotationCleanup: "record,drain"}
			o.Labels = map[string]string{"updated": "by-kubectl-replace"}
		})
		manifest.SetGroupVersionKind(appsv1.SchemeGroupVersion.WithKind("Deployment"))
		out, err := kubectl(t, manifest, "replace", "-f", "-")
		require.NoError(t, err, out)
		got := &appsv1.Deployment{}
		require.NoError(t, k8s.Get(ctx, client.ObjectKeyFromObject(d), got))
		assert.Equal(t, vocab.CanonicalFinalizers(), got.Finalizers)
		assert.Equal(t, "by-kubectl-replace", got.Labels["updated"])
	})

	t.Run("an unknown cleanup step is refused with the steps there are", func(t *testing.T) {
		cur := &appsv1.Deployment{}
		require.NoError(t, k8s.Get(ctx, client.ObjectKeyFromObject(d), cur))
		cur.Annotations[vocab.AnnotationCleanup] = "record,snapshot"
		err := k8s.Update(ctx, cur)
		require.Error(t, err)
		assert.Contains(t, err.Error(), `unknown cleanup step "snapshot": the steps are "record" and "drain"`)
	})

	t.Run("unknown finalizers in the guard's domain are refused", func(t *testing.T) {
		cur := &appsv1.Deployment{}
		require.NoError(t, k8s.Get(ctx, client.ObjectKeyFromObject(d), cur))
		patch := client.MergeFrom(cur.DeepCopy())
		cur.Finalizers = append(cur.Finalizers, "deployguard.io/snapshot")
		err := k8s.Patch(ctx, cur, patch)
		require.Error(t, err)
		assert.Contains(t, err.Error(), `"deployguard.io/snapshot" is not one of deployguard's finalizers`)
	})

	t.Run("being deleted: a whole-object update keeps them, a break-glass user removes them", func(t *testing.T) {
		require.NoError(t, k8s.Delete(ctx, d))
		cur := &appsv1.Deployment{}
		require.NoError(t, k8s.Get(ctx, client.ObjectKeyFromObject(d), cur))
		require.NotNil(t, cur.DeletionTimestamp, "held by the guard's finalizers (no reconciler runs in this tier)")
		cur.Finalizers = nil
		require.NoError(t, k8s.Update(ctx, cur))
		assert.Equal(t, vocab.CanonicalFinalizers(), cur.Finalizers, "the cleanup has not run: its finalizers stay")

		admin, _ := clientAsGroups(t, "carol", breakGlassGroup, "system:masters")
		patch := client.MergeFrom(cur.DeepCopy())
		cur.Finalizers = nil
		require.NoError(t, admin.Patch(ctx, cur, patch))
		require.Eventually(t, func() bool {
			return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(d), &appsv1.Deployment{}))
		}, waitShort, tick, "gone once its finalizers are")
	})
}

// Removing the annotation is the way to stop the cleanup of a live
// Deployment: the finalizers go with it.
func TestRemovingTheCleanupAnnotationRemovesTheFinalizers(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, k8s, kept)
	d := harness.Deployment(ns, "fin", appImage, func(d *appsv1.Deployment) {
		d.Annotations = map[string]string{vocab.AnnotationCleanup: "record"}
		d.Finalizers = []string{"example.com/keep"}
	})
	require.NoError(t, k8s.Create(ctx, d))
	require.Equal(t, []string{"example.com/keep", vocab.FinalizerRecord}, d.Finalizers)

	patch := client.MergeFrom(d.DeepCopy())
	delete(d.Annotations, vocab.AnnotationCleanup)
	require.NoError(t, k8s.Patch(ctx, d, patch))
	assert.Equal(t, []string{"example.com/keep"}, d.Finalizers, "other controllers' finalizers stay")
}

func TestProtectedDeploymentCannotBeDeleted(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, k8s, kept)
	d := harness.Deployment(ns, "precious", appImage, func(d *appsv1.Deployment) {
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
	ns := harness.NewNamespace(t, k8s, kept, harness.NamespaceLabels(map[string]string{vocab.LabelGuard: vocab.LabelGuardDisabled}))
	d := harness.Deployment(ns, "free", appImage, func(d *appsv1.Deployment) {
		d.Annotations = map[string]string{vocab.AnnotationCleanup: "record,drain"}
	})
	require.NoError(t, k8s.Create(ctx, d))
	assert.Empty(t, d.Finalizers)
	assert.NotContains(t, d.Annotations, vocab.AnnotationDefaulted)
	assert.Equal(t, intstr.FromString("25%"), *d.Spec.Strategy.RollingUpdate.MaxUnavailable)
}

func TestSystemNamespacesAreNotGuarded(t *testing.T) {
	ctx := context.Background()
	d := harness.Deployment("kube-system", "system-thing", appImage, func(d *appsv1.Deployment) {
		d.Spec.Strategy.RollingUpdate = &appsv1.RollingUpdateDeployment{MaxUnavailable: ptr(intstr.FromString("100%"))} // the guard would refuse this
		d.Annotations = map[string]string{vocab.AnnotationCleanup: "record,drain"}
	})
	require.NoError(t, k8s.Create(ctx, d))
	assert.Empty(t, d.Finalizers)
	require.NoError(t, k8s.Delete(ctx, d))
}
