package reconciler

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

// Pods a ReplicaSet cannot create (a quota) are said only by its
// ReplicaFailure condition, which the cache does not keep: the scale-up
// check reads it from the API server, for the ReplicaSet it knows, and finds
// none on one gone or replaced.
func TestReplicaFailureIsReadFromTheAPIServer(t *testing.T) {
	ctx := context.Background()
	scheme := runtime.NewScheme()
	require.NoError(t, clientgoscheme.AddToScheme(scheme))
	served := &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web-5d8f7c9b4", UID: "rs-1"},
		Status: appsv1.ReplicaSetStatus{Conditions: []appsv1.ReplicaSetCondition{{
			Type: appsv1.ReplicaSetReplicaFailure, Status: corev1.ConditionTrue, Reason: "FailedCreate",
			Message: `pods "web-5d8f7c9b4-x" is forbidden: exceeded quota: pods, requested: pods=1, used: pods=2, limited: pods=2`,
		}}},
	}
	stripped, err := StripForCache(served.DeepCopy())
	require.NoError(t, err)
	cached := stripped.(*appsv1.ReplicaSet)
	require.Empty(t, cached.Status.Conditions, "the cache keeps no condition of a ReplicaSet")

	r := &DeploymentReconciler{APIReader: fake.NewClientBuilder().WithScheme(scheme).WithObjects(served).Build()}
	c, err := r.replicaFailure(ctx, cached)
	require.NoError(t, err)
	if assert.NotNil(t, c) {
		assert.Equal(t, "FailedCreate", c.Reason)
		assert.Contains(t, c.Message, "exceeded quota")
	}

	replaced := cached.DeepCopy()
	replaced.UID = "rs-0"
	c, err = r.replicaFailure(ctx, replaced)
	require.NoError(t, err)
	assert.Nil(t, c, "another ReplicaSet of the same name")

	gone := cached.DeepCopy()
	gone.Name = "web-gone"
	c, err = r.replicaFailure(ctx, gone)
	require.NoError(t, err)
	assert.Nil(t, c, "a ReplicaSet deleted since")
}
