package clients

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/deployguard/deployguard/reconciler"
	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/test/harness"
)

// rolloutJSON is what `kubectl deployguard rollout status -o json` prints.
type rolloutJSON struct {
	Namespace      string `json:"namespace"`
	Name           string `json:"name"`
	Phase          string `json:"phase"`
	Reason         string `json:"reason"`
	Message        string `json:"message"`
	FailedRevision string `json:"failedRevision"`
}

func parseRollout(t *testing.T, r result) rolloutJSON {
	t.Helper()
	var out rolloutJSON
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &out), "rollout status -o json must parse: %s", r)
	return out
}

// A pipeline of kubectl apply and kubectl rollout status, and the same with
// the guard's pipeline step: a good deploy passes, a bad one the guard rolls
// back fails in both, a re-apply of the failed template is refused with the
// guard's message, and a fixed template passes again.
func TestKubectl(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := harness.NewNamespace(t, local.Client)
	plugin := filepath.Join(tools, "kubectl") // `kubectl deployguard …` finds kubectl-deployguard on $PATH

	good := writeFile(t, "good.yaml", webManifest(t, ns, "web", goodImage))
	r := kubectl(ctx, "apply", "-f", good)
	require.Zero(t, r.Code, "%s", r)
	r = kubectl(ctx, "rollout", "status", "deploy/web", "-n", ns, "--timeout=120s")
	require.Zero(t, r.Code, "good deploy: kubectl rollout status: %s", r)
	assert.Contains(t, r.Stdout, `deployment "web" successfully rolled out`)
	r = command(ctx, plugin, "deployguard", "rollout", "status", "deploy/web", "-n", ns, "--timeout=120s")
	require.Zero(t, r.Code, "good deploy: kubectl deployguard rollout status: %s", r)
	assert.Contains(t, r.Stdout, `deployment "web" successfully rolled out`)
	waitKnownGood(t, ns, "web")

	builtin, customized := argoHealth(t, ns, "web")
	assert.Equal(t, "Healthy", builtin.Status, "good deploy, Argo CD built-in: %+v", builtin)
	assert.Equal(t, "Healthy", customized.Status, "good deploy, Argo CD with the guard's health check: %+v", customized)
	metricsBefore := scrapeGuard(t)

	// The bad deploy, watched the way pipelines watch it.
	bad := writeFile(t, "bad.yaml", webManifest(t, ns, "web", badImage))
	r = kubectl(ctx, "apply", "-f", bad)
	require.Zero(t, r.Code, "%s", r)
	watchCtx, cancel := context.WithTimeout(ctx, 4*time.Minute)
	defer cancel()
	decided := decisionWatch(watchCtx, t, ns, "web")
	kubectlDone := start(watchCtx, filepath.Join(tools, "kubectl"), "rollout", "status", "deploy/web", "-n", ns, "--timeout=300s")
	stepDone := start(watchCtx, plugin, "deployguard", "rollout", "status", "deploy/web", "-n", ns, "--timeout=300s")
	stepJSONDone := start(watchCtx, plugin, "deployguard", "rollout", "status", "deployment/web", "-n", ns, "--timeout=300s", "-o", "json")

	kr, sr, jr := <-kubectlDone, <-stepDone, <-stepJSONDone
	var at time.Time
	select {
	case at = <-decided:
	case <-watchCtx.Done():
		require.FailNow(t, "the guard never declared the rollout failed", describe(get(ctx, t, ns, "web")))
	}

	// kubectl prints its own words; the condition carries the guard's.
	assert.NotZero(t, kr.Code, "bad deploy: kubectl rollout status must fail: %s", kr)
	assert.Contains(t, kr.Stderr, `deployment "web" exceeded its progress deadline`)
	assert.Less(t, kr.Ended.Sub(at), 30*time.Second, "kubectl fails within 30 s of the guard's decision")
	logMeasured(t, "kubectl rollout status", at, kr.Ended)

	assert.Equal(t, 1, sr.Code, "bad deploy: kubectl deployguard rollout status: %s", sr)
	assert.Contains(t, sr.Stderr, "ImagePullBackOff", "the guard's reason is in the output: %s", sr)
	// The step fails at the guard's first write, the declared failure, or at
	// the rollback just after it, as the JSON form below allows too.
	assert.True(t, strings.Contains(sr.Stderr, "Rolled back from revision 2") || strings.Contains(sr.Stderr, "has failed progressing"),
		"the step names the guard's decision: %s", sr)
	logMeasured(t, "kubectl deployguard rollout status", at, sr.Ended)

	assert.Equal(t, 1, jr.Code, "%s", jr)
	js := parseRollout(t, jr)
	assert.Equal(t, reconciler.RolloutFailed, js.Phase)
	assert.Contains(t, []string{vocab.ReasonAutoRollback, vocab.ProgressDeadlineExceeded}, js.Reason)
	assert.Contains(t, js.Message, "ImagePullBackOff")

	// Rolled back: upstream's status reads complete again, the guard's
	// verdict does not.
	var d = get(ctx, t, ns, "web")
	harness.WaitFor(t, time.Minute, "the rollback did not complete", func(ctx context.Context) (bool, string, error) {
		d = get(ctx, t, ns, "web")
		return d.Spec.Template.Spec.Containers[0].Image == goodImage && d.Status.UpdatedReplicas == 2 &&
			d.Status.AvailableReplicas == 2 && d.Status.Replicas == 2 && d.Status.ObservedGeneration == d.Generation, describe(d), nil
	})
	st := stalled(d)
	require.NotNil(t, st, "the Deployment keeps the guard's verdict: %s", describe(d))
	assert.Equal(t, corev1.ConditionTrue, st.Status)
	assert.Equal(t, vocab.ReasonAutoRollback, st.Reason)
	assert.Contains(t, st.Message, "ImagePullBackOff")
	assert.Contains(t, guardEvents(ctx, t, ns, "web"), "AutoRollback: "+d.Annotations[vocab.AnnotationRollbackStatus], "the Event carries the guard's reason")

	// kubectl lists the rolled-back Deployments by the guard's label.
	r = kubectl(ctx, "get", "deployments", "-n", ns, "-l", vocab.LabelRolledBack, "-o", "name")
	assert.Equal(t, "deployment.apps/web", strings.TrimSpace(r.Stdout), "%s", r)

	// A step started after the rollback still fails, naming the reason.
	r = command(ctx, plugin, "deployguard", "rollout", "status", "deploy/web", "-n", ns, "--timeout=60s", "-o", "json")
	assert.Equal(t, 1, r.Code, "after the rollback: %s", r)
	js = parseRollout(t, r)
	assert.Equal(t, vocab.ReasonAutoRollback, js.Reason)
	assert.Equal(t, "2", js.FailedRevision)

	builtin, customized = argoHealth(t, ns, "web")
	t.Logf("Argo CD after the rollback: built-in %s, with the guard's health check %s (%s)", builtin.Status, customized.Status, customized.Message)
	assert.Equal(t, "Healthy", builtin.Status, "Argo CD's built-in check cannot see the rollback: why the customization ships")
	assert.Equal(t, "Degraded", customized.Status, "Argo CD with the guard's health check")
	assert.Contains(t, customized.Message, "AutoRollback: Rolled back from revision 2")
	assert.Contains(t, customized.Message, "ImagePullBackOff")
	assertAlertFires(t, metricsBefore, scrapeGuard(t), "DeployGuardAutoRollback")

	// GitOps and pipelines apply the failed template again: refused, in the
	// guard's words.
	r = kubectl(ctx, "apply", "-f", bad)
	assert.NotZero(t, r.Code, "re-applying the quarantined template: %s", r)
	assert.Contains(t, r.Stderr, "failed its rollout before and deployguard rolled it back", "%s", r)

	// A fixed template rolls out and ends the verdict.
	fixed := writeFile(t, "fixed.yaml", webManifest(t, ns, "web", fixedImage))
	stale := staleVerdictWatch(ctx, t, ns, "web")
	r = kubectl(ctx, "apply", "-f", fixed)
	require.Zero(t, r.Code, "%s", r)
	r = command(ctx, plugin, "deployguard", "rollout", "status", "deploy/web", "-n", ns, "--timeout=120s")
	assert.Zero(t, r.Code, "fixed deploy: %s", r)
	r = kubectl(ctx, "rollout", "status", "deploy/web", "-n", ns, "--timeout=120s")
	assert.Zero(t, r.Code, "fixed deploy: %s", r)
	assert.Empty(t, stale(), "the fix was observed with the rolled-back revision's verdict on it")
	harness.WaitFor(t, 30*time.Second, "the verdict did not end with the fixed template", func(ctx context.Context) (bool, string, error) {
		d := get(ctx, t, ns, "web")
		_, labelled := d.Labels[vocab.LabelRolledBack]
		return stalled(d) == nil && !labelled, describe(d), nil
	})
}

// A person accepts the rollback: the Deployment reads as rolled out again.
func TestAcceptRollback(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := harness.NewNamespace(t, local.Client)
	plugin := filepath.Join(tools, "kubectl")

	require.Zero(t, kubectl(ctx, "apply", "-f", writeFile(t, "good.yaml", webManifest(t, ns, "web", goodImage))).Code)
	waitKnownGood(t, ns, "web")
	require.Zero(t, kubectl(ctx, "apply", "-f", writeFile(t, "bad.yaml", webManifest(t, ns, "web", badImage))).Code)
	r := command(ctx, plugin, "deployguard", "rollout", "status", "deploy/web", "-n", ns, "--timeout=180s")
	require.Equal(t, 1, r.Code, "%s", r)

	// Git reverted to the known-good template: applying it changes nothing
	// the guard can see, so the verdict stands…
	require.Zero(t, kubectl(ctx, "apply", "-f", writeFile(t, "good.yaml", webManifest(t, ns, "web", goodImage))).Code)
	r = command(ctx, plugin, "deployguard", "rollout", "status", "deploy/web", "-n", ns, "--timeout=60s")
	require.Equal(t, 1, r.Code, "%s", r)
	// …until accepted, with the command the message gives.
	require.Contains(t, r.Stderr, "kubectl annotate deployment -n "+ns+" web deployguard.io/accept-rollback=2")
	require.Zero(t, kubectl(ctx, "annotate", "deployment", "-n", ns, "web", "deployguard.io/accept-rollback=2").Code)
	r = command(ctx, plugin, "deployguard", "rollout", "status", "deploy/web", "-n", ns, "--timeout=60s")
	assert.Zero(t, r.Code, "accepted: %s", r)
}
