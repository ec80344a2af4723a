// Package e2e runs the guard end to end on a full local cluster: a real
// kube-apiserver, kube-controller-manager (Deployments roll out for real) and
// kube-scheduler, nodes and pods simulated by kwok, and the deployguard binary
// running under its own service account with the deployed RBAC and webhooks.
package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/analysis/checks"
	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/test/harness"
)

// guardConfig is the tier's guard configuration, which
// `make bench-reaction` measures with too.
const guardConfig = harness.E2EGuardConfig

// deadline is the progressDeadlineSeconds of the tests' Deployments.
const deadline = 4

var (
	tier  *harness.Tier
	local *harness.Local
)

// promStub is the Prometheus the guard's metric checks query: the stand-in
// of test/tools/promql, started before the cluster (its URL is in the
// guard's config) and fed by the checks' tests.
var promStub *harness.PromStub

func TestMain(m *testing.M) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	stubLog := filepath.Join(os.TempDir(), fmt.Sprintf("deployguard-e2e-promql-%d.log", os.Getpid()))
	stub, err := harness.LaunchPromStub(ctx, stubLog)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	promStub = stub
	code := harness.RunTier(m, harness.TierOptions{
		Name: "e2e",
		Local: &harness.LocalOptions{
			Nodes: 2, GuardConfig: guardConfig + checksConfig(stub.URL()), ClientAuth: true,
			// The audit's report CRDs and the metric checks', as make run
			// and config/ install them.
			CRDs: []string{filepath.Join(harness.RepoRoot(), "config", "crd", "policyreport"), filepath.Join(harness.RepoRoot(), "config", "crd", "checks")},
		},
		Setup: func(_ context.Context, tr *harness.Tier) error {
			tier, local = tr, tr.Local
			return checks.AddToScheme(local.Scheme)
		},
	})
	_ = stub.Stop()
	if code == 0 {
		_ = os.Remove(stubLog) // kept when the tier fails, with the tier's work folder
	}
	os.Exit(code)
}

// checksConfig points the guard's metric checks at url, with the checks'
// default bake window short enough for the tests.
func checksConfig(url string) string {
	return fmt.Sprintf("checks:\n  prometheus: {url: %q}\n  bakeWindow: 4s\n", url)
}

// shortDeadline is the tests' Deployments' progress deadline, so that a
// stuck rollout fails within seconds.
var shortDeadline = harness.ProgressDeadline(deadline)

// breakTemplate makes a template whose pods can never be scheduled, so its
// rollout never progresses: the classic stuck rollout.
func breakTemplate(t *corev1.PodTemplateSpec, image string) {
	t.Spec.Containers[0].Image = image
	t.Spec.NodeSelector = map[string]string{"deployguard.io/e2e": "no-such-node"}
}

func ptr[T any](v T) *T { return &v }

func get(ctx context.Context, t *testing.T, ns, name string) *appsv1.Deployment {
	t.Helper()
	d := &appsv1.Deployment{}
	require.NoError(t, local.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, d))
	return d
}

func condition(d *appsv1.Deployment, typ appsv1.DeploymentConditionType) *appsv1.DeploymentCondition {
	for i := range d.Status.Conditions {
		if d.Status.Conditions[i].Type == typ {
			return &d.Status.Conditions[i]
		}
	}
	return nil
}

func describe(d *appsv1.Deployment) string {
	var cs []string
	for _, c := range d.Status.Conditions {
		cs = append(cs, fmt.Sprintf("%s=%s/%s", c.Type, c.Status, c.Reason))
	}
	ledger := ""
	if c := condition(d, vocab.ConditionLedger); c != nil {
		ledger = c.Message
	}
	return fmt.Sprintf("generation %d observed %d, replicas %d updated %d available %d, conditions %v, annotations %v, ledger %s",
		d.Generation, d.Status.ObservedGeneration, d.Status.Replicas, d.Status.UpdatedReplicas, d.Status.AvailableReplicas, cs, guardAnnotations(d), ledger)
}

// knownGoodRevision is the revision of the newest known-good ReplicaSet in
// the guard's ledger on d (its status), 0 when there is none.
func knownGoodRevision(d *appsv1.Deployment) int64 {
	l, _ := rollout.ReadLedger(d)
	if n := l.Newest(); n != nil {
		return n.Revision
	}
	return 0
}

// rolledBackRevision is the failed revision the guard's ledger on d says it
// rolled back from, 0 when it rolled back none.
func rolledBackRevision(d *appsv1.Deployment) int64 {
	l, _ := rollout.ReadLedger(d)
	return l.RolledBackRevision
}

func guardAnnotations(d *appsv1.Deployment) map[string]string {
	out := map[string]string{}
	for k, v := range d.Annotations {
		if strings.HasPrefix(k, "deployguard.io/") {
			out[k] = v
		}
	}
	return out
}

// waitAvailable waits until the Deployment's current generation completed.
func waitAvailable(t *testing.T, ns, name string, timeout time.Duration) *appsv1.Deployment {
	t.Helper()
	var d *appsv1.Deployment
	harness.WaitFor(t, timeout, fmt.Sprintf("Deployment %s/%s did not complete its rollout", ns, name), func(ctx context.Context) (bool, string, error) {
		d = get(ctx, t, ns, name)
		p := condition(d, appsv1.DeploymentProgressing)
		done := d.Status.ObservedGeneration == d.Generation && p != nil && p.Reason == "NewReplicaSetAvailable" &&
			d.Status.UpdatedReplicas == *d.Spec.Replicas && d.Status.AvailableReplicas == *d.Spec.Replicas && d.Status.Replicas == *d.Spec.Replicas
		return done, describe(d), nil
	})
	return d
}

// waitEvents waits until the guard's events about a Deployment include each of
// want at least as often as it is listed (the recorder writes events
// asynchronously, so they may land after the change they tell of), and returns
// all the reasons.
func waitEvents(t *testing.T, ns, name string, want ...string) []string {
	t.Helper()
	var reasons []string
	harness.WaitFor(t, 15*time.Second, fmt.Sprintf("events %v about %s/%s", want, ns, name), func(ctx context.Context) (bool, string, error) {
		reasons = harness.GuardEventReasons(ctx, t, local.Client, ns, name)
		need := map[string]int{}
		for _, w := range want {
			need[w]++
		}
		for r, n := range need {
			got := 0
			for _, x := range reasons {
				if x == r {
					got++
				}
			}
			if got < n {
				return false, fmt.Sprint(reasons), nil
			}
		}
		return true, "", nil
	})
	return reasons
}
