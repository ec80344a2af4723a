package rollout

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/deployguard/deployguard/reconciler/vocab"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// deployment is Deployment shop/web; replicaSet one of its ReplicaSets, of
// a revision and an image, with the pod-template-hash label the Deployment
// controller gives it.
func deployment() *appsv1.Deployment {
	return &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web", UID: "uid-web"}}
}

func replicaSet(d *appsv1.Deployment, revision int64, image string) *appsv1.ReplicaSet {
	hash := fmt.Sprintf("h%d", revision)
	return &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: d.Namespace, Name: d.Name + "-" + hash, UID: types.UID("uid-rs-" + hash),
			Annotations: map[string]string{vocab.RevisionAnnotation: fmt.Sprint(revision)}},
		Spec: appsv1.ReplicaSetSpec{Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "web", appsv1.DefaultDeploymentUniqueLabelKey: hash}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: image}}},
		}},
	}
}

// The ledger survives its JSON form; one that does not parse reads as present
// and empty, so that nothing older is adopted in its place.
func TestReadLedger(t *testing.T) {
	d := deployment()
	_, ok := ReadLedger(d)
	assert.False(t, ok, "a Deployment the guard never wrote has no ledger")

	rs2 := replicaSet(d, 2, "web:v2")
	want := Ledger{}.WithKnownGood(rs2, 2, t0)
	want.RolledBackRevision, want.RolledBackTo, want.FailFastRevision = 3, "web-h2", 3
	want.HandledDeadline, want.FailingSince = t0.Format(time.RFC3339), FailingSinceValue(t0, "web-h3")
	require.True(t, SetLedger(&d.Status, want, t0))
	assert.False(t, SetLedger(&d.Status, want, t0.Add(time.Minute)), "the same ledger again changes nothing")
	got, ok := ReadLedger(d)
	require.True(t, ok)
	assert.Equal(t, want, got)

	for i := range d.Status.Conditions {
		d.Status.Conditions[i].Message = "{not json"
	}
	got, ok = ReadLedger(d)
	assert.True(t, ok, "unreadable, but there")
	assert.Equal(t, Ledger{}, got)
}

// WithKnownGood keeps one entry per ReplicaSet, the newest last, and no more
// than upstream's default revision history.
func TestWithKnownGood(t *testing.T) {
	d := deployment()
	var rss []*appsv1.ReplicaSet
	l := Ledger{}
	for rev := int64(1); rev <= maxKnownGood+2; rev++ {
		rs := replicaSet(d, rev, fmt.Sprintf("web:v%d", rev))
		rss = append(rss, rs)
		l = l.WithKnownGood(rs, rev, t0)
	}
	require.Len(t, l.KnownGood, maxKnownGood, "bounded")
	assert.Equal(t, "web-h3", l.KnownGood[0].ReplicaSet, "the oldest dropped")
	assert.Equal(t, "web-h12", l.Newest().ReplicaSet)
	assert.False(t, l.IsKnownGood(rss[0]))

	// Revision 5 comes back (kubectl rollout undo) and completes again.
	again := l.WithKnownGood(rss[4], 13, t0.Add(time.Hour))
	assert.Len(t, again.KnownGood, maxKnownGood)
	assert.Equal(t, KnownGoodEntry{ReplicaSet: "web-h5", UID: rss[4].UID, Template: vocab.TemplateHash(&rss[4].Spec.Template),
		Revision: 13, At: t0.Add(time.Hour).Format(time.RFC3339)}, *again.Newest())
	n := 0
	for _, e := range again.KnownGood {
		if e.ReplicaSet == "web-h5" {
			n++
		}
	}
	assert.Equal(t, 1, n, "one entry per ReplicaSet")
	assert.Equal(t, "web-h12", l.Newest().ReplicaSet, "the ledger it was made from is unchanged")
}

// A known-good entry records the config its revision ran with; only the two
// newest keep it (a rollback restores one of them), so the ledger every
// cached Deployment carries does not grow with its history.
func TestLedgerConfig(t *testing.T) {
	d := deployment()
	cfg := func(rev int64) []ConfigSnapshot {
		return []ConfigSnapshot{{Kind: "ConfigMap", Name: "cfg", Snapshot: fmt.Sprintf("cfg-dg-%d", rev), Hash: fmt.Sprint(rev)}}
	}
	var l Ledger
	for rev := int64(1); rev <= 3; rev++ {
		rs := replicaSet(d, rev, fmt.Sprintf("web:%d", rev))
		l = l.WithKnownGood(rs, rev, t0).WithConfig(rs.UID, cfg(rev))
	}
	require.Len(t, l.KnownGood, 3)
	assert.Nil(t, l.KnownGood[0].Config, "the oldest entry forgets its config")
	assert.Equal(t, cfg(2), l.KnownGood[1].Config)
	assert.Equal(t, cfg(3), l.KnownGood[2].Config)

	SetLedger(&d.Status, l, t0)
	read, ok := ReadLedger(d)
	require.True(t, ok)
	assert.Equal(t, l, read, "survives its JSON form")

	other := l.WithConfig("no-such-uid", cfg(9))
	assert.Equal(t, l, other, "no entry of that UID: nothing changes")
}

// A Deployment whose ledger has no checks' run reads as none: every
// CheckRun method takes nil (a guard with checks on reads it for every
// Deployment, selected by a check or not).
func TestCheckRunMethodsTakeNil(t *testing.T) {
	var c *CheckRun
	assert.False(t, c.Of("web-1", 1))
	assert.Nil(t, c.Metric("x"))
	assert.Nil(t, c.Clone())
	for _, f := range []func() (time.Time, bool){c.FailedTime, c.BakeUntilTime, c.FirstFailedTime} {
		_, ok := f()
		assert.False(t, ok)
	}
}
