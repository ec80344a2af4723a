package reconciler

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
)

func TestFindNewReplicaSet(t *testing.T) {
	d := deployment()
	rs1, rs2, rs3 := history(d)
	// A second ReplicaSet with the Deployment's template, created later
	// (kubernetes#40415): the oldest one is the newRS.
	rs3dup := replicaSet(d, 4, "web:v3", func(rs *appsv1.ReplicaSet) { rs.Name, rs.UID = "web-dup", types.UID("uid-dup") })

	tests := []struct {
		name string
		rss  []*appsv1.ReplicaSet
		want *appsv1.ReplicaSet
	}{
		{name: "no ReplicaSets", rss: nil, want: nil},
		{name: "only old ReplicaSets", rss: []*appsv1.ReplicaSet{rs1, rs2}, want: nil},
		{name: "template equal but for the hash label", rss: []*appsv1.ReplicaSet{rs1, rs3, rs2}, want: rs3},
		{name: "two with the template: the oldest", rss: []*appsv1.ReplicaSet{rs3dup, rs1, rs3}, want: rs3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := append([]*appsv1.ReplicaSet(nil), tt.rss...)
			got := rollout.FindNewReplicaSet(d, tt.rss)
			assert.Equal(t, tt.want, got)
			assert.Equal(t, before, tt.rss, "the caller's slice is not reordered")
		})
	}
}

// A Deployment and a ReplicaSet have the same template when they are equal
// but for the pod-template-hash label, whether read from the API server or
// from the cache, which holds a hash in the template's place.
func TestSameTemplate(t *testing.T) {
	d := deployment()
	rs := replicaSet(d, 3, "web:v3")
	other := replicaSet(d, 2, "web:v2")
	require.NotEmpty(t, rs.Spec.Template.Labels[appsv1.DefaultDeploymentUniqueLabelKey])
	cached := func(o client.Object) client.Object {
		c := o.DeepCopyObject().(client.Object)
		_, err := StripForCache(c)
		require.NoError(t, err)
		return c
	}
	for name, pair := range map[string]struct {
		d       *appsv1.Deployment
		rs, rs2 *appsv1.ReplicaSet
	}{
		"both whole":                  {d, rs, other},
		"both cached":                 {cached(d).(*appsv1.Deployment), cached(rs).(*appsv1.ReplicaSet), cached(other).(*appsv1.ReplicaSet)},
		"cached Deployment, whole RS": {cached(d).(*appsv1.Deployment), rs, other},
		"whole Deployment, cached RS": {d, cached(rs).(*appsv1.ReplicaSet), cached(other).(*appsv1.ReplicaSet)},
	} {
		t.Run(name, func(t *testing.T) {
			assert.True(t, rollout.SameTemplate(pair.d, pair.rs), "same template, hash label aside")
			assert.False(t, rollout.SameTemplate(pair.d, pair.rs2), "different image")
		})
	}
	assert.Equal(t, "h3", rs.Spec.Template.Labels[appsv1.DefaultDeploymentUniqueLabelKey], "the inputs are not modified")
	c := cached(d).(*appsv1.Deployment)
	assert.Empty(t, c.Spec.Template.Spec.Containers, "the cache keeps no pod spec")
	assert.Equal(t, d.Spec.Template.Labels, c.Spec.Template.Labels, "but the template's labels")
}

func TestRevision(t *testing.T) {
	tests := []struct {
		name    string
		value   *string
		want    int64
		wantErr bool
	}{
		{name: "absent is 0", value: nil, want: 0},
		{name: "number", value: ptr.To("12"), want: 12},
		{name: "garbage", value: ptr.To("x"), wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rs := replicaSet(deployment(), 1, "web:v1")
			delete(rs.Annotations, vocab.RevisionAnnotation)
			if tt.value != nil {
				rs.Annotations[vocab.RevisionAnnotation] = *tt.value
			}
			got, err := rollout.Revision(rs)
			if tt.wantErr {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}
