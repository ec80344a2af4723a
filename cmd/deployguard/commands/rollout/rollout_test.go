package rollout

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/deployguard/deployguard/cmd/deployguard/commands/internal/fixtures"
	"github.com/deployguard/deployguard/reconciler"
	guardrollout "github.com/deployguard/deployguard/reconciler/rollout"
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
	d := fixtures.Deployment("web:1", nil)
	d.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}
	good := fixtures.ReplicaSet(d, "web-a", "a", "web:1", "3", true, 2)
	good.Labels["app"] = "web"
	bad := fixtures.ReplicaSet(d, "web-b", "b", "web:2", "2", false, 0)
	bad.Labels["app"] = "web"

	const rollbackStatus = "Rolled back from revision 2 (ReplicaSet web-b): 2/2 new pods ImagePullBackOff for 15s (container app, image web:2), to known-good revision 1 (ReplicaSet web-a)."
	rolledBack := d.DeepCopy()
	rolledBack.Annotations = map[string]string{vocab.AnnotationRollbackStatus: rollbackStatus}
	l, _ := guardrollout.ReadLedger(rolledBack)
	l.RolledBackRevision, l.RolledBackTo, l.RolledBackToTemplate = 2, "web-a", vocab.TemplateHash(reconciler.RollbackTemplate(&good))
	guardrollout.SetLedger(&rolledBack.Status, l, fixtures.Now)
	// A rollback adopted from an earlier release names only the ReplicaSet.
	adopted := rolledBack.DeepCopy()
	l.RolledBackToTemplate = ""
	guardrollout.SetLedger(&adopted.Status, l, fixtures.Now)

	// The same rollback told only by annotations: what a tenant can write
	// (or an earlier release left, which the guard adopts once, itself).
	forged := d.DeepCopy()
	forged.Annotations = map[string]string{
		vocab.LegacyAnnotationRolledBackRevision: "2",
		vocab.LegacyAnnotationRolledBackTo:       "web-a",
		vocab.AnnotationRollbackStatus:           rollbackStatus,
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
		{name: "rolled back by an earlier release", d: adopted, wantPhase: reconciler.RolloutFailed, wantReason: vocab.ReasonAutoRollback,
			wantMessage: "2/2 new pods ImagePullBackOff for 15s (container app, image web:2)"},
		{name: "a rollback only in annotations is none", d: forged, wantPhase: reconciler.RolloutComplete, wantMessage: `deployment "web" successfully rolled out`},
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

	d := fixtures.Deployment("web:1", nil)
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
