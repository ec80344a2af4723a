package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/test/harness"
	"github.com/deployguard/deployguard/webhook/audit"
)

// kubectlApply applies manifest with the cluster's kubectl and returns what
// it printed, warnings included: what a user sees.
func kubectlApply(ctx context.Context, t *testing.T, manifest string, args ...string) string {
	t.Helper()
	tools, err := harness.ToolsDir("kubectl")
	require.NoError(t, err)
	cmd := exec.CommandContext(ctx, filepath.Join(tools, "kubectl"), append([]string{"apply", "-f", "-"}, args...)...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+local.Cluster.Kubeconfig)
	cmd.Stdin = strings.NewReader(manifest)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Run(), "%s", out.String())
	return out.String()
}

// kubectlApplyWarned applies manifest once a server-side dry run of it
// carries warning: the guard reads budgets and Deployments from its caches,
// which see an object written by the previous command a moment later.
func kubectlApplyWarned(ctx context.Context, t *testing.T, manifest, warning string) string {
	t.Helper()
	harness.WaitFor(t, 30*time.Second, "the dry run never carried the warning", func(ctx context.Context) (bool, string, error) {
		out := kubectlApply(ctx, t, manifest, "--dry-run=server")
		return strings.Contains(out, warning), out, nil
	})
	return kubectlApply(ctx, t, manifest)
}

// drainJSON is the part of `deployguard status --drain NODE -o json` the test reads.
type drainJSON struct {
	Node    string `json:"node"`
	Blocked []struct {
		Namespace, Deployment, Reason string
		Pods, Budgets                 []string
		Never                         bool
	} `json:"blocked"`
}

// A singleton Deployment under a PodDisruptionBudget of minAvailable: 1 can
// never be evicted, so every drain of its node stops there (what charts ship
// by accident with replicas: 1). The guard says so where a user looks: kubectl
// prints the admission warning on the Deployment and on the budget; the audit
// reports it and re-checks when the Deployment is scaled through its scale
// subresource (as kubectl scale and an HPA do); `deployguard status --drain`
// lists it. The warning is proved true by the disruption controller of
// kube-controller-manager: the Eviction API answers 429 for the pod.
func TestBudgetThatBlocksEveryDrain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := harness.NewNamespace(t, local.Client)
	budget := func(minAvailable string) string {
		return fmt.Sprintf(`apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: single, namespace: %s}
spec:
  minAvailable: %s
  selector: {matchLabels: {app: single}}
`, ns, minAvailable)
	}
	// The budget first, as Helm orders them: no Deployment yet, nothing to say.
	out := kubectlApply(ctx, t, budget("1"))
	assert.NotContains(t, out, "Warning")
	replicasWarning := `Warning: spec.replicas: PodDisruptionBudget "single" (minAvailable: 1) allows no eviction of 1 pod of Deployment "single" (1 replica): no node that runs one of them can be drained`
	out = kubectlApplyWarned(ctx, t, fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata: {name: single, namespace: %s}
spec:
  replicas: 1
  selector: {matchLabels: {app: single}}
  template:
    metadata: {labels: {app: single}}
    spec:
      containers: [{name: app, image: "app:1"}]
`, ns), replicasWarning)
	assert.Contains(t, out, replicasWarning)
	assert.Contains(t, out, "raise replicas to 2 or more")
	// The budget rewritten as a percentage that still rounds up to every pod.
	minWarning := `Warning: spec.minAvailable: this budget (minAvailable: 50%) allows no eviction of the 1 pod of Deployment "single" (1 replica)`
	out = kubectlApplyWarned(ctx, t, budget(`"50%"`), minWarning)
	assert.Contains(t, out, minWarning)

	waitAvailable(t, ns, "single", time.Minute)
	var pdb policyv1.PodDisruptionBudget
	harness.WaitFor(t, time.Minute, "the disruption controller never counted the budget's pod", func(ctx context.Context) (bool, string, error) {
		if err := local.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "single"}, &pdb); err != nil {
			return false, "", err
		}
		s := pdb.Status
		return s.ObservedGeneration == pdb.Generation && s.ExpectedPods == 1 && s.CurrentHealthy == 1,
			fmt.Sprintf("%+v", s), nil
	})
	assert.Equal(t, int32(0), pdb.Status.DisruptionsAllowed)
	pod := podOf(ctx, t, ns, "single")

	// What the guard said is what the API server does.
	err := local.Client.SubResource("eviction").Create(ctx, pod, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: ns}})
	require.Error(t, err, "the pod was evicted")
	assert.True(t, apierrors.IsTooManyRequests(err), "eviction: want 429 Too Many Requests, got %v", err)

	out, err = guard(ctx, t, "status", "--drain", pod.Spec.NodeName, "-o", "json")
	require.NoError(t, err, out)
	var dr drainJSON
	require.NoError(t, json.Unmarshal([]byte(out), &dr), out)
	found := false
	for _, b := range dr.Blocked {
		if b.Namespace == ns && b.Deployment == "single" {
			found = true
			assert.Equal(t, []string{pod.Name}, b.Pods)
			assert.Equal(t, []string{"single"}, b.Budgets)
			assert.True(t, b.Never, "the budget never allows an eviction at 1 pod")
			assert.Contains(t, b.Reason, `PodDisruptionBudget "single" (minAvailable: 50%) allows no disruption now: 1 of 1 expected pods healthy, 1 must stay; it allows none even with every pod healthy`)
		}
	}
	assert.True(t, found, "status --drain %s does not list %s/single:\n%s", pod.Spec.NodeName, ns, out)
	text := kubectlDeployguard(ctx, t, "status", "--drain", pod.Spec.NodeName)
	assert.Contains(t, text, "Node "+pod.Spec.NodeName+": a drain would stop at")
	assert.Contains(t, text, ns)

	harness.WaitFor(t, time.Minute, "the audit never reported the budget", func(ctx context.Context) (bool, string, error) {
		r, ok := budgetResult(ctx, t, ns, "single")
		return ok && r.Result.Result == audit.ResultWarn, fmt.Sprintf("%+v", r), nil
	})

	// Scaled to 2 through the scale subresource (no admission of the
	// Deployment itself): the audit re-checks, and the drain goes through.
	scale := &autoscalingv1.Scale{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "single"}, Spec: autoscalingv1.ScaleSpec{Replicas: 2}}
	require.NoError(t, local.Client.SubResource("scale").Update(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "single"}}, client.WithSubResourceBody(scale)))
	harness.WaitFor(t, time.Minute, "the audit did not clear the finding after the scale", func(ctx context.Context) (bool, string, error) {
		r, ok := budgetResult(ctx, t, ns, "single")
		return !ok, fmt.Sprintf("%+v", r), nil
	})
	waitAvailable(t, ns, "single", time.Minute)
	harness.WaitFor(t, time.Minute, "the budget never allowed a disruption at 2 pods", func(ctx context.Context) (bool, string, error) {
		if err := local.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "single"}, &pdb); err != nil {
			return false, "", err
		}
		return pdb.Status.DisruptionsAllowed == 1, fmt.Sprintf("%+v", pdb.Status), nil
	})
	out, err = guard(ctx, t, "status", "--drain", pod.Spec.NodeName, "-o", "json")
	require.NoError(t, err, out)
	assert.NotContains(t, out, `"namespace": "`+ns+`"`)
	require.NoError(t, local.Client.SubResource("eviction").Create(ctx, pod, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: ns}}),
		"the eviction of one of two pods under minAvailable 50%")
}

// podOf returns the one running pod of Deployment name.
func podOf(ctx context.Context, t *testing.T, ns, name string) *corev1.Pod {
	t.Helper()
	var pods corev1.PodList
	require.NoError(t, local.Client.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{"app": name}))
	require.Len(t, pods.Items, 1)
	require.NotEmpty(t, pods.Items[0].Spec.NodeName)
	return &pods.Items[0]
}

// budgetResult is the audit report's drain result for Deployment name, if any.
func budgetResult(ctx context.Context, t *testing.T, ns, name string) (audit.StoredResult, bool) {
	t.Helper()
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("wgpolicyk8s.io/v1alpha2")
	u.SetKind("PolicyReport")
	if err := local.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: audit.ReportName}, u); err != nil {
		return audit.StoredResult{}, false
	}
	for _, r := range audit.Parse(u).Results {
		if r.Rule == "disruption-budget" && r.Resource.Name == name {
			return r, true
		}
	}
	return audit.StoredResult{}, false
}
