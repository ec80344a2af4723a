package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"

	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/test/harness"
)

// statusJSON is the part of `deployguard status -o json` the tests read.
type statusJSON struct {
	Deleted           bool   `json:"deleted"`
	Record            bool   `json:"record"`
	Revision          int64  `json:"revision"`
	KnownGoodRevision string `json:"knownGoodRevision"`
	ScaleUpStalled    string `json:"scaleUpStalled"`
	Revisions         []struct {
		Revision     int64    `json:"revision"`
		ReplicaSet   string   `json:"replicaSet"`
		TemplateHash string   `json:"templateHash"`
		Current      bool     `json:"current"`
		KnownGood    bool     `json:"knownGood"`
		Quarantined  bool     `json:"quarantined"`
		Images       []string `json:"images"`
		Failure      *struct {
			By, Reason, Message string
		} `json:"failure"`
	} `json:"revisions"`
	Quarantined []struct {
		Hash, Override string
	} `json:"quarantined"`
	Rollout struct{ State string } `json:"rollout"`
	Cleanup *struct {
		Deleting        bool
		PendingSteps    []string
		OtherFinalizers []string
	} `json:"cleanup"`
}

// kubectlDeployguard runs `kubectl deployguard ARGS…`: kubectl finds the guard
// binary on the PATH as the plugin kubectl-deployguard (a symlink, as the
// README tells users to install it).
func kubectlDeployguard(ctx context.Context, t *testing.T, args ...string) string {
	t.Helper()
	bin, err := harness.GuardBinary()
	require.NoError(t, err)
	tools, err := harness.ToolsDir("kubectl")
	require.NoError(t, err)
	plugins := t.TempDir()
	require.NoError(t, os.Symlink(bin, filepath.Join(plugins, "kubectl-deployguard")))
	cmd := exec.CommandContext(ctx, filepath.Join(tools, "kubectl"), append([]string{"deployguard"}, args...)...)
	cmd.Env = append(os.Environ(), "PATH="+plugins+string(os.PathListSeparator)+os.Getenv("PATH"), "KUBECONFIG="+local.Cluster.Kubeconfig)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	return string(out)
}

func statusOf(ctx context.Context, t *testing.T, ns, name string) (statusJSON, string) {
	t.Helper()
	out, err := guard(ctx, t, "status", ns+"/"+name, "-o", "json")
	require.NoError(t, err, out)
	var st statusJSON
	require.NoError(t, json.Unmarshal([]byte(out), &st), out)
	return st, kubectlDeployguard(ctx, t, "status", ns+"/"+name)
}

// After a real rollback, `deployguard status` (and `kubectl deployguard
// status`) shows the failed revision, why it failed, that its template is
// quarantined with the override to set, and the restored revision as current
// and known-good: for a fail-fast rollback and for a progress-deadline one.
func TestStatusAfterRollback(t *testing.T) {
	tests := []struct {
		name, by string
		d        func(ns string) *appsv1.Deployment
		breakIt  func(*appsv1.Deployment)
	}{
		{name: "fail-fast", by: "fail-fast", d: func(ns string) *appsv1.Deployment { return slowDeployment(ns, "web", "app:1") },
			breakIt: func(d *appsv1.Deployment) { d.Spec.Template.Spec.Containers[0].Image = "app:no-such-tag" }},
		{name: "progress deadline", by: "progress-deadline", d: func(ns string) *appsv1.Deployment { return harness.Deployment(ns, "web", "app:1", shortDeadline) },
			breakIt: breakImage("app:2")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			ns := harness.NewNamespace(t, local.Client)
			rolledOutOnce(t, tt.d(ns))
			require.NoError(t, update(t, ns, "web", tt.breakIt))
			harness.WaitFor(t, 90*time.Second, "not rolled back", func(ctx context.Context) (bool, string, error) {
				d := get(ctx, t, ns, "web")
				return rolledBackRevision(d) == 2, describe(d), nil
			})
			waitAvailable(t, ns, "web", time.Minute)
			waitKnownGood(t, ns, "web", 3)
			guardEvent(t, ns, "web", vocab.ReasonAutoRollback)

			st, text := statusOf(ctx, t, ns, "web")
			t.Logf("kubectl deployguard status %s/web:\n%s", ns, text)
			assert.Equal(t, int64(3), st.Revision)
			assert.Equal(t, "3", st.KnownGoodRevision)
			assert.Equal(t, "complete", st.Rollout.State)
			require.Len(t, st.Revisions, 2)
			failed, restored := st.Revisions[0], st.Revisions[1]
			assert.Equal(t, int64(2), failed.Revision)
			require.NotNil(t, failed.Failure, "the failed revision says why")
			assert.Equal(t, tt.by, failed.Failure.By)
			assert.Equal(t, vocab.ReasonAutoRollback, failed.Failure.Reason)
			assert.Contains(t, failed.Failure.Message, "Rolled back from revision 2 (ReplicaSet "+failed.ReplicaSet+")")
			assert.True(t, failed.Quarantined)
			assert.False(t, failed.Current)
			assert.Equal(t, int64(3), restored.Revision)
			assert.True(t, restored.Current)
			assert.True(t, restored.KnownGood)
			assert.Equal(t, []string{"app:1"}, restored.Images)

			quarantined := vocab.QuarantinedTemplates(get(ctx, t, ns, "web"))
			require.Len(t, st.Quarantined, 1)
			assert.Equal(t, quarantined, []string{st.Quarantined[0].Hash})
			assert.Equal(t, failed.TemplateHash, st.Quarantined[0].Hash)
			assert.Equal(t, vocab.AnnotationAllowTemplate+"="+failed.TemplateHash, st.Quarantined[0].Override)

			assert.Regexp(t, `(?m)^2\s+`+failed.ReplicaSet+`\s+0/0\s+failed \(`+tt.by+`\),quarantined\s`, text)
			assert.Regexp(t, `(?m)^3\s+`+restored.ReplicaSet+`\s+2/2\s+current,known-good,was 1\s+app:1\s`, text)
			assert.Contains(t, text, "apply it with the annotation "+vocab.AnnotationAllowTemplate+"="+failed.TemplateHash)
		})
	}
}

// A Deployment being deleted shows its cleanup: the guard's steps done, and
// another controller's finalizer still holding it; once gone, the record the
// guard kept and the command that restores it.
func TestStatusOfADeploymentBeingDeleted(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, local.Client)
	d := withCleanup(harness.Deployment(ns, "gone", "app:1", shortDeadline))
	d.Finalizers = []string{"example.com/hold"}
	require.NoError(t, local.Client.Create(ctx, d))
	waitAvailable(t, ns, "gone", time.Minute)

	st, text := statusOf(ctx, t, ns, "gone")
	require.NotNil(t, st.Cleanup)
	assert.False(t, st.Cleanup.Deleting)
	assert.Equal(t, []string{"record", "drain"}, st.Cleanup.PendingSteps)
	assert.Contains(t, text, "Cleanup on deletion: record, drain")

	require.NoError(t, local.Client.Delete(ctx, get(ctx, t, ns, "gone")))
	harness.WaitFor(t, time.Minute, "the guard's cleanup did not finish", func(ctx context.Context) (bool, string, error) {
		d := get(ctx, t, ns, "gone")
		return len(vocab.GuardFinalizers(d.Finalizers)) == 0, describe(d), nil
	})
	st, text = statusOf(ctx, t, ns, "gone")
	t.Logf("kubectl deployguard status %s/gone:\n%s", ns, text)
	require.NotNil(t, st.Cleanup)
	assert.True(t, st.Cleanup.Deleting)
	assert.Empty(t, st.Cleanup.PendingSteps)
	assert.Equal(t, []string{"example.com/hold"}, st.Cleanup.OtherFinalizers)
	assert.Contains(t, text, "the guard's cleanup is done")
	assert.Contains(t, text, "also waiting for other finalizers: example.com/hold")

	require.NoError(t, update(t, ns, "gone", func(d *appsv1.Deployment) { d.Finalizers = nil }))
	waitGone(t, ns, "gone", time.Minute)
	st, text = statusOf(ctx, t, ns, "gone")
	assert.True(t, st.Deleted)
	assert.True(t, st.Record)
	assert.Contains(t, text, "deployguard restore "+ns+"/gone")
}
