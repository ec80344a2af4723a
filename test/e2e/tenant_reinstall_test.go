package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler"
	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/test/harness"
)

// A guard installed again after `deployguard uninstall` (which removed every
// ledger and the ConfigMap of when the ledger began) finds Deployments older
// than its first start, without a ledger, carrying an earlier release's
// annotations, written here by a tenant while no guard looked. Nothing was
// asked to be adopted: the forged known-good revision is not believed, and
// the failed rollout is not rolled back to it. Restarts the guard twice.
func TestReinstalledGuardAdoptsNoTenantsAnnotations(t *testing.T) {
	ctx := context.Background()
	tn := newTenant(t)
	tn.waitEdit(t)
	// No guard looks at the namespace while the tenant writes.
	setOptOut := func(on bool) {
		require.NoError(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
			ns := &corev1.Namespace{}
			if err := local.Client.Get(ctx, client.ObjectKey{Name: tn.ns}, ns); err != nil {
				return err
			}
			if on {
				metav1.SetMetaDataLabel(&ns.ObjectMeta, vocab.LabelGuard, vocab.LabelGuardDisabled)
			} else {
				delete(ns.Labels, vocab.LabelGuard)
			}
			return local.Client.Update(ctx, ns)
		}))
	}
	setOptOut(true)
	require.NoError(t, tn.c.Create(ctx, harness.Deployment(tn.ns, "old", "app:1", shortDeadline)))
	waitAvailable(t, tn.ns, "old", time.Minute)

	// The tenant forges an earlier release's mark on revision 1, as that
	// release wrote it, then breaks revision 2.
	var rss appsv1.ReplicaSetList
	require.NoError(t, tn.c.List(ctx, &rss, client.InNamespace(tn.ns)))
	require.Len(t, rss.Items, 1)
	rs1 := rss.Items[0]
	require.NoError(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		rs := &appsv1.ReplicaSet{}
		if err := tn.c.Get(ctx, client.ObjectKeyFromObject(&rs1), rs); err != nil {
			return err
		}
		metav1.SetMetaDataAnnotation(&rs.ObjectMeta, vocab.LegacyAnnotationKnownGood, time.Now().UTC().Format(time.RFC3339))
		metav1.SetMetaDataAnnotation(&rs.ObjectMeta, vocab.LegacyAnnotationKnownGoodHash, rs.Labels[appsv1.DefaultDeploymentUniqueLabelKey])
		return tn.c.Update(ctx, rs)
	}))
	tn.update(t, "old", func(d *appsv1.Deployment) {
		metav1.SetMetaDataAnnotation(&d.ObjectMeta, vocab.LegacyAnnotationKnownGoodRevision, "1")
		breakImage("app:2")(d)
	})
	waitDeadlineExceeded(t, tn.ns, "old")

	// Uninstalled and installed again: the ConfigMap of when the ledger
	// began goes with the uninstall, and the guard's next start records a
	// new one, later than the Deployment.
	key := client.ObjectKey{Namespace: harness.GuardNamespace, Name: reconciler.LedgerSinceConfigMap}
	was := &corev1.ConfigMap{}
	require.NoError(t, local.Client.Get(ctx, key, was))
	require.NoError(t, local.Client.Delete(ctx, was))
	t.Cleanup(func() {
		// Back to the tier's first start, for the tests after this one.
		cm := &corev1.ConfigMap{}
		if err := local.Client.Get(context.Background(), key, cm); err == nil {
			cm.Data = was.Data
			assert.NoError(t, local.Client.Update(context.Background(), cm))
		} else if apierrors.IsNotFound(err) {
			assert.NoError(t, local.Client.Create(context.Background(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}, Data: was.Data}))
		}
		assert.NoError(t, local.RestartGuard(context.Background()))
	})
	require.NoError(t, local.RestartGuard(ctx))
	since := &corev1.ConfigMap{}
	require.NoError(t, local.Client.Get(ctx, key, since), "the guard's start records when its ledger began")
	assert.NotContains(t, since.Data, reconciler.LedgerAdoptKey, "nobody asked for a takeover")
	setOptOut(false)

	// The guard looks, and holds: no known-good revision it can believe.
	note := guardEventWithin(t, tn.ns, "old", vocab.ReasonNoKnownGoodRevision, time.Duration(deadline+60)*time.Second)
	assert.NotEmpty(t, note)
	d := get(ctx, t, tn.ns, "old")
	assert.Equal(t, "app:2", d.Spec.Template.Spec.Containers[0].Image, "not rolled back to the forged revision")
	l, _ := rollout.ReadLedger(d)
	assert.Empty(t, l.KnownGood, "the forged mark was not adopted")
	assert.Zero(t, l.RolledBackRevision)
}
