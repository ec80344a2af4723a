package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/test/harness"
)

// The control plane's controllers are exempt from the guard's webhooks and
// native policies, as on kubeadm (the local cluster runs them under their
// own service accounts, --use-service-account-credentials): nothing a tenant
// writes may make one of them do what the tenant could not.

// withGuardDown runs f with every guard replica stopped, then starts the
// guard again on the same port: what f sees refused, the API server's
// native policies refused alone.
func withGuardDown(t *testing.T, f func()) {
	t.Helper()
	ctx := context.Background()
	port := local.Guard.Opts.WebhookPort
	require.NoError(t, local.Guard.Stop())
	defer func() { require.NoError(t, local.StartGuard(ctx, port), "the guard did not start again") }()
	f()
}

// A tenant cannot make the Deployment controller roll its Deployment to a
// template the policies refuse: a ReplicaSet of its own carries the
// template, but the deprecated rollback annotation that would have the
// controller copy it, under the controller's exempt identity, is refused,
// with the command that rolls back as the tenant; also while the guard is
// down.
func TestTenantCannotRollBackThroughTheDeploymentController(t *testing.T) {
	ctx := context.Background()
	tn := newTenant(t)
	d := harness.Deployment(tn.ns, "web", "app:1", shortDeadline)
	require.NoError(t, tn.c.Create(ctx, d))
	waitAvailable(t, tn.ns, "web", time.Minute)
	hotLoadPolicy(ctx, t, "e2e-exempt-hostnetwork", "hostnetwork.rego", fmt.Sprintf(`# METADATA
# custom:
#   mode: enforce
package deployguard.e2eexempthostnetwork

import rego.v1

deny contains {"msg": "host networking is not allowed", "field": "spec.template.spec.hostNetwork"} if {
	input.object.metadata.namespace == %q
	input.object.spec.template.spec.hostNetwork
}
`, tn.ns))
	harness.WaitFor(t, time.Minute, "the policy was never enforced", func(ctx context.Context) (bool, string, error) {
		d := get(ctx, t, tn.ns, "web")
		d.Spec.Template.Spec.HostNetwork = true
		err := tn.c.Update(ctx, d, client.DryRunAll)
		return err != nil && strings.Contains(err.Error(), "host networking is not allowed"), fmt.Sprint(err), nil
	})

	// The refused template, in a ReplicaSet the tenant may write (edit), of
	// a revision the Deployment never had, labelled as the Deployment
	// selects: its controller adopts it.
	stored := get(ctx, t, tn.ns, "web")
	bait := &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: "web-bait", Namespace: tn.ns, Labels: stored.Spec.Selector.MatchLabels,
			Annotations: map[string]string{"deployment.kubernetes.io/revision": "7"}},
		Spec: appsv1.ReplicaSetSpec{Replicas: ptr(int32(0)), Selector: stored.Spec.Selector.DeepCopy(),
			Template: *stored.Spec.Template.DeepCopy()},
	}
	bait.Spec.Template.Spec.HostNetwork = true
	require.NoError(t, tn.c.Create(ctx, bait))

	// The controllers write the Deployment too (its revision, its status):
	// a conflict is tried again, a refusal is the answer.
	annotate := func(c client.Client, rev string) error {
		return retry.RetryOnConflict(retry.DefaultRetry, func() error {
			d := get(ctx, t, tn.ns, "web")
			metav1.SetMetaDataAnnotation(&d.ObjectMeta, appsv1.DeprecatedRollbackTo, rev)
			return c.Update(ctx, d)
		})
	}
	const want = "metadata.annotations[deprecated.deployment.rollback.to]: the Deployment controller would copy the pod template of the ReplicaSet of revision 7 into this Deployment under its own identity, where no policy judges it; remove the annotation and roll back with: kubectl rollout undo deployment/web -n "
	err := annotate(tn.c, "7")
	require.Error(t, err, "the tenant's rollback annotation was admitted")
	assert.Contains(t, err.Error(), want+tn.ns+" --to-revision=7")
	assert.True(t, apierrors.IsForbidden(err) || apierrors.IsInvalid(err), "%v", err)
	// Nor on a create: the controller would act on it at its first sync.
	other := harness.Deployment(tn.ns, "other", "app:1", shortDeadline)
	other.Annotations = map[string]string{appsv1.DeprecatedRollbackTo: "1"}
	err = tn.c.Create(ctx, other)
	require.Error(t, err, "a create with the rollback annotation was admitted")
	assert.Contains(t, err.Error(), "kubectl rollout undo deployment/other -n "+tn.ns+" --to-revision=1")

	// The native floor refuses it alone.
	withGuardDown(t, func() {
		err := annotate(tn.c, "7")
		require.Error(t, err, "the tenant's rollback annotation was admitted with the guard down")
		assert.Contains(t, err.Error(), want+tn.ns+" --to-revision=7")
	})

	// The Deployment controller has synced since (it adopted the bait) and
	// runs the template it had: nothing of the bait's runs.
	harness.WaitFor(t, time.Minute, "the Deployment controller never adopted the bait", func(ctx context.Context) (bool, string, error) {
		rs := &appsv1.ReplicaSet{}
		if err := local.Client.Get(ctx, client.ObjectKeyFromObject(bait), rs); err != nil {
			return false, "", err
		}
		owner := metav1.GetControllerOf(rs)
		return owner != nil && owner.UID == stored.UID, fmt.Sprint(rs.OwnerReferences), nil
	})
	got := waitAvailable(t, tn.ns, "web", time.Minute)
	assert.False(t, got.Spec.Template.Spec.HostNetwork, "the Deployment runs the refused template")
	assert.NotContains(t, got.Annotations, appsv1.DeprecatedRollbackTo)
	assert.Equal(t, stored.Generation, got.Generation, "the Deployment's spec was never changed")
	rs := &appsv1.ReplicaSet{}
	require.NoError(t, local.Client.Get(ctx, client.ObjectKeyFromObject(bait), rs))
	assert.Zero(t, rs.Status.Replicas, "the bait runs no pod")
}

// An owner reference lets the garbage collector (exempt) delete a
// Deployment once its owner is gone. A tenant cannot add one to a protected
// Deployment, nor to one an enforced policy forbids it to delete; and a
// protected Deployment whose owner is deleted stays, where an unprotected
// one beside it is collected.
func TestTenantCannotDeleteThroughTheGarbageCollector(t *testing.T) {
	ctx := context.Background()
	tn := newTenant(t)
	hotLoadPolicy(ctx, t, "e2e-exempt-critical", "critical.rego", fmt.Sprintf(`# METADATA
# custom:
#   mode: enforce
package deployguard.e2eexemptcritical

import rego.v1

deny contains "a tier: critical Deployment may not be deleted" if {
	input.operation == "DELETE"
	input.oldObject.metadata.namespace == %q
	input.oldObject.metadata.labels.tier == "critical"
}
`, tn.ns))
	bait := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "bait", Namespace: tn.ns}}
	require.NoError(t, tn.c.Create(ctx, bait))
	ownedByBait := func(o metav1.Object) {
		o.SetOwnerReferences(append(o.GetOwnerReferences(), metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: bait.Name, UID: bait.UID}))
	}
	protected := harness.Deployment(tn.ns, "protected", "app:1", shortDeadline)
	protected.Annotations = map[string]string{vocab.AnnotationProtected: "true"}
	critical := harness.Deployment(tn.ns, "critical", "app:1", shortDeadline)
	critical.Labels = map[string]string{"tier": "critical"}
	for _, d := range []*appsv1.Deployment{protected, critical} {
		require.NoError(t, tn.c.Create(ctx, d))
	}
	harness.WaitFor(t, time.Minute, "the tenant's delete of the critical Deployment was never refused", func(ctx context.Context) (bool, string, error) {
		err := tn.c.Delete(ctx, critical.DeepCopy(), client.DryRunAll)
		return err != nil && strings.Contains(err.Error(), "may not be deleted"), fmt.Sprint(err), nil
	})

	addOwner := func(name string) error {
		return retry.RetryOnConflict(retry.DefaultRetry, func() error {
			d := get(ctx, t, tn.ns, name)
			ownedByBait(d)
			return tn.c.Update(ctx, d)
		})
	}
	err := addOwner("protected")
	require.Error(t, err, "an owner was added to a protected Deployment")
	assert.Contains(t, err.Error(), "metadata.ownerReferences: Deployment "+tn.ns+"/protected is protected from deletion, and an owner reference to ConfigMap bait lets the garbage collector delete it once that owner is deleted")
	err = addOwner("critical")
	require.Error(t, err, "an owner was added to a Deployment the tenant may not delete")
	assert.Contains(t, err.Error(), "an owner reference to ConfigMap bait lets the garbage collector delete this Deployment once that owner is deleted, and you may not delete it: [policy e2eexemptcritical] a tier: critical Deployment may not be deleted")
	withGuardDown(t, func() {
		err := addOwner("protected")
		require.Error(t, err, "an owner was added to a protected Deployment with the guard down")
		assert.Contains(t, err.Error(), "is protected from deletion, and an owner reference")
	})

	// Owners given before the protection: an unprotected Deployment may be
	// owned, and then protected. An unowned ConfigMap and Deployment beside
	// it tell when the garbage collector has acted on the owner's deletion.
	adopted := harness.Deployment(tn.ns, "adopted", "app:1", shortDeadline)
	ownedByBait(adopted)
	require.NoError(t, tn.c.Create(ctx, adopted))
	tn.update(t, "adopted", func(d *appsv1.Deployment) {
		metav1.SetMetaDataAnnotation(&d.ObjectMeta, vocab.AnnotationProtected, "true")
	})
	collected := harness.Deployment(tn.ns, "collected", "app:1", shortDeadline)
	ownedByBait(collected)
	require.NoError(t, tn.c.Create(ctx, collected))
	canary := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "canary", Namespace: tn.ns}}
	ownedByBait(canary)
	require.NoError(t, tn.c.Create(ctx, canary))

	require.NoError(t, tn.c.Delete(ctx, bait))
	waitGone(t, tn.ns, "collected", time.Minute)
	harness.WaitFor(t, time.Minute, "the garbage collector never collected the canary", func(ctx context.Context) (bool, string, error) {
		err := local.Client.Get(ctx, client.ObjectKeyFromObject(canary), &corev1.ConfigMap{})
		return apierrors.IsNotFound(err), fmt.Sprint(err), nil
	})
	for _, name := range []string{"protected", "critical", "adopted"} {
		d := get(ctx, t, tn.ns, name)
		assert.Nil(t, d.DeletionTimestamp, "%s is being deleted", name)
	}
	// Its owner gone, the garbage collector keeps asking: the protected
	// Deployment stays until its owner reference is removed (or the
	// protection lifted), and the namespace's deletion takes it all the
	// same (the namespace controller is let through).
	tn.update(t, "adopted", func(d *appsv1.Deployment) { d.OwnerReferences = nil })
	assert.Nil(t, get(ctx, t, tn.ns, "adopted").DeletionTimestamp)
}
