package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler"
	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/test/harness"
)

// A guard of this release taking over from an earlier one, which kept its
// known-good marks in annotations: the Deployments that existed before it
// first ran keep their history. Here the earlier release's state is written
// as it wrote it, on a Deployment the guard has not seen (its namespace was
// opted out), and the guard's first run is moved to now; the failed rollout
// is then rolled back to the revision the earlier release recorded.
func TestTakeoverFromAnEarlierReleaseKeepsItsHistory(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t, map[string]string{vocab.LabelGuard: vocab.LabelGuardDisabled})
	require.NoError(t, local.Client.Create(ctx, deployment(ns, "old", "app:1")))
	waitAvailable(t, ns, "old", time.Minute)

	// Revision 1 completed: the earlier release marked its ReplicaSet, and
	// the Deployment.
	var rss appsv1.ReplicaSetList
	require.NoError(t, local.Client.List(ctx, &rss, client.InNamespace(ns)))
	require.Len(t, rss.Items, 1)
	rs1 := rss.Items[0]
	require.NoError(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		rs := &appsv1.ReplicaSet{}
		if err := local.Client.Get(ctx, client.ObjectKeyFromObject(&rs1), rs); err != nil {
			return err
		}
		metav1.SetMetaDataAnnotation(&rs.ObjectMeta, vocab.LegacyAnnotationKnownGood, time.Now().UTC().Format(time.RFC3339))
		metav1.SetMetaDataAnnotation(&rs.ObjectMeta, vocab.LegacyAnnotationKnownGoodHash, rs.Labels[appsv1.DefaultDeploymentUniqueLabelKey])
		return local.Client.Update(ctx, rs)
	}))
	require.NoError(t, update(t, ns, "old", func(d *appsv1.Deployment) {
		metav1.SetMetaDataAnnotation(&d.ObjectMeta, vocab.LegacyAnnotationKnownGoodRevision, "1")
	}))
	// Revision 2 fails its deadline while no guard looks.
	require.NoError(t, update(t, ns, "old", breakImage("app:2")))
	waitDeadlineExceeded(t, ns, "old")

	// This release runs for the first time now.
	since := &corev1.ConfigMap{}
	key := client.ObjectKey{Namespace: harness.GuardNamespace, Name: reconciler.LedgerSinceConfigMap}
	require.NoError(t, local.Client.Get(ctx, key, since))
	was := since.Data["since"]
	setSince := func(v string) {
		require.NoError(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cm := &corev1.ConfigMap{}
			if err := local.Client.Get(ctx, key, cm); err != nil {
				return err
			}
			cm.Data["since"] = v
			return local.Client.Update(ctx, cm)
		}))
	}
	setSince(time.Now().UTC().Add(time.Second).Format(time.RFC3339))
	t.Cleanup(func() {
		setSince(was)
		require.NoError(t, local.RestartGuard(context.Background()))
	})
	// Restarted first, so that it reads the new time before it sees the
	// namespace.
	require.NoError(t, local.RestartGuard(ctx))
	nsObj := &corev1.Namespace{}
	require.NoError(t, local.Client.Get(ctx, client.ObjectKey{Name: ns}, nsObj))
	delete(nsObj.Labels, vocab.LabelGuard)
	require.NoError(t, local.Client.Update(ctx, nsObj))

	d := waitLedger(t, ns, "old", "the earlier release's known-good revision was not rolled back to", time.Duration(deadline+60)*time.Second,
		func(l rollout.Ledger, d *appsv1.Deployment) bool { return l.RolledBackRevision == 2 })
	assert.Equal(t, "app:1", d.Spec.Template.Spec.Containers[0].Image)
	l := ledgerOf(d)
	require.NotEmpty(t, l.KnownGood)
	assert.Equal(t, rs1.UID, l.KnownGood[0].UID, "the earlier release's mark, adopted")
}
