package reconciler

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/snapshot"
	"github.com/deployguard/deployguard/reconciler/vocab"
)

// readsConfig makes a ReplicaSet's template read ConfigMap names through
// envFrom.
func readsConfig(names ...string) func(*appsv1.ReplicaSet) {
	return func(rs *appsv1.ReplicaSet) {
		for _, n := range names {
			rs.Spec.Template.Spec.Containers[0].EnvFrom = append(rs.Spec.Template.Spec.Containers[0].EnvFrom,
				corev1.EnvFromSource{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: n}}})
		}
	}
}

func configMap(name string, data map[string]string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name}, Data: data}
}

var (
	goodData = map[string]string{"mode": "good"}
	goodHash = snapshot.ContentHash(goodData, nil)
	goodSnap = snapshot.Name("cfg", goodHash)
)

// The config of a revision that completes is kept, once, in a snapshot
// owned by its ReplicaSet, and recorded in its ledger entry; what cannot be
// kept is recorded and said.
func TestReconcileKnownGoodKeepsConfig(t *testing.T) {
	tests := []struct {
		name    string
		refs    []string
		objects func(rs2 *appsv1.ReplicaSet) []client.Object
		limits  *snapshot.Limits
		want    []rollout.ConfigSnapshot
		// owners are the ReplicaSets that own the snapshot afterwards.
		owners []string
		events []string
	}{
		{
			name:    "a snapshot created, owned by the ReplicaSet; a missing ConfigMap recorded absent",
			refs:    []string{"cfg", "missing"},
			objects: func(*appsv1.ReplicaSet) []client.Object { return []client.Object{configMap("cfg", goodData)} },
			want: []rollout.ConfigSnapshot{{Kind: "ConfigMap", Name: "cfg", Snapshot: goodSnap, Hash: goodHash},
				{Kind: "ConfigMap", Name: "missing", Absent: true}},
			owners: []string{"web-h3"},
			events: []string{vocab.ReasonKnownGood},
		},
		{
			name: "the same data as an earlier revision: its snapshot gets another owner",
			refs: []string{"cfg"},
			objects: func(rs2 *appsv1.ReplicaSet) []client.Object {
				return []client.Object{configMap("cfg", goodData), snapshot.ConfigMapSnapshot(configMap("cfg", goodData), rs2)}
			},
			want:   []rollout.ConfigSnapshot{{Kind: "ConfigMap", Name: "cfg", Snapshot: goodSnap, Hash: goodHash}},
			owners: []string{"web-h2", "web-h3"},
			events: []string{vocab.ReasonKnownGood},
		},
		{
			name: "a revision restored with its config reads a snapshot: not copied again, owned once more",
			refs: []string{goodSnap},
			objects: func(rs2 *appsv1.ReplicaSet) []client.Object {
				return []client.Object{snapshot.ConfigMapSnapshot(configMap("cfg", goodData), rs2)}
			},
			want:   []rollout.ConfigSnapshot{{Kind: "ConfigMap", Name: goodSnap, Snapshot: goodSnap, Hash: goodHash}},
			owners: []string{"web-h2", "web-h3"},
			events: []string{vocab.ReasonKnownGood},
		},
		{
			name: "a tenant's ConfigMap has the snapshot's name: not taken for the guard's, said",
			refs: []string{"cfg"},
			objects: func(*appsv1.ReplicaSet) []client.Object {
				squat := configMap(goodSnap, map[string]string{"mode": "evil"})
				squat.Labels = map[string]string{vocab.LabelSnapshot: "true"}
				squat.Annotations = map[string]string{vocab.AnnotationSnapshotOf: "cfg"}
				squat.Immutable = ptr.To(true)
				return []client.Object{configMap("cfg", goodData), squat}
			},
			want:   []rollout.ConfigSnapshot{{Kind: "ConfigMap", Name: "cfg", Hash: goodHash, Skipped: "ConfigMap " + goodSnap + " exists and is not the guard's snapshot of cfg"}},
			events: []string{vocab.ReasonKnownGood, vocab.ReasonConfigNotKept},
		},
		{
			name: "too many: nothing kept, nothing recorded, said",
			refs: []string{"a", "b"},
			objects: func(*appsv1.ReplicaSet) []client.Object {
				return []client.Object{configMap("a", goodData), configMap("b", goodData)}
			},
			limits: &snapshot.Limits{MaxObjects: 1},
			events: []string{vocab.ReasonKnownGood, vocab.ReasonConfigNotKept},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := deployment(completed)
			rs1 := replicaSet(d, 1, "web:v1")
			rs2 := replicaSet(d, 2, "web:v2")
			rs3 := replicaSet(d, 3, "web:v3", readsConfig(tt.refs...))
			d.Spec.Template = *RollbackTemplate(rs3)
			withKnownGood(d, rs1, rs2)
			objs := append([]client.Object{namespace(nil), d, rs1, rs2, rs3}, tt.objects(rs2)...)
			e := newEnv(t, objs...)
			if tt.limits != nil {
				e.r.Options.Snapshots.Limits = *tt.limits
			}

			require.NoError(t, e.reconcile())

			l := ledgerOf(t, e.deployment())
			require.Equal(t, "web-h3", l.Newest().ReplicaSet)
			assert.Equal(t, tt.want, l.Newest().Config)
			assert.Equal(t, tt.events, eventReasons(e.events()))
			if tt.owners != nil {
				snap := &corev1.ConfigMap{}
				require.NoError(t, e.client.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: goodSnap}, snap))
				var owners []string
				for _, o := range snap.OwnerReferences {
					assert.Nil(t, o.Controller, "never the controller")
					owners = append(owners, o.Name)
				}
				assert.Equal(t, tt.owners, owners)
				assert.Equal(t, goodData, snap.Data)
			}

			writes := e.writeCount()
			require.NoError(t, e.reconcile())
			assert.Equal(t, writes, e.writeCount(), "recorded: nothing written again")
		})
	}
}

// failedWithConfig is a Deployment whose revision 3 failed its deadline;
// revisions 1 and 2 are known-good, and revision 2 (reading ConfigMap cfg)
// ran with goodData, kept as goodSnap.
func failedWithConfig() (d *appsv1.Deployment, rs1, rs2, rs3 *appsv1.ReplicaSet) {
	d = deployment(failed)
	rs1 = replicaSet(d, 1, "web:v1")
	rs2 = replicaSet(d, 2, "web:v2", readsConfig("cfg"))
	rs3 = replicaSet(d, 3, "web:v3", readsConfig("cfg"))
	d.Spec.Template = *RollbackTemplate(rs3)
	withKnownGood(d, rs1, rs2)
	withLedger(func(l *rollout.Ledger) {
		*l = l.WithConfig(rs2.UID, []rollout.ConfigSnapshot{{Kind: "ConfigMap", Name: "cfg", Snapshot: goodSnap, Hash: goodHash}})
	})(d)
	return d, rs1, rs2, rs3
}

// A rollback points the restored template at the snapshot only where the
// config drifted, and only to a snapshot that still holds the recorded
// data; the template written is the one the ledger and the verdict name.
func TestReconcileRollbackRestoresConfig(t *testing.T) {
	tampered := snapshot.ConfigMapSnapshot(configMap("cfg", map[string]string{"mode": "evil"}), &appsv1.ReplicaSet{})
	tampered.Name = goodSnap
	tests := []struct {
		name string
		// cfg is the ConfigMap now (nil: deleted); snap the snapshot (nil: gone).
		cfg, snap *corev1.ConfigMap
		rewrite   bool
		says      string
	}{
		{name: "nothing drifted: the known-good template exactly", cfg: configMap("cfg", goodData), snap: snapshot.ConfigMapSnapshot(configMap("cfg", goodData), &appsv1.ReplicaSet{})},
		{name: "changed: pointed at the snapshot", cfg: configMap("cfg", map[string]string{"mode": "bad"}), snap: snapshot.ConfigMapSnapshot(configMap("cfg", goodData), &appsv1.ReplicaSet{}),
			rewrite: true, says: " Config restored: ConfigMap cfg from snapshot " + goodSnap + " (changed since)."},
		{name: "pruned: pointed at the snapshot", snap: snapshot.ConfigMapSnapshot(configMap("cfg", goodData), &appsv1.ReplicaSet{}),
			rewrite: true, says: " Config restored: ConfigMap cfg from snapshot " + goodSnap + " (deleted since)."},
		{name: "a snapshot a tenant replaced is not used", cfg: configMap("cfg", map[string]string{"mode": "bad"}), snap: tampered,
			says: " Config not restored: ConfigMap cfg (changed since and its snapshot " + goodSnap + " is gone or no longer holds the recorded data)."},
		{name: "a snapshot gone", cfg: configMap("cfg", map[string]string{"mode": "bad"}),
			says: " Config not restored: ConfigMap cfg (changed since and its snapshot " + goodSnap + " is gone or no longer holds the recorded data)."},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, rs1, rs2, rs3 := failedWithConfig()
			objs := []client.Object{namespace(nil), d, rs1, rs2, rs3}
			for _, o := range []*corev1.ConfigMap{tt.cfg, tt.snap} {
				if o != nil {
					objs = append(objs, o)
				}
			}
			e := newEnv(t, objs...)

			require.NoError(t, e.reconcile())

			got := e.deployment()
			want := RollbackTemplate(rs2)
			if tt.rewrite {
				want = snapshot.Rewrite(want, []snapshot.Restore{{Kind: "ConfigMap", Name: "cfg", Snapshot: goodSnap}})
			}
			assert.Equal(t, *want, got.Spec.Template)
			l := ledgerOf(t, got)
			assert.Equal(t, int64(3), l.RolledBackRevision)
			assert.Equal(t, vocab.TemplateHash(want), l.RolledBackToTemplate, "the template written, which the verdict compares")
			msg := got.Annotations[vocab.AnnotationRollbackStatus]
			assert.Contains(t, msg, "to known-good revision 2 (ReplicaSet web-h2).")
			if tt.says == "" {
				assert.NotContains(t, msg, "Config")
			} else {
				assert.Contains(t, msg, tt.says)
			}
			for _, w := range e.writes {
				assert.NotContains(t, w, "ConfigMap", "the tenant's ConfigMaps and the snapshots are never written by a rollback")
			}
		})
	}
}

// The revision an earlier rollback restored with its config fails too: the
// guard would write the very template that fails, so it stops.
func TestReconcileStopsWhenTheRestoredConfigFailsToo(t *testing.T) {
	d := deployment()
	rs1 := replicaSet(d, 1, "web:v1")
	rs2 := replicaSet(d, 2, "web:v2", readsConfig("cfg"))
	withKnownGood(d, rs1, rs2)
	withLedger(func(l *rollout.Ledger) {
		*l = l.WithConfig(rs2.UID, []rollout.ConfigSnapshot{{Kind: "ConfigMap", Name: "cfg", Snapshot: goodSnap, Hash: goodHash}})
		l.RolledBackRevision = 3
	})(d)
	restored := snapshot.Rewrite(RollbackTemplate(rs2), []snapshot.Restore{{Kind: "ConfigMap", Name: "cfg", Snapshot: goodSnap}})
	rs4 := replicaSet(d, 4, "web:v2", func(rs *appsv1.ReplicaSet) {
		hash := rs.Spec.Template.Labels[appsv1.DefaultDeploymentUniqueLabelKey]
		rs.Spec.Template = *restored.DeepCopy()
		rs.Spec.Template.Labels[appsv1.DefaultDeploymentUniqueLabelKey] = hash
	})
	d.Spec.Template = *restored
	d.Annotations[vocab.RevisionAnnotation] = "4"
	failedAt("web-h4", t0.Add(30*time.Minute))(d)
	e := newEnv(t, namespace(nil), d, rs1, rs2, rs4, configMap("cfg", map[string]string{"mode": "bad"}),
		snapshot.ConfigMapSnapshot(configMap("cfg", goodData), rs2))

	require.NoError(t, e.reconcile())

	got := e.deployment()
	assert.Equal(t, *restored, got.Spec.Template, "left as it is")
	assert.NotContains(t, got.Annotations[vocab.AnnotationQuarantinedTemplates], vocab.TemplateHash(restored), "the running template is not quarantined")
	assert.Equal(t, []string{vocab.ReasonRollbackLoop}, eventReasons(e.events()))
	assert.Contains(t, got.Annotations[vocab.AnnotationRollbackStatus], "as the guard restored it, with its config; stopped to avoid a rollback loop")
}

// forbidConfig is an APIReader whose ConfigMap reads are refused, as for a
// guard whose rights were narrowed after it kept a revision's config.
type forbidConfig struct{ client.Reader }

func (f forbidConfig) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if _, ok := obj.(*corev1.ConfigMap); ok {
		return apierrors.NewForbidden(corev1.Resource("configmaps"), key.Name, errors.New("RBAC"))
	}
	return f.Reader.Get(ctx, key, obj, opts...)
}

// Config the guard may no longer read never holds a rollback back: the
// known-good template is restored as it was, and the rollback says so.
func TestRollbackDoesNotWaitOnConfigItMayNotRead(t *testing.T) {
	d, rs1, rs2, rs3 := failedWithConfig()
	e := newEnv(t, namespace(nil), d, rs1, rs2, rs3, configMap("cfg", map[string]string{"mode": "bad"}),
		snapshot.ConfigMapSnapshot(configMap("cfg", goodData), &appsv1.ReplicaSet{}))
	e.r.APIReader = forbidConfig{e.client}

	require.NoError(t, e.reconcile())

	got := e.deployment()
	assert.Equal(t, *RollbackTemplate(rs2), got.Spec.Template)
	assert.Equal(t, int64(3), ledgerOf(t, got).RolledBackRevision)
	assert.Contains(t, got.Annotations[vocab.AnnotationRollbackStatus], " Config not restored: ConfigMap cfg (the guard may not read it).")
}
