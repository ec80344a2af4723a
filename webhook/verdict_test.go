package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/deployguard/deployguard/reconciler/vocab"
)

// TestVerdictHandler: the status webhook's answers, decided by the
// reconciler's DecideVerdict (its own table tests the decision). The API
// server's side, and a real status write, are in the integration tier
// (TestAFixIsNeverObservedUnderTheOldVerdict).
func TestVerdictHandler(t *testing.T) {
	restored := &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web-restored"},
		Spec:       appsv1.ReplicaSetSpec{Template: stored().Spec.Template},
	}
	// rolledBack is the Deployment at generation 5 after the rollback (with
	// image, when set, applied), its status observed up to observed.
	rolledBack := func(image string, observed int64) *appsv1.Deployment {
		d := stored(func(d *appsv1.Deployment) {
			d.Generation = 5
			d.Annotations = map[string]string{vocab.AnnotationRolledBackTo: "web-restored", vocab.AnnotationRolledBackRevision: "4"}
			d.Status.ObservedGeneration = observed
			d.Status.Conditions = []appsv1.DeploymentCondition{
				{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue},
				{Type: vocab.ConditionStalled, Status: corev1.ConditionTrue, Reason: vocab.ReasonAutoRollback},
				{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionTrue},
			}
		})
		if image != "" {
			d.Spec.Template.Spec.Containers[0].Image = image
		}
		return d
	}
	readFails := interceptor.Funcs{Get: func(context.Context, client.WithWatch, client.ObjectKey, client.Object, ...client.GetOption) error {
		return errors.New("connection refused")
	}}
	tests := []struct {
		name        string
		old, d      *appsv1.Deployment
		subresource string
		funcs       interceptor.Funcs
		wantRemoved bool
	}{
		{name: "a fix observed", old: rolledBack("web:fixed", 4), d: rolledBack("web:fixed", 5), subresource: "status", wantRemoved: true},
		{name: "the restored template observed", old: rolledBack("", 4), d: rolledBack("", 5), subresource: "status"},
		{name: "a fix, not observed yet", old: rolledBack("web:fixed", 4), d: rolledBack("web:fixed", 4), subresource: "status"},
		{name: "a fix observed, the ReplicaSet unreadable", old: rolledBack("web:fixed", 4), d: rolledBack("web:fixed", 5), subresource: "status", funcs: readFails},
		{name: "not a status write", old: rolledBack("web:fixed", 4), d: rolledBack("web:fixed", 5)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			scheme := runtime.NewScheme()
			require.NoError(t, clientgoscheme.AddToScheme(scheme))
			c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(restored.DeepCopy()).WithInterceptorFuncs(tt.funcs).Build()
			raw, err := json.Marshal(tt.d)
			require.NoError(t, err)
			oldRaw, err := json.Marshal(tt.old)
			require.NoError(t, err)
			req := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
				Kind: deploymentKind.gvk, Operation: admissionv1.Update, SubResource: tt.subresource,
				Namespace: "shop", Name: "web",
				Object: runtime.RawExtension{Raw: raw}, OldObject: runtime.RawExtension{Raw: oldRaw},
			}}
			resp, reason := verdict{replicaSets: c}.handle(context.Background(), req)
			require.True(t, resp.Allowed, "a status write is never refused")
			assert.Equal(t, reasonNone, reason)
			if !tt.wantRemoved {
				assert.Empty(t, resp.Patches)
				return
			}
			ops, err := json.Marshal(resp.Patches)
			require.NoError(t, err)
			patch, err := jsonpatch.DecodePatch(ops)
			require.NoError(t, err)
			patched, err := patch.Apply(raw)
			require.NoError(t, err)
			got := &appsv1.Deployment{}
			require.NoError(t, json.Unmarshal(patched, got))
			want := tt.d.DeepCopy()
			want.Status.Conditions = []appsv1.DeploymentCondition{want.Status.Conditions[0], want.Status.Conditions[2]}
			assert.Equal(t, want, got, "only the guard's Stalled condition is removed")

			// Applied to another list, the patch fails rather than remove
			// another condition.
			other := tt.d.DeepCopy()
			other.Status.Conditions[1].Reason = "SomeoneElse"
			otherRaw, err := json.Marshal(other)
			require.NoError(t, err)
			_, err = patch.Apply(otherRaw)
			assert.Error(t, err)
		})
	}
}
