package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/test/harness"
)

// update changes a Deployment, retrying on conflicts with the controllers.
func update(t *testing.T, ns, name string, mutate func(*appsv1.Deployment)) error {
	t.Helper()
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		d := &appsv1.Deployment{}
		if err := local.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, d); err != nil {
			return err
		}
		mutate(d)
		return local.Client.Update(context.Background(), d)
	})
}

func breakImage(image string) func(*appsv1.Deployment) {
	return func(d *appsv1.Deployment) { breakTemplate(&d.Spec.Template, image) }
}

// waitKnownGood waits until the guard records revision as known-good.
func waitKnownGood(t *testing.T, ns, name string, revision int) {
	t.Helper()
	harness.WaitFor(t, time.Minute, fmt.Sprintf("revision %d of %s was not marked known-good", revision, name), func(ctx context.Context) (bool, string, error) {
		d := get(ctx, t, ns, name)
		return knownGoodRevision(d) == int64(revision), describe(d), nil
	})
}

// waitRolledBack waits until the guard has rolled back from failedRevision (its
// ledger records it) and the Deployment completed again on the restored
// template.
func waitRolledBack(t *testing.T, ns, name string, failedRevision int) *appsv1.Deployment {
	t.Helper()
	harness.WaitFor(t, time.Duration(deadline+60)*time.Second, fmt.Sprintf("%s was not rolled back from revision %d", name, failedRevision), func(ctx context.Context) (bool, string, error) {
		d := get(ctx, t, ns, name)
		return rolledBackRevision(d) == int64(failedRevision), describe(d), nil
	})
	return waitAvailable(t, ns, name, time.Minute)
}

func waitDeadlineExceeded(t *testing.T, ns, name string) {
	t.Helper()
	harness.WaitFor(t, time.Duration(deadline+60)*time.Second, name+" did not reach ProgressDeadlineExceeded", func(ctx context.Context) (bool, string, error) {
		d := get(ctx, t, ns, name)
		p := condition(d, appsv1.DeploymentProgressing)
		return d.Status.ObservedGeneration == d.Generation && p != nil && p.Reason == vocab.ProgressDeadlineExceeded, describe(d), nil
	})
}

func TestBadRolloutIsRolledBackLikeRolloutUndo(t *testing.T) {
	ctx := context.Background()
	guarded := harness.NewNamespace(t, local.Client)
	// The twin lives where the guard does not act; kubectl rolls it back.
	twin := harness.NewNamespace(t, local.Client, harness.NamespaceLabels(map[string]string{vocab.LabelGuard: vocab.LabelGuardDisabled}))

	for _, ns := range []string{guarded, twin} {
		d := harness.Deployment(ns, "shop", "shop:1.0", shortDeadline)
		d.Annotations = map[string]string{"kubernetes.io/change-cause": "release 1.0"}
		require.NoError(t, local.Client.Create(ctx, d))
	}
	waitAvailable(t, guarded, "shop", time.Minute)
	waitAvailable(t, twin, "shop", time.Minute)
	waitKnownGood(t, guarded, "shop", 1)

	for _, ns := range []string{guarded, twin} {
		require.NoError(t, update(t, ns, "shop", func(d *appsv1.Deployment) {
			breakImage("shop:1.1")(d)
			d.Annotations["kubernetes.io/change-cause"] = "release 1.1"
		}))
	}
	got := waitRolledBack(t, guarded, "shop", 2)
	assert.Equal(t, "shop:1.0", got.Spec.Template.Spec.Containers[0].Image)
	assert.Empty(t, got.Spec.Template.Spec.NodeSelector)
	assert.NotEmpty(t, vocab.QuarantinedTemplates(got), "the failed template is quarantined")
	waitEvents(t, guarded, "shop", vocab.ReasonAutoRollback)

	// The same rollback by hand, on the twin.
	waitDeadlineExceeded(t, twin, "shop")
	_, err := local.Cluster.Kubectl(ctx, local.Cluster.Kubeconfig, "rollout", "undo", "deployment/shop", "-n", twin, "--to-revision=1")
	require.NoError(t, err)
	undone := waitAvailable(t, twin, "shop", time.Minute)

	assert.Equal(t, undone.Spec.Template, got.Spec.Template, "the guard restores what `kubectl rollout undo --to-revision` restores")
	assert.Equal(t, undone.Annotations["kubernetes.io/change-cause"], got.Annotations["kubernetes.io/change-cause"],
		"annotations go back as with kubectl (change-cause of the restored revision)")
}

func TestTwoBadRolloutsInARowGoBackToTheLastKnownGood(t *testing.T) {
	ns := harness.NewNamespace(t, local.Client)
	require.NoError(t, local.Client.Create(context.Background(), harness.Deployment(ns, "api", "api:1", shortDeadline)))
	waitAvailable(t, ns, "api", time.Minute)
	waitKnownGood(t, ns, "api", 1)

	require.NoError(t, update(t, ns, "api", breakImage("api:2")))
	d := waitRolledBack(t, ns, "api", 2)
	assert.Equal(t, "api:1", d.Spec.Template.Spec.Containers[0].Image)
	// The restored revision completes again, as revision 3.
	waitKnownGood(t, ns, "api", 3)

	require.NoError(t, update(t, ns, "api", breakImage("api:4")))
	d = waitRolledBack(t, ns, "api", 4)
	assert.Equal(t, "api:1", d.Spec.Template.Spec.Containers[0].Image, "back to the last known-good, never to the bad revision before")
	assert.Equal(t, []string{vocab.ReasonAutoRollback, vocab.ReasonAutoRollback},
		filter(waitEvents(t, ns, "api", vocab.ReasonAutoRollback, vocab.ReasonAutoRollback), vocab.ReasonAutoRollback))
}

func TestPausedDeploymentIsLeftAloneUntilResumed(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, local.Client)
	require.NoError(t, local.Client.Create(ctx, harness.Deployment(ns, "paused", "app:1", shortDeadline)))
	waitAvailable(t, ns, "paused", time.Minute)
	waitKnownGood(t, ns, "paused", 1)

	require.NoError(t, update(t, ns, "paused", func(d *appsv1.Deployment) {
		d.Spec.Paused = true
		breakImage("app:2")(d)
	}))
	// Well past the deadline, nothing happens to a paused Deployment: upstream
	// stops its clock, and the guard never rolls back a paused Deployment.
	assert.Never(t, func() bool {
		d := get(ctx, t, ns, "paused")
		return d.Spec.Template.Spec.Containers[0].Image != "app:2" || rolledBackRevision(d) != 0 || d.Labels[vocab.LabelRolledBack] != ""
	}, time.Duration(2*deadline)*time.Second, 200*time.Millisecond, "a paused Deployment was rolled back")
	d := get(ctx, t, ns, "paused")
	assert.True(t, d.Spec.Paused)

	resumed := time.Now()
	require.NoError(t, update(t, ns, "paused", func(d *appsv1.Deployment) { d.Spec.Paused = false }))
	d = waitRolledBack(t, ns, "paused", 2)
	assert.Equal(t, "app:1", d.Spec.Template.Spec.Containers[0].Image)
	assert.False(t, d.Spec.Paused, "a rollback never pauses or unpauses")
	assert.GreaterOrEqual(t, time.Since(resumed), time.Duration(deadline)*time.Second-time.Second,
		"the guard acted only on a new deadline counted from the resume")
}

func TestQuarantinedTemplateIsRefusedUntilOverridden(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, local.Client)
	require.NoError(t, local.Client.Create(ctx, harness.Deployment(ns, "gitops", "svc:1", shortDeadline)))
	waitAvailable(t, ns, "gitops", time.Minute)
	waitKnownGood(t, ns, "gitops", 1)
	require.NoError(t, update(t, ns, "gitops", breakImage("svc:2")))
	waitRolledBack(t, ns, "gitops", 2)

	// A GitOps tool re-applies the manifest with the failed template.
	err := update(t, ns, "gitops", breakImage("svc:2"))
	require.Error(t, err, "the failed template came back")
	require.True(t, apierrors.IsInvalid(err), "%v", err)
	quarantined := vocab.QuarantinedTemplates(get(ctx, t, ns, "gitops"))
	require.Len(t, quarantined, 1)
	hash := quarantined[0]
	assert.Contains(t, err.Error(), "failed its rollout before and deployguard rolled it back")
	assert.Contains(t, err.Error(), vocab.AnnotationAllowTemplate+"="+hash, "the message names the override")

	// The override, named in the message, lets it back deliberately.
	require.NoError(t, update(t, ns, "gitops", func(d *appsv1.Deployment) {
		breakImage("svc:2")(d)
		d.Annotations[vocab.AnnotationAllowTemplate] = hash
	}))
	assert.Equal(t, "svc:2", get(ctx, t, ns, "gitops").Spec.Template.Spec.Containers[0].Image)
}

// The guard is killed twice: once before the deadline passes, so that it
// starts with a failed rollout to act on, and again as soon as its rollback is
// recorded (the write that restores the template, then the ledger on the
// status). The rollback happens exactly once.
func TestGuardRestartedDuringRollbackRollsBackOnce(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, local.Client)
	require.NoError(t, local.Client.Create(ctx, harness.Deployment(ns, "crashy", "app:1", shortDeadline)))
	waitAvailable(t, ns, "crashy", time.Minute)
	waitKnownGood(t, ns, "crashy", 1)

	require.NoError(t, update(t, ns, "crashy", breakImage("app:2")))
	port := local.Guard.Opts.WebhookPort
	local.Guard.Kill()
	restarted := false
	t.Cleanup(func() {
		if !restarted {
			require.NoError(t, local.StartGuard(context.Background(), port))
		}
	})
	waitDeadlineExceeded(t, ns, "crashy")

	require.NoError(t, local.StartGuard(ctx, port))
	restarted = true
	harness.WaitFor(t, time.Minute, "no rollback after restart", func(ctx context.Context) (bool, string, error) {
		d := get(ctx, t, ns, "crashy")
		return rolledBackRevision(d) == 2, describe(d), nil
	})
	require.NoError(t, local.RestartGuard(ctx), "killed right after the rollback was recorded")

	d := waitAvailable(t, ns, "crashy", time.Minute)
	generation := d.Generation
	assert.Equal(t, "app:1", d.Spec.Template.Spec.Containers[0].Image)
	// Give the restarted guard time to (wrongly) act again, then check it did not.
	assert.Never(t, func() bool {
		return get(ctx, t, ns, "crashy").Generation != generation
	}, 3*time.Second, 100*time.Millisecond, "the Deployment was changed again after the rollback")
	// The Never window above gave the recorder time to flush. The guard was
	// killed right after its write, so the event of that write may be lost;
	// a second one would mean a second rollback.
	assert.LessOrEqual(t, len(filter(harness.GuardEventReasons(ctx, t, local.Client, ns, "crashy"), vocab.ReasonAutoRollback)), 1)
	assert.Equal(t, int64(2), rolledBackRevision(get(ctx, t, ns, "crashy")))
}

func filter(xs []string, keep string) []string {
	var out []string
	for _, x := range xs {
		if x == keep {
			out = append(out, x)
		}
	}
	return out
}
