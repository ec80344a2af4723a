package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/snapshot"
	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/test/harness"
)

// configOf returns the config the ledger recorded for the known-good
// revision of d, waiting for that revision to be recorded.
func configOf(t *testing.T, ns, name string, revision int64) []rollout.ConfigSnapshot {
	t.Helper()
	var out []rollout.ConfigSnapshot
	harness.WaitFor(t, time.Minute, fmt.Sprintf("revision %d of %s was not recorded known-good", revision, name), func(ctx context.Context) (bool, string, error) {
		d := get(ctx, t, ns, name)
		l, _ := rollout.ReadLedger(d)
		for _, e := range l.KnownGood {
			if e.Revision == revision {
				out = e.Config
				return true, "", nil
			}
		}
		return false, describe(d), nil
	})
	return out
}

// replicaSetOfRevision returns the ReplicaSet of d's revision.
func replicaSetOfRevision(ctx context.Context, t *testing.T, ns, name string, revision int64) *appsv1.ReplicaSet {
	t.Helper()
	var list appsv1.ReplicaSetList
	require.NoError(t, local.Client.List(ctx, &list, client.InNamespace(ns)))
	for i := range list.Items {
		rs := &list.Items[i]
		if v, _ := rollout.Revision(rs); v == revision && metav1.GetControllerOf(rs) != nil && metav1.GetControllerOf(rs).Name == name {
			return rs
		}
	}
	require.Failf(t, "no ReplicaSet", "revision %d of %s", revision, name)
	return nil
}

func ownedBy(obj metav1.Object, rs *appsv1.ReplicaSet) bool {
	for _, o := range obj.GetOwnerReferences() {
		if o.UID == rs.UID && o.Kind == "ReplicaSet" {
			return true
		}
	}
	return false
}

// A Helm-style release whose upgrade changes its ConfigMap to a bad value,
// with a checksum of it in the template (Helm's documented pattern) and,
// here, an image that cannot be pulled, so the rollout fails: the guard
// rolls back, and the restored pods read the config revision 1 ran with,
// from the snapshot the guard kept when revision 1 completed. Rolling back
// the template alone, as `kubectl rollout undo` does, would have pointed
// the pods at the bad config.
func TestRollbackRestoresTheConfigTheRevisionRanWith(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, local.Client)
	cfg := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cfg", Namespace: ns}, Data: map[string]string{"mode": "good"}}
	require.NoError(t, local.Client.Create(ctx, cfg))
	goodHash := snapshot.ContentHash(cfg.Data, nil)

	d := slowDeployment(ns, "web", "app:1")
	d.Spec.Template.Annotations = map[string]string{"checksum/config": "good"}
	d.Spec.Template.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{
		LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}}}}
	d.Spec.Template.Spec.Volumes = []corev1.Volume{{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
		LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}}}}}
	rolledOutOnce(t, d)

	// Revision 1 is known-good: its ConfigMap is kept, immutable, owned by
	// its ReplicaSet.
	recs := configOf(t, ns, "web", 1)
	want := snapshot.Name("cfg", goodHash)
	require.Equal(t, []rollout.ConfigSnapshot{{Kind: snapshot.KindConfigMap, Name: "cfg", Snapshot: want, Hash: goodHash}}, recs)
	rs1 := replicaSetOfRevision(ctx, t, ns, "web", 1)
	snap := &corev1.ConfigMap{}
	require.NoError(t, local.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: want}, snap))
	assert.Equal(t, map[string]string{"mode": "good"}, snap.Data)
	assert.True(t, snap.Immutable != nil && *snap.Immutable, "immutable")
	assert.True(t, ownedBy(snap, rs1), "owned by revision 1's ReplicaSet: %v", snap.OwnerReferences)
	assert.Equal(t, "cfg", snap.Annotations[vocab.AnnotationSnapshotOf])

	// The upgrade: a bad config, its checksum in the template, and an image
	// that cannot be pulled.
	cfg.Data = map[string]string{"mode": "bad"}
	require.NoError(t, local.Client.Update(ctx, cfg))
	require.NoError(t, update(t, ns, "web", func(d *appsv1.Deployment) {
		d.Spec.Template.Annotations["checksum/config"] = "bad"
		d.Spec.Template.Spec.Containers[0].Image = "app:no-such-tag"
	}))
	harness.WaitFor(t, 90*time.Second, "not rolled back within 90s of the change", func(ctx context.Context) (bool, string, error) {
		d := get(ctx, t, ns, "web")
		return rolledBackRevision(d) == 2, describe(d), nil
	})
	restored := waitAvailable(t, ns, "web", time.Minute)

	// The restored template is revision 1's, pointing at the snapshot.
	spec := restored.Spec.Template.Spec
	assert.Equal(t, "app:1", spec.Containers[0].Image)
	assert.Equal(t, "good", restored.Spec.Template.Annotations["checksum/config"])
	require.Len(t, spec.Containers[0].EnvFrom, 1)
	assert.Equal(t, want, spec.Containers[0].EnvFrom[0].ConfigMapRef.Name, "envFrom reads the snapshot")
	assert.Equal(t, want, spec.Volumes[0].ConfigMap.Name, "the volume mounts the snapshot")
	assert.Equal(t, "config", spec.Volumes[0].Name)
	require.NoError(t, local.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "cfg"}, cfg))
	assert.Equal(t, "bad", cfg.Data["mode"], "the tenant's ConfigMap is left as it is")

	// Said in the Event and in the status message.
	msg := guardEvent(t, ns, "web", vocab.ReasonAutoRollback)
	assert.Contains(t, msg, "to known-good revision 1")
	assert.Contains(t, msg, "Config restored: ConfigMap cfg from snapshot "+want+" (changed since)")
	assert.Contains(t, restored.Annotations[vocab.AnnotationRollbackStatus], "ConfigMap cfg from snapshot "+want)

	// The restored revision (3, a template of its own) completes and is
	// recorded with the snapshot as its config, not a snapshot of it: the
	// snapshot now stays while either ReplicaSet does.
	recs = configOf(t, ns, "web", 3)
	assert.Equal(t, []rollout.ConfigSnapshot{{Kind: snapshot.KindConfigMap, Name: want, Snapshot: want, Hash: goodHash}}, recs)
	rs3 := replicaSetOfRevision(ctx, t, ns, "web", 3)
	harness.WaitFor(t, 30*time.Second, "the snapshot is not owned by revision 3's ReplicaSet too", func(ctx context.Context) (bool, string, error) {
		if err := local.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: want}, snap); err != nil {
			return false, "", err
		}
		return ownedBy(snap, rs1) && ownedBy(snap, rs3), fmt.Sprint(snap.OwnerReferences), nil
	})

	// deployguard status names the restored config and what each revision
	// ran with.
	out, err := guard(ctx, t, "status", ns+"/web")
	require.NoError(t, err, out)
	t.Logf("deployguard status:\n%s", out)
	assert.Contains(t, out, "Config restored: ConfigMap cfg from snapshot "+want)
	assert.Regexp(t, `1 \(`+rs1.Name+`\): ConfigMap cfg \(kept as `+want+`\)`, out)
	assert.Regexp(t, `3 \(`+rs3.Name+`\): ConfigMap `+want+` \(the guard's snapshot of cfg\)`, out)

	// GitOps applying the bad release again is refused: the quarantine holds.
	err = update(t, ns, "web", func(d *appsv1.Deployment) {
		d.Spec.Template.Annotations["checksum/config"] = "bad"
		d.Spec.Template.Spec.Containers[0].Image = "app:no-such-tag"
		d.Spec.Template.Spec.Containers[0].EnvFrom[0].ConfigMapRef.Name = "cfg"
		d.Spec.Template.Spec.Volumes[0].ConfigMap.Name = "cfg"
	})
	require.Error(t, err, "the failed template is quarantined")

	// Garbage collected with the ReplicaSets.
	require.NoError(t, local.Client.Delete(ctx, restored, client.PropagationPolicy(metav1.DeletePropagationBackground)))
	harness.WaitFor(t, time.Minute, "the snapshot outlived its ReplicaSets", func(ctx context.Context) (bool, string, error) {
		err := local.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: want}, &corev1.ConfigMap{})
		return apierrors.IsNotFound(err), fmt.Sprint(err), client.IgnoreNotFound(err)
	})
}

// Kustomize's configMapGenerator: the config's content hash is in its name,
// and Flux prunes the old one before the rollout of the new one finishes.
// The rollback points the restored template at the snapshot of the pruned
// ConfigMap, so its pods can start. A config that did not change (shared)
// is left as the template names it.
func TestRollbackRestoresAPrunedConfigMap(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, local.Client)
	v1 := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "settings-v1", Namespace: ns}, Data: map[string]string{"mode": "good"}}
	shared := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "shared", Namespace: ns}, Data: map[string]string{"region": "eu"}}
	require.NoError(t, local.Client.Create(ctx, v1))
	require.NoError(t, local.Client.Create(ctx, shared))
	ref := func(name string) corev1.EnvFromSource {
		return corev1.EnvFromSource{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: name}}}
	}
	d := slowDeployment(ns, "web", "app:1")
	d.Spec.Template.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{ref("settings-v1"), ref("shared")}
	rolledOutOnce(t, d)
	recs := configOf(t, ns, "web", 1)
	require.Len(t, recs, 2)
	kept := snapshot.Name("settings-v1", snapshot.ContentHash(v1.Data, nil))
	assert.Equal(t, kept, recs[0].Snapshot)

	v2 := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "settings-v2", Namespace: ns}, Data: map[string]string{"mode": "bad"}}
	require.NoError(t, local.Client.Create(ctx, v2))
	require.NoError(t, update(t, ns, "web", func(d *appsv1.Deployment) {
		d.Spec.Template.Spec.Containers[0].EnvFrom[0].ConfigMapRef.Name = "settings-v2"
		d.Spec.Template.Spec.Containers[0].Image = "app:no-such-tag"
	}))
	require.NoError(t, local.Client.Delete(ctx, v1), "pruned")
	harness.WaitFor(t, 90*time.Second, "not rolled back within 90s of the change", func(ctx context.Context) (bool, string, error) {
		d := get(ctx, t, ns, "web")
		return rolledBackRevision(d) == 2, describe(d), nil
	})
	restored := waitAvailable(t, ns, "web", time.Minute)
	envFrom := restored.Spec.Template.Spec.Containers[0].EnvFrom
	require.Len(t, envFrom, 2)
	assert.Equal(t, kept, envFrom[0].ConfigMapRef.Name, "the pruned ConfigMap's snapshot")
	assert.Equal(t, "shared", envFrom[1].ConfigMapRef.Name, "unchanged config is left as it is")
	msg := guardEvent(t, ns, "web", vocab.ReasonAutoRollback)
	assert.Contains(t, msg, "Config restored: ConfigMap settings-v1 from snapshot "+kept+" (deleted since).")
}
