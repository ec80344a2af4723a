// Package clients deploys through the tools that really deploy (kubectl,
// `kubectl deployguard rollout status`, helm v3 and v4, Flux's
// kustomize-controller, Argo CD's health assessment) on a full local cluster
// with the guard, and asserts what each of them reports for a good deploy and
// for a bad one that the guard rolls back: a rolled-back revision must never
// read as deployed.
package clients

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/test/harness"
)

// guardConfig shortens fail-fast's window so that a bad deploy is rolled
// back within seconds; everything else is the default install.
const guardConfig = `apiVersion: deployguard.io/v1alpha1
kind: GuardConfig
rollback:
  failFast: {window: 15s}
`

// Images: the local cluster's kwok stages put pods of a "no-such" tag in
// ImagePullBackOff (test/harness/stages/image-pull-backoff.yaml) and run
// every other.
const (
	goodImage  = "nginx:1.27"
	fixedImage = "nginx:1.28"
	badImage   = "nginx:no-such-tag"
)

var (
	local *harness.Local
	// tools is the control plane's folder (kubectl, helm, helm4); bin holds
	// deployguard and its kubectl plugin name.
	tools, bin string
)

func TestMain(m *testing.M) {
	os.Exit(harness.RunTier(m, harness.TierOptions{
		Name:  "clients",
		Tools: []string{"kube-apiserver", "kubectl", "kwokctl", "helm", "helm4"},
		Local: &harness.LocalOptions{Nodes: 2, GuardConfig: guardConfig},
		Setup: func(_ context.Context, tier *harness.Tier) error {
			local, tools, bin = tier.Local, tier.Tools, filepath.Dir(tier.Guard)
			if _, err := os.Stat(filepath.Join(bin, "kubectl-deployguard")); err != nil {
				return fmt.Errorf("the kubectl plugin is missing beside %s: run `make build`", tier.Guard)
			}
			return nil
		},
	}))
}

// result is how a command ended.
type result struct {
	Code   int
	Stdout string
	Stderr string
	// Ended is when it exited.
	Ended time.Time
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\n--- stdout ---\n%s--- stderr ---\n%s", r.Code, r.Stdout, r.Stderr)
}

// command runs a client as a user's shell would: the admin kubeconfig in
// $KUBECONFIG and the guard's binaries (the kubectl plugin among them) first
// on $PATH.
func command(ctx context.Context, name string, args ...string) result {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(),
		"KUBECONFIG="+local.Cluster.Kubeconfig,
		"PATH="+bin+string(os.PathListSeparator)+tools+string(os.PathListSeparator)+os.Getenv("PATH"),
		// helm keeps its caches and repositories out of the user's home.
		"HELM_CACHE_HOME="+filepath.Join(local.Opts.WorkDir, "helm", "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(local.Opts.WorkDir, "helm", "config"),
		"HELM_DATA_HOME="+filepath.Join(local.Opts.WorkDir, "helm", "data"),
	)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{Stdout: stdout.String(), Stderr: stderr.String(), Ended: time.Now()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.Code = ee.ExitCode()
	case err != nil:
		r.Code, r.Stderr = -1, r.Stderr+err.Error()
	}
	return r
}

func kubectl(ctx context.Context, args ...string) result {
	return command(ctx, filepath.Join(tools, "kubectl"), args...)
}

// start runs command in the background; the channel gets its result.
func start(ctx context.Context, name string, args ...string) <-chan result {
	ch := make(chan result, 1)
	go func() { ch <- command(ctx, name, args...) }()
	return ch
}

// webManifest is harness.Deployment as a team writes it for kubectl apply.
func webManifest(t *testing.T, ns, name, image string) string {
	t.Helper()
	d := harness.Deployment(ns, name, image)
	d.TypeMeta = metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"}
	b, err := yaml.Marshal(d)
	require.NoError(t, err)
	return string(b)
}

// writeFile writes content to a file of the test's own.
func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
	return p
}

func get(ctx context.Context, t *testing.T, ns, name string) *appsv1.Deployment {
	t.Helper()
	d := &appsv1.Deployment{}
	require.NoError(t, local.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, d))
	return d
}

// waitKnownGood waits until the guard's ledger records the Deployment's
// current revision as its newest known-good one: a later bad deploy then has
// somewhere to go back.
func waitKnownGood(t *testing.T, ns, name string) {
	t.Helper()
	harness.WaitFor(t, 2*time.Minute, "the guard did not record a known-good revision", func(ctx context.Context) (bool, string, error) {
		d := get(ctx, t, ns, name)
		l, _ := rollout.ReadLedger(d)
		n := l.Newest()
		return n != nil && strconv.FormatInt(n.Revision, 10) == d.Annotations[vocab.RevisionAnnotation], describe(d), nil
	})
}

// decisionWatch records, from the outside, when the guard decided that the
// Deployment's rollout failed: the first time its status shows the guard's
// declaration or its Stalled verdict.
func decisionWatch(ctx context.Context, t *testing.T, ns, name string) <-chan time.Time {
	t.Helper()
	ch := make(chan time.Time, 1)
	go func() {
		_ = wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			d := &appsv1.Deployment{}
			if err := local.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, d); err != nil {
				return false, nil
			}
			for _, c := range d.Status.Conditions {
				if (c.Type == vocab.ConditionStalled && c.Status == corev1.ConditionTrue) ||
					(c.Type == appsv1.DeploymentProgressing && c.Reason == vocab.ProgressDeadlineExceeded) {
					ch <- time.Now()
					return true, nil
				}
			}
			return false, nil
		})
	}()
	return ch
}

func describe(d *appsv1.Deployment) string {
	var cs []string
	for _, c := range d.Status.Conditions {
		cs = append(cs, fmt.Sprintf("%s=%s/%s %q", c.Type, c.Status, c.Reason, c.Message))
	}
	return fmt.Sprintf("generation %d observed %d, replicas %d updated %d available %d, conditions %v",
		d.Generation, d.Status.ObservedGeneration, d.Status.Replicas, d.Status.UpdatedReplicas, d.Status.AvailableReplicas, cs)
}

func stalled(d *appsv1.Deployment) *appsv1.DeploymentCondition {
	for i := range d.Status.Conditions {
		if d.Status.Conditions[i].Type == vocab.ConditionStalled {
			return &d.Status.Conditions[i]
		}
	}
	return nil
}

// guardEvents are the guard's events about a Deployment, as "Reason: note".
func guardEvents(ctx context.Context, t *testing.T, ns, name string) []string {
	t.Helper()
	var list eventsv1.EventList
	require.NoError(t, local.Client.List(ctx, &list, client.InNamespace(ns)))
	var out []string
	for _, e := range list.Items {
		if e.Regarding.Kind == "Deployment" && e.Regarding.Name == name && strings.Contains(e.ReportingController, "deployguard") {
			out = append(out, e.Reason+": "+e.Note)
		}
	}
	return out
}

// measured collects, for the note, how long each tool took to fail after the
// guard's decision.
func logMeasured(t *testing.T, tool string, decided, ended time.Time) {
	t.Helper()
	t.Logf("MEASURED %s: failed %.1fs after the guard's decision", tool, ended.Sub(decided).Seconds())
}

// staleVerdictWatch watches Deployment ns/name from now on, and returns a
// function that stops the watch and lists every state it saw in which a
// generation later than now's is observed with the guard's rollback verdict
// still on it: a deploying tool reading that state reads the new spec as
// failed; and a watch that ended early, or failed. The watch sees every
// state the API server stores, which a poll could miss.
func staleVerdictWatch(ctx context.Context, t *testing.T, ns, name string) (stop func() []string) {
	t.Helper()
	cfg, err := local.Cluster.RESTConfig()
	require.NoError(t, err)
	wc, err := client.NewWithWatch(cfg, client.Options{Scheme: local.Scheme})
	require.NoError(t, err)
	d := &appsv1.Deployment{}
	require.NoError(t, local.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, d))
	ctx, cancel := context.WithCancel(ctx)
	w, err := wc.Watch(ctx, &appsv1.DeploymentList{}, client.InNamespace(ns),
		client.MatchingFields{"metadata.name": name}, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: d.ResourceVersion}})
	require.NoError(t, err)
	var (
		stale    []string
		stopping atomic.Bool
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() {
			if !stopping.Load() {
				stale = append(stale, "the watch ended before the deploy did: not every state was seen")
			}
		}()
		for ev := range w.ResultChan() {
			if ev.Type == watch.Error {
				if !stopping.Load() { // stopping it ends the stream with an error
					stale = append(stale, fmt.Sprintf("the watch failed: %v", ev.Object))
				}
				continue
			}
			got, ok := ev.Object.(*appsv1.Deployment)
			if !ok || got.Generation <= d.Generation || got.Status.ObservedGeneration != got.Generation {
				continue
			}
			if c := stalled(got); c != nil && c.Reason == vocab.ReasonAutoRollback {
				stale = append(stale, fmt.Sprintf("resourceVersion %s: %s", got.ResourceVersion, describe(got)))
			}
		}
	}()
	return func() []string {
		stopping.Store(true)
		w.Stop()
		cancel()
		<-done
		return stale
	}
}
