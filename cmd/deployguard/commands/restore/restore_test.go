package restore

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/deployguard/deployguard/cmd/deployguard/commands/internal/fixtures"
	"github.com/deployguard/deployguard/reconciler"
	"github.com/deployguard/deployguard/reconciler/vocab"
)

func fakeClient(t *testing.T, objs ...client.Object) client.WithWatch {
	t.Helper()
	scheme := runtime.NewScheme()
	require.NoError(t, clientgoscheme.AddToScheme(scheme))
	return fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).Build()
}

func record(t *testing.T, d *appsv1.Deployment) *corev1.ConfigMap {
	t.Helper()
	cm, err := reconciler.BuildRecord(d, nil, time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC))
	require.NoError(t, err)
	return cm
}

func TestRestoreDeployment(t *testing.T) {
	deleted := fixtures.Drained("web", "web:v4")
	c := fakeClient(t, record(t, deleted))
	var out bytes.Buffer

	require.NoError(t, restoreDeployment(context.Background(), c, "shop", "web", false, &out))

	got := &appsv1.Deployment{}
	require.NoError(t, c.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "web"}, got))
	assert.Equal(t, deleted.Spec.Template, got.Spec.Template)
	assert.Equal(t, int32(3), *got.Spec.Replicas, "the replicas from before the drain")
	assert.Empty(t, got.Finalizers, "the mutating webhook adds them again")
	assert.NotContains(t, got.Annotations, vocab.AnnotationDrainReplicas)
	assert.Contains(t, out.String(), "deployment.apps/web restored in namespace shop from record deployguard-record-web (3 replicas")
	assert.Contains(t, out.String(), "kept until 2026-04-01T00:00:00Z")
}

func TestRestoreRefuses(t *testing.T) {
	live := fixtures.Drained("web", "web:v5")
	live.Finalizers = nil
	beingDeleted := fixtures.Drained("web", "web:v5")
	beingDeleted.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	tests := []struct {
		name      string
		objs      []client.Object
		knownGood bool
		want      string
	}{
		{name: "no record", want: "no record of Deployment shop/web (no ConfigMap deployguard-record-web in namespace shop)"},
		{name: "the Deployment exists", objs: []client.Object{record(t, fixtures.Drained("web", "web:v4")), live},
			want: "deployment shop/web exists; restore never overwrites a Deployment"},
		{name: "the Deployment is still being deleted", objs: []client.Object{record(t, fixtures.Drained("web", "web:v4")), beingDeleted},
			want: "still being deleted"},
		{name: "no known-good template", objs: []client.Object{record(t, fixtures.Drained("web", "web:v4"))}, knownGood: true,
			want: "no known-good template"},
		{name: "not a record", objs: []client.Object{&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "deployguard-record-web"}}},
			want: "not a deployguard record"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := fakeClient(t, tt.objs...)
			var out bytes.Buffer
			err := restoreDeployment(context.Background(), c, "shop", "web", tt.knownGood, &out)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
			assert.Empty(t, out.String())
			d := &appsv1.Deployment{}
			if err := c.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "web"}, d); err == nil {
				assert.Equal(t, "web:v5", d.Spec.Template.Spec.Containers[0].Image, "the existing Deployment is untouched")
			}
		})
	}
}
