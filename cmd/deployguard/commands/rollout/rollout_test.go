package rollout

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/deployguard/deployguard/reconciler"
	"github.com/deployguard/deployguard/reconciler/vocab"
)

func TestDeploymentName(t *testing.T) {
	tests := []struct {
		arg    string
		want   string
		wantOK bool
	}{
		{arg: "web", want: "web", wantOK: true},
		{arg: "deployment/web", want: "web", wantOK: true},
		{arg: "deploy/web", want: "web", wantOK: true},
		{arg: "deployments.apps/web", want: "web", wantOK: true},
		{arg: "statefulset/web"},
		{arg: "deploy/"},
		{arg: ""},
	}
	for _, tt := range tests {
		t.Run(tt.arg, func(t *testing.T) {
			got, ok := deploymentName([]string{tt.arg})
			assert.Equal(t, tt.wantOK, ok)
			if tt.wantOK {
				assert.Equal(t, tt.want, got)
			}
		})
	}
}

// The command reads what the guard left on the Deployment and its
// ReplicaSets: upstream's status reads complete after a rollback, the
// command reads failed.
func TestWaitForRollout(t *testing.T) {
	d := deployment("web:1", nil)
	d.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}
	good := replicaSet(d, "web-a", "a", "web:1", "3", true, 2)
	good.Labels["app"] = "web"
	bad := replicaSet(d, "web-b", "b", "web:2", "2", false, 0)
	bad.Labels["app"] = "web"

	rolledBack := d.DeepCopy()
	rolledBack.Annotations = map[string]string{
		vocab.AnnotationRolledBackRevision: "2",
		vocab.AnnotationRolledBackTo:       "web-a",
		vocab.AnnotationRollbackStatus:     "Rolled back from revision 2 (ReplicaSet web-b): 2/2 new pods ImagePullBackOff for 15s (container app, image web:2), to known-good revision 1 (ReplicaSet web-a).",
	}

	tests := []struct {
		name        string
		d           *appsv1.Deployment
		wantPhase   string
		wantReason  string
		wantMessage string
	}{
		{name: "complete", d: d, wantPhase: reconciler.RolloutComplete, wantMessage: `deployment "web" successfully rolled out`},
		{name: "rolled back by the guard", d: rolledBack, wantPhase: reconciler.RolloutFailed, wantReason: vocab.ReasonAutoRollback,
			wantMessage: "2/2 new pods ImagePullBackOff for 15s (container app, image web:2)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := fake.NewClientBuilder().WithScheme(clientgoscheme.Scheme).WithObjects(tt.d, &good, &bad).Build()
			var told []string
			rep, err := waitForRollout(context.Background(), c, "shop", "web", func(st reconciler.RolloutState) { told = append(told, st.Message) })
			require.NoError(t, err)
			assert.Equal(t, tt.wantPhase, rep.Phase)
			assert.Equal(t, tt.wantReason, rep.Reason)
			assert.Contains(t, rep.Message, tt.wantMessage)
			assert.Equal(t, []string{rep.Message}, told)
		})
	}
}

func TestWaitForRolloutEnds(t *testing.T) {
	c := fake.NewClientBuilder().WithScheme(clientgoscheme.Scheme).Build()
	_, err := waitForRollout(context.Background(), c, "shop", "web", func(reconciler.RolloutState) {})
	assert.ErrorContains(t, err, `deployment "web" not found in namespace "shop"`)

	d := deployment("web:1", nil)
	d.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}
	d.Status.UpdatedReplicas = 1
	c = fake.NewClientBuilder().WithScheme(clientgoscheme.Scheme).WithObjects(d).Build()
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	rep, err := waitForRollout(ctx, c, "shop", "web", func(reconciler.RolloutState) {})
	require.Error(t, err)
	assert.True(t, rep.TimedOut)
	assert.Equal(t, reconciler.RolloutProgressing, rep.Phase)
	assert.Contains(t, rep.Message, "1 out of 2 new replicas have been updated")
}

func deployment(image string, annotations map[string]string) *appsv1.Deployment {
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web", UID: types.UID("d-uid"), Generation: 4, Annotations: annotations},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(int32(2)),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "web"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: image}}},
			},
		},
		Status: appsv1.DeploymentStatus{ObservedGeneration: 4, Replicas: 2, UpdatedReplicas: 2, ReadyReplicas: 2, AvailableReplicas: 2},
	}
	return d
}

// replicaSet is a ReplicaSet of d with image, at revision; knownGood
// marks it as the reconciler does.
func replicaSet(d *appsv1.Deployment, name, hash, image string, revision string, knownGood bool, replicas int32) appsv1.ReplicaSet {
	t := *d.Spec.Template.DeepCopy()
	t.Spec.Containers[0].Image = image
	t.Labels = map[string]string{"app": "web", appsv1.DefaultDeploymentUniqueLabelKey: hash}
	rs := appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: d.Namespace, Name: name,
			Labels:      map[string]string{appsv1.DefaultDeploymentUniqueLabelKey: hash},
			Annotations: map[string]string{vocab.RevisionAnnotation: revision},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "Deployment", Name: d.Name, UID: d.UID,
				Controller: ptr.To(true)}},
		},
		Spec:   appsv1.ReplicaSetSpec{Template: t},
		Status: appsv1.ReplicaSetStatus{Replicas: replicas, ReadyReplicas: replicas},
	}
	if knownGood {
		rs.Annotations[vocab.AnnotationKnownGood] = time.Date(2026, 11, 23, 6, 0, 0, 0, time.UTC).Format(time.RFC3339)
		rs.Annotations[vocab.AnnotationKnownGoodHash] = hash
	}
	return rs
}
