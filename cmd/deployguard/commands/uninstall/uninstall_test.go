package uninstall

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/deployguard/deployguard/cmd/deployguard/commands/internal/fixtures"
	"github.com/deployguard/deployguard/reconciler"
	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
)

const otherFinalizer = "example.com/keep"

func withFinalizers(name string, deleting bool, finalizers ...string) *appsv1.Deployment {
	d := fixtures.Drained(name, "app:1")
	d.Finalizers = finalizers
	if deleting {
		d.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	}
	return d
}

func clusterWithGuard() []client.Object {
	m := &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "deployguard-mutating"}}
	v := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "deployguard-validating"}}
	objs := []client.Object{m, v}
	for _, name := range []string{"deployguard-refusals-create", "deployguard-refusals"} {
		objs = append(objs, &admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: name}})
	}
	for _, name := range []string{"deployguard-refusals", "deployguard-warnings", "deployguard-bounds"} {
		objs = append(objs, &admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}})
	}
	objs = append(objs, &admissionregistrationv1.MutatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: "deployguard-selector"}},
		&admissionregistrationv1.MutatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: "deployguard-selector"}})
	return append(objs,
		withFinalizers("guarded", false, vocab.FinalizerDrain, vocab.FinalizerRecord),
		withFinalizers("shared", false, otherFinalizer, vocab.FinalizerDrain, vocab.FinalizerRecord),
		withFinalizers("stuck", true, vocab.FinalizerRecord),
		withFinalizers("theirs", false, otherFinalizer),
	)
}

// uninstallEnv is a fake cluster that records the order of the writes.
func uninstallEnv(t *testing.T, objs []client.Object, beforePatch func(ctx context.Context, c client.WithWatch, obj client.Object)) (client.Client, *[]string) {
	t.Helper()
	scheme := runtime.NewScheme()
	require.NoError(t, clientgoscheme.AddToScheme(scheme))
	var ops []string
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).WithInterceptorFuncs(interceptor.Funcs{
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			ops = append(ops, "delete "+obj.GetName())
			return c.Delete(ctx, obj, opts...)
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			ops = append(ops, "patch "+obj.GetName())
			if beforePatch != nil {
				beforePatch(ctx, c, obj)
			}
			return c.Patch(ctx, obj, patch, opts...)
		},
	}).Build()
	return c, &ops
}

func finalizersOf(t *testing.T, c client.Client, name string) ([]string, bool) {
	t.Helper()
	d := &appsv1.Deployment{}
	err := c.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: name}, d)
	if apierrors.IsNotFound(err) {
		return nil, false
	}
	require.NoError(t, err)
	return d.Finalizers, true
}

// admission are the deletions of the guard's admission objects, in order:
// the webhooks, the selector repair (binding, policy), the refusals'
// bindings, the validating policies, their params.
var admission = []string{"delete deployguard-mutating", "delete deployguard-validating",
	"delete deployguard-selector", "delete deployguard-selector", "delete deployguard-refusals-create", "delete deployguard-refusals",
	"delete deployguard-refusals", "delete deployguard-warnings", "delete deployguard-bounds",
	"delete deployguard-admission-params"}

func TestUninstall(t *testing.T) {
	c, ops := uninstallEnv(t, clusterWithGuard(), nil)
	var out bytes.Buffer

	require.NoError(t, uninstallGuard(context.Background(), c, uninstallOptions{mutatingName: "deployguard-mutating", validatingName: "deployguard-validating"}, &out))

	require.GreaterOrEqual(t, len(*ops), len(admission))
	assert.Equal(t, admission, (*ops)[:len(admission)], "the webhooks and native policies go first")
	assert.ElementsMatch(t, []string{"patch guarded", "patch shared", "patch stuck"}, (*ops)[len(admission):len(*ops)-1], "only Deployments with the guard's finalizers are written")
	assert.Equal(t, "delete deployguard-ledger", (*ops)[len(*ops)-1], "when the ledger began goes last")
	err := c.Get(context.Background(), client.ObjectKey{Name: "deployguard-validating"}, &admissionregistrationv1.ValidatingWebhookConfiguration{})
	assert.True(t, apierrors.IsNotFound(err))

	f, ok := finalizersOf(t, c, "guarded")
	assert.True(t, ok)
	assert.Empty(t, f)
	f, _ = finalizersOf(t, c, "shared")
	assert.Equal(t, []string{otherFinalizer}, f, "other controllers' finalizers stay")
	_, ok = finalizersOf(t, c, "stuck")
	assert.False(t, ok, "a Deployment waiting only for the guard is gone")
	f, _ = finalizersOf(t, c, "theirs")
	assert.Equal(t, []string{otherFinalizer}, f)

	assert.Contains(t, out.String(), "deleted mutatingwebhookconfiguration/deployguard-mutating\n")
	assert.Contains(t, out.String(), "deleted validatingwebhookconfiguration/deployguard-validating\n")
	assert.Contains(t, out.String(), "deleted validatingadmissionpolicybinding/deployguard-refusals\n")
	assert.Contains(t, out.String(), "deleted validatingadmissionpolicybinding/deployguard-refusals-create\n")
	assert.Contains(t, out.String(), "deleted validatingadmissionpolicy/deployguard-refusals\n")
	assert.Contains(t, out.String(), "deleted mutatingadmissionpolicybinding/deployguard-selector\n")
	assert.Contains(t, out.String(), "deleted mutatingadmissionpolicy/deployguard-selector\n")
	assert.Contains(t, out.String(), "removed finalizers [deployguard.io/drain deployguard.io/record] from deployment shop/shared\n")
	assert.Contains(t, out.String(), "removed finalizers [deployguard.io/record] from deployment shop/stuck (being deleted")
	assert.Contains(t, out.String(), "Removed the guard's finalizers from 3 Deployments.")

	// Again: nothing left to do, and it says so.
	out.Reset()
	*ops = nil
	require.NoError(t, uninstallGuard(context.Background(), c, uninstallOptions{mutatingName: "deployguard-mutating", validatingName: "deployguard-validating"}, &out))
	assert.Equal(t, append(slices.Clone(admission), "delete deployguard-ledger"), *ops)
	assert.Contains(t, out.String(), "mutatingwebhookconfiguration/deployguard-mutating not found (already removed)")
	assert.Contains(t, out.String(), "Removed the guard's finalizers from 0 Deployments.")
}

func TestUninstallDryRun(t *testing.T) {
	c, ops := uninstallEnv(t, clusterWithGuard(), nil)
	var out bytes.Buffer

	require.NoError(t, uninstallGuard(context.Background(), c, uninstallOptions{mutatingName: "deployguard-mutating", validatingName: "other-validating", dryRun: true}, &out))

	assert.Empty(t, *ops, "a dry run writes nothing")
	assert.Contains(t, out.String(), "would delete mutatingwebhookconfiguration/deployguard-mutating\n")
	assert.Contains(t, out.String(), "validatingwebhookconfiguration/other-validating not found")
	assert.Contains(t, out.String(), "would remove finalizers [deployguard.io/drain deployguard.io/record] from deployment shop/guarded\n")
	assert.Contains(t, out.String(), "3 Deployments carry the guard's finalizers; nothing was changed (dry run).")
	f, _ := finalizersOf(t, c, "guarded")
	assert.Equal(t, []string{vocab.FinalizerDrain, vocab.FinalizerRecord}, f)
}

// Uninstall deletes the ConfigMap that says when the guard's ledger began,
// and whether a platform team let it adopt an earlier release's annotations:
// a guard installed again adopts nothing, so that nothing a tenant wrote on
// the Deployments whose ledgers uninstall removed is taken as its state.
func TestUninstallClosesAdoption(t *testing.T) {
	for _, dryRun := range []bool{false, true} {
		t.Run(fmt.Sprintf("dry run %t", dryRun), func(t *testing.T) {
			since := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "deployguard-system", Name: reconciler.LedgerSinceConfigMap},
				Data: map[string]string{"since": "2026-01-01T00:00:00Z", reconciler.LedgerAdoptKey: "true"}}
			c, _ := uninstallEnv(t, []client.Object{since}, nil)
			var out bytes.Buffer

			require.NoError(t, uninstallGuard(context.Background(), c, uninstallOptions{mutatingName: "m", validatingName: "v", namespace: "deployguard-system", dryRun: dryRun}, &out))

			err := c.Get(context.Background(), client.ObjectKeyFromObject(since), &corev1.ConfigMap{})
			if dryRun {
				require.NoError(t, err, "a dry run deletes nothing")
				assert.Contains(t, out.String(), "would delete configmap/deployguard-ledger in deployguard-system")
				return
			}
			assert.True(t, apierrors.IsNotFound(err), "%v", err)
			assert.Contains(t, out.String(), "deleted configmap/deployguard-ledger in deployguard-system (when the ledger began: a guard installed again adopts no annotations)")
		})
	}
}

// Another controller adds its finalizer between uninstall's read and write:
// the write conflicts, is retried from a fresh read, and their finalizer stays.
func TestUninstallRetriesOnConflict(t *testing.T) {
	raced := false
	objs := []client.Object{withFinalizers("guarded", false, vocab.FinalizerDrain, vocab.FinalizerRecord)}
	c, ops := uninstallEnv(t, objs, func(ctx context.Context, c client.WithWatch, obj client.Object) {
		if raced {
			return
		}
		raced = true
		d := &appsv1.Deployment{}
		require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(obj), d))
		d.Finalizers = append(d.Finalizers, otherFinalizer)
		require.NoError(t, c.Update(ctx, d))
	})
	var out bytes.Buffer

	require.NoError(t, uninstallGuard(context.Background(), c, uninstallOptions{mutatingName: "m", validatingName: "v"}, &out))

	assert.Equal(t, append(append([]string{"delete m", "delete v"}, admission[2:]...), "patch guarded", "patch guarded", "delete deployguard-ledger"), *ops, "retried once")
	f, _ := finalizersOf(t, c, "guarded")
	assert.Equal(t, []string{otherFinalizer}, f)
}

// A Deployment the guard rolled back reads as failed until the guard ends the
// verdict; uninstall ends it, since nothing would once the guard is gone, and
// removes the guard's ledger with it. A rollback told only by annotations (a
// tenant can write them) is no verdict.
func TestUninstallEndsRollbackVerdicts(t *testing.T) {
	stalled := appsv1.DeploymentCondition{Type: vocab.ConditionStalled, Status: corev1.ConditionTrue, Reason: vocab.ReasonAutoRollback}
	rolledBackLedger := func(d *appsv1.Deployment) {
		l, _ := rollout.ReadLedger(d)
		l.RolledBackRevision, l.RolledBackTo = 3, d.Name+"-h2"
		rollout.SetLedger(&d.Status, l, fixtures.Now)
	}
	tests := []struct {
		name    string
		d       func(d *appsv1.Deployment)
		verdict bool
	}{
		{name: "label, ledger and Stalled condition", verdict: true, d: func(d *appsv1.Deployment) {
			d.Labels = map[string]string{"app": "web", vocab.LabelRolledBack: "3"}
			d.Status.Conditions = append(d.Status.Conditions, stalled)
			rolledBackLedger(d)
		}},
		{name: "in the ledger alone (an earlier release set no label)", verdict: true, d: rolledBackLedger},
		{name: "in annotations alone", verdict: false, d: func(d *appsv1.Deployment) {
			d.Annotations = map[string]string{vocab.LegacyAnnotationRolledBackTo: d.Name + "-h2", vocab.LegacyAnnotationRolledBackRevision: "3"}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rolledBack := withFinalizers("rolled-back", false)
			rolledBack.Labels = map[string]string{"app": "web"}
			rolledBack.Status.Conditions = []appsv1.DeploymentCondition{{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionTrue}}
			tt.d(rolledBack)
			want := rolledBack.DeepCopy()
			scheme := runtime.NewScheme()
			require.NoError(t, clientgoscheme.AddToScheme(scheme))
			c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(rolledBack, withFinalizers("theirs", false, otherFinalizer)).
				WithStatusSubresource(&appsv1.Deployment{}).Build()

			var out bytes.Buffer
			require.NoError(t, uninstallGuard(context.Background(), c, uninstallOptions{dryRun: true}, &out))
			assert.NotContains(t, out.String(), "shop/theirs")
			if !tt.verdict {
				assert.NotContains(t, out.String(), "rollback verdict")
				assert.NotContains(t, out.String(), "stand rolled back")
				require.NoError(t, uninstallGuard(context.Background(), c, uninstallOptions{}, &out))
				got := &appsv1.Deployment{}
				require.NoError(t, c.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "rolled-back"}, got))
				assert.Equal(t, want.Annotations, got.Annotations, "not the guard's to remove")
				return
			}
			assert.Contains(t, out.String(), "would end the rollback verdict on deployment shop/rolled-back\n")
			assert.Contains(t, out.String(), "1 Deployments stand rolled back by the guard; nothing was changed (dry run).")

			out.Reset()
			require.NoError(t, uninstallGuard(context.Background(), c, uninstallOptions{}, &out))
			assert.Contains(t, out.String(), "ended the rollback verdict on deployment shop/rolled-back\n")
			assert.Contains(t, out.String(), "Ended the rollback verdict on 1 Deployments")
			got := &appsv1.Deployment{}
			require.NoError(t, c.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "rolled-back"}, got))
			assert.Equal(t, map[string]string{"app": "web"}, got.Labels)
			_, hasLedger := rollout.ReadLedger(got)
			assert.False(t, hasLedger, "nothing the guard wrote is left")
			require.Len(t, got.Status.Conditions, 1, "the Deployment no longer reads as failed")
			assert.Equal(t, appsv1.DeploymentProgressing, got.Status.Conditions[0].Type)
		})
	}
}

// A Deployment that the guard never rolled back still carries its ledger
// (known-good revisions): uninstall removes it too, and only it.
func TestUninstallRemovesEveryLedger(t *testing.T) {
	d := withFinalizers("web", false)
	d.Status.Conditions = []appsv1.DeploymentCondition{{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionTrue}}
	rollout.SetLedger(&d.Status, rollout.Ledger{KnownGood: []rollout.KnownGoodEntry{{ReplicaSet: "web-1", UID: "uid-1", Template: "h", Revision: 1}}}, fixtures.Now)
	scheme := runtime.NewScheme()
	require.NoError(t, clientgoscheme.AddToScheme(scheme))
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(d).WithStatusSubresource(&appsv1.Deployment{}).Build()

	var out bytes.Buffer
	require.NoError(t, uninstallGuard(context.Background(), c, uninstallOptions{dryRun: true}, &out))
	assert.Contains(t, out.String(), "would remove the guard's ledger from deployment shop/web\n")
	got := &appsv1.Deployment{}
	require.NoError(t, c.Get(context.Background(), client.ObjectKeyFromObject(d), got))
	_, has := rollout.ReadLedger(got)
	require.True(t, has, "a dry run changes nothing")

	out.Reset()
	require.NoError(t, uninstallGuard(context.Background(), c, uninstallOptions{}, &out))
	assert.Contains(t, out.String(), "Removed the guard's ledger (status condition deployguard.io/Ledger) from 1 Deployments.")
	require.NoError(t, c.Get(context.Background(), client.ObjectKeyFromObject(d), got))
	_, has = rollout.ReadLedger(got)
	assert.False(t, has)
	assert.Equal(t, []appsv1.DeploymentCondition{{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionTrue}}, got.Status.Conditions, "upstream's conditions stay")
}
