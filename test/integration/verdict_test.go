package integration

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler"
	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/test/harness"
)

// TestAFixIsNeverObservedUnderTheOldVerdict: after the guard's rollback, the
// Deployment controller's status write that records a new generation as
// observed is the first one a deploying tool reads the new spec's outcome
// from. When that spec ends the rollback verdict (a new template, an
// accepted rollback), the guard's Stalled condition is gone from that very
// write, whoever sends it; otherwise it stays. Here the test writes the status as the Deployment controller does
// (its user, every condition copied), so that nothing else, the reconciler
// included, could have ended the verdict in between.
func TestAFixIsNeverObservedUnderTheOldVerdict(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, k8s, kept)
	controller, _ := clientAs(t, "system:serviceaccount:kube-system:deployment-controller")

	tests := []struct {
		name string
		// change is the user's write after the rollback.
		change func(t *testing.T, d *appsv1.Deployment)
		// adopted: the rollback was adopted from an earlier release's
		// annotations, and the ledger names only the restored ReplicaSet,
		// not its template.
		adopted   bool
		wantClear bool
	}{
		// Rolled back by an earlier release, which set no label: the API
		// server does not call the guard (the reconciler labels it).
		{name: "a fixed template, the Deployment not labelled", change: func(t *testing.T, d *appsv1.Deployment) {
			delete(d.Labels, vocab.LabelRolledBack)
			d.Spec.Template.Spec.Containers[0].Image = "nginx:1.27.4"
		}},
		{name: "a fixed template", wantClear: true, change: func(t *testing.T, d *appsv1.Deployment) {
			d.Spec.Template.Spec.Containers[0].Image = "nginx:1.27.4"
		}},
		{name: "a scale of the restored template", change: func(t *testing.T, d *appsv1.Deployment) {
			d.Spec.Replicas = ptr(int32(3))
		}},
		{name: "the rollback accepted, and a scale", wantClear: true, change: func(t *testing.T, d *appsv1.Deployment) {
			metav1.SetMetaDataAnnotation(&d.ObjectMeta, vocab.AnnotationAcceptRollback, "2")
			d.Spec.Replicas = ptr(int32(3))
		}},
		// The ledger names the restored template: the Deployment runs it
		// still, whatever became of its ReplicaSet.
		{name: "a scale once the restored ReplicaSet is gone", change: func(t *testing.T, d *appsv1.Deployment) {
			rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Namespace: d.Namespace, Name: d.Name + "-restored"}}
			require.NoError(t, k8s.Delete(ctx, rs))
			d.Spec.Replicas = ptr(int32(3))
		}},
		// The webhook reads nothing from the API server: a rollback whose
		// template it cannot tell from the request is the reconciler's to
		// end, after this write.
		{name: "a fixed template, the rollback adopted from an earlier release", adopted: true, change: func(t *testing.T, d *appsv1.Deployment) {
			d.Spec.Template.Spec.Containers[0].Image = "nginx:1.27.4"
		}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := rolledBackDeployment(ctx, t, ns, "web-"+string(rune('a'+i)), tt.adopted)

			tt.change(t, d)
			require.NoError(t, k8s.Update(ctx, d))
			require.Greater(t, d.Generation, d.Status.ObservedGeneration)

			// The controller records the newRS first: the new generation is
			// not observed yet, and the verdict is left as it is.
			d.Status.Conditions[0].Message = `ReplicaSet "` + d.Name + `-new" is progressing.`
			require.NoError(t, controller.Status().Update(ctx, d))
			assert.NotNil(t, guardStalledOn(d), "a write that does not observe the new generation keeps the verdict")

			// Then the write that observes it, every condition copied.
			d.Status.ObservedGeneration = d.Generation
			require.NoError(t, controller.Status().Update(ctx, d))
			stored := &appsv1.Deployment{}
			require.NoError(t, k8s.Get(ctx, client.ObjectKeyFromObject(d), stored))
			if tt.wantClear {
				assert.Nil(t, guardStalledOn(stored), "the write that observes generation %d still reads as the failed rollout", stored.Generation)
				assert.Nil(t, guardStalledOn(d), "the controller got the verdict back in its answer")
			} else {
				assert.NotNil(t, guardStalledOn(stored), "the rollback still stands: the restored template is running")
			}
			require.Len(t, stored.Status.Conditions, map[bool]int{true: 2, false: 3}[tt.wantClear], "the other conditions are kept")
			assert.Equal(t, appsv1.DeploymentProgressing, stored.Status.Conditions[0].Type)
			l, kept := rollout.ReadLedger(stored)
			assert.True(t, kept, "the guard's ledger is kept")
			assert.Equal(t, int64(2), l.RolledBackRevision, "the ledger still says which revision was rolled back")
			assert.Equal(t, stored.Generation, stored.Status.ObservedGeneration)
		})
	}
}

// rolledBackDeployment creates Deployment name as the guard's rollback leaves
// it: running the template of its ReplicaSet name-restored (revision 1,
// known-good) after revision 2 failed, labelled, the rollback recorded in the
// guard's ledger and reported as the guard's Stalled condition, both on its
// status. The ledger names the restored template, as every rollback of this
// release records it, unless adopted: a rollback an earlier release made
// names only the ReplicaSet.
func rolledBackDeployment(ctx context.Context, t *testing.T, ns, name string, adopted bool) *appsv1.Deployment {
	t.Helper()
	d := harness.Deployment(ns, name, appImage)
	require.NoError(t, k8s.Create(ctx, d))

	const hash = "restored"
	rs := &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: name + "-" + hash,
			Labels:          map[string]string{appsv1.DefaultDeploymentUniqueLabelKey: hash},
			Annotations:     map[string]string{vocab.RevisionAnnotation: "1"},
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(d, appsv1.SchemeGroupVersion.WithKind("Deployment"))},
		},
		Spec: appsv1.ReplicaSetSpec{Replicas: ptr(int32(0)), Selector: d.Spec.Selector.DeepCopy(), Template: *d.Spec.Template.DeepCopy()},
	}
	for k, v := range d.Spec.Template.Labels {
		rs.Labels[k] = v
	}
	rs.Spec.Selector.MatchLabels[appsv1.DefaultDeploymentUniqueLabelKey] = hash
	rs.Spec.Template.Labels[appsv1.DefaultDeploymentUniqueLabelKey] = hash
	require.NoError(t, k8s.Create(ctx, rs))

	if d.Labels == nil {
		d.Labels = map[string]string{}
	}
	d.Labels[vocab.LabelRolledBack] = "2"
	require.NoError(t, k8s.Update(ctx, d))
	now := metav1.Now()
	updateStatus(ctx, t, d, func(d *appsv1.Deployment) {
		d.Status.ObservedGeneration = d.Generation
		d.Status.Conditions = []appsv1.DeploymentCondition{
			{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionTrue, Reason: "NewReplicaSetAvailable",
				Message: `ReplicaSet "` + rs.Name + `" has successfully progressed.`, LastUpdateTime: now, LastTransitionTime: now},
			{Type: vocab.ConditionStalled, Status: corev1.ConditionTrue, Reason: vocab.ReasonAutoRollback,
				Message: "Rolled back from revision 2.", LastUpdateTime: now, LastTransitionTime: now},
		}
		ledger := rollout.Ledger{RolledBackRevision: 2, RolledBackTo: rs.Name}.WithKnownGood(rs, 1, now.Time)
		if !adopted {
			ledger.RolledBackToTemplate = vocab.TemplateHash(reconciler.RollbackTemplate(rs))
		}
		rollout.SetLedger(&d.Status, ledger, now.Time)
	})
	require.NotNil(t, guardStalledOn(d), "the guard's own report is left as it is")
	l, _ := rollout.ReadLedger(d)
	require.Equal(t, rs.Name, l.RolledBackTo, "the rollback is recorded")
	require.True(t, l.IsKnownGood(rs), "the restored ReplicaSet is known-good: %+v", l.KnownGood)
	return d
}

// guardStalledOn returns the guard's Stalled condition on d, or nil.
func guardStalledOn(d *appsv1.Deployment) *appsv1.DeploymentCondition {
	for i, c := range d.Status.Conditions {
		if c.Type == vocab.ConditionStalled && c.Reason == vocab.ReasonAutoRollback {
			return &d.Status.Conditions[i]
		}
	}
	return nil
}
