package node

// The tests of this file change the guard itself: they run after the others
// (Go runs a package's tests file by file, in name order, and TestRealPods
// returns once its parallel subtests are done).

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/test/harness"
	"github.com/deployguard/deployguard/test/image"
)

// pushNextGuard pushes the guard's image again as tag next, with a label
// that makes it a new image (a new digest): what a release upgrade pulls.
func pushNextGuard(ctx context.Context, t *testing.T) string {
	t.Helper()
	idx, err := layout.ImageIndexFromPath(filepath.Join(harness.RepoRoot(), "bin", "image", image.GuardRepository))
	require.NoError(t, err)
	m, err := idx.IndexManifest()
	require.NoError(t, err)
	require.NotEmpty(t, m.Manifests)
	img, err := idx.Image(m.Manifests[0].Digest)
	require.NoError(t, err)
	cf, err := img.ConfigFile()
	require.NoError(t, err)
	cfg := cf.Config.DeepCopy()
	if cfg.Labels == nil {
		cfg.Labels = map[string]string{}
	}
	cfg.Labels["io.deployguard.test.release"] = "next"
	next, err := mutate.Config(img, *cfg)
	require.NoError(t, err)
	ref, err := name.NewTag(harness.Registry+"/"+image.GuardRepository+":next", name.Insecure)
	require.NoError(t, err)
	require.NoError(t, remote.Write(ref, next, remote.WithContext(ctx)))
	return ref.String()
}

// `helm upgrade` to a new guard image while the API server admits a steady
// stream of Deployments: every request is judged by the guard (a refusal it
// must make) and none fails, and the API server never fails open.
func TestHelmUpgradeUnderLoadFailsNoRequest(t *testing.T) {
	ctx := context.Background()
	next := pushNextGuard(ctx, t)
	ns := harness.NewNamespace(t, cl)
	base := app(ns, "base", "v1")
	require.NoError(t, cl.Create(ctx, base))
	failOpenBefore := webhookFailOpen(ctx, t)

	// Each request: a create of a Deployment whose selector overlaps
	// base's, which only the guard refuses (its webhook; no native policy
	// can see other objects). A call that failed would be let through
	// (failurePolicy Ignore on creates) and counted. Dry-run: nothing is
	// stored.
	var sent, refusedByGuard atomic.Int64
	var mu sync.Mutex
	var failures []string
	loadCtx, stopLoad := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; loadCtx.Err() == nil; i++ {
				d := app(ns, fmt.Sprintf("copy-%d-%d", w, i), "v1")
				d.Spec.Selector, d.Spec.Template.Labels = base.Spec.Selector, base.Spec.Template.Labels
				err := cl.Create(loadCtx, d, client.DryRunAll)
				if loadCtx.Err() != nil {
					return
				}
				sent.Add(1)
				switch {
				case err != nil && strings.Contains(err.Error(), `this selector also selects the pods of Deployment "base"`):
					refusedByGuard.Add(1)
				case err == nil:
					mu.Lock()
					failures = append(failures, "admitted: the guard was not asked (the API server failed open)")
					mu.Unlock()
				default:
					mu.Lock()
					failures = append(failures, err.Error())
					mu.Unlock()
				}
			}
		}()
	}
	start := time.Now()
	r := helm(ctx, "upgrade", release, chartDir(), "-n", harness.GuardNamespace, "--reuse-values",
		"--set", "image.tag=next", "--wait", "--timeout", "4m")
	took := time.Since(start)
	// The old replicas' shutdown ends after helm's wait: keep the load on
	// until every replica runs the new image and no old one is left.
	harness.WaitFor(t, 3*time.Minute, "the old guard replicas never went", func(ctx context.Context) (bool, string, error) {
		var d appsv1.Deployment
		if err := cl.Get(ctx, client.ObjectKey{Namespace: harness.GuardNamespace, Name: "deployguard"}, &d); err != nil {
			return false, err.Error(), nil
		}
		images := guardImages(ctx, t)
		onlyNext := len(images) > 0
		for _, img := range images {
			onlyNext = onlyNext && img == next
		}
		return completed(&d) && onlyNext, fmt.Sprintf("replicas %d updated %d available %d, pods' images %v",
			d.Status.Replicas, d.Status.UpdatedReplicas, d.Status.AvailableReplicas, images), nil
	})
	stopLoad()
	wg.Wait()
	require.Zero(t, r.Code, "helm upgrade: %s", r)
	t.Logf("helm upgrade to %s took %s; %d admissions during it, %d refused by the guard, %d failed", next, took.Round(time.Second), sent.Load(), refusedByGuard.Load(), len(failures))
	assert.Empty(t, failures, "no admission failed during the upgrade")
	assert.Greater(t, sent.Load(), int64(50), "the load ran")
	assert.Equal(t, failOpenBefore, webhookFailOpen(ctx, t), "the API server never failed open on the guard's webhooks")

}

// webhookFailOpen is kube-apiserver's count of calls to the guard's webhooks
// that failed and were let through (failurePolicy Ignore).
func webhookFailOpen(ctx context.Context, t *testing.T) float64 {
	t.Helper()
	r := kubectl(ctx, "get", "--raw", "/metrics")
	require.Zero(t, r.Code, r.String())
	var sum float64
	for _, line := range strings.Split(r.Stdout, "\n") {
		if strings.HasPrefix(line, "apiserver_admission_webhook_fail_open_count{") && strings.Contains(line, "deployguard") {
			var v float64
			if _, err := fmt.Sscanf(line[strings.LastIndex(line, " ")+1:], "%g", &v); err == nil {
				sum += v
			}
		}
	}
	return sum
}

// `deployguard uninstall`, then `helm uninstall`, as the docs say: no
// webhook, no native policy, no finalizer and no rollback verdict is left
// behind, and the guard's pods go.
func TestUninstallLeavesNothing(t *testing.T) {
	ctx := context.Background()
	bin, err := harness.GuardBinary()
	require.NoError(t, err)
	r := command(ctx, bin, "uninstall")
	t.Logf("deployguard uninstall: %s", r)
	require.Zero(t, r.Code, r.String())
	r = helm(ctx, "uninstall", release, "-n", harness.GuardNamespace, "--wait", "--timeout", "2m")
	t.Logf("helm uninstall: %s", r)
	require.Zero(t, r.Code, r.String())

	var mutating admissionregistrationv1.MutatingWebhookConfigurationList
	require.NoError(t, cl.List(ctx, &mutating))
	var validating admissionregistrationv1.ValidatingWebhookConfigurationList
	require.NoError(t, cl.List(ctx, &validating))
	var vap admissionregistrationv1.ValidatingAdmissionPolicyList
	require.NoError(t, cl.List(ctx, &vap))
	var vapb admissionregistrationv1.ValidatingAdmissionPolicyBindingList
	require.NoError(t, cl.List(ctx, &vapb))
	var map_ admissionregistrationv1.MutatingAdmissionPolicyList
	require.NoError(t, cl.List(ctx, &map_))
	var left []string
	for _, c := range mutating.Items {
		left = append(left, "MutatingWebhookConfiguration "+c.Name)
	}
	for _, c := range validating.Items {
		left = append(left, "ValidatingWebhookConfiguration "+c.Name)
	}
	for _, p := range vap.Items {
		left = append(left, "ValidatingAdmissionPolicy "+p.Name)
	}
	for _, b := range vapb.Items {
		left = append(left, "ValidatingAdmissionPolicyBinding "+b.Name)
	}
	for _, p := range map_.Items {
		left = append(left, "MutatingAdmissionPolicy "+p.Name)
	}
	var deployments appsv1.DeploymentList
	require.NoError(t, cl.List(ctx, &deployments))
	for _, d := range deployments.Items {
		if f := guardFinalizers(&d); len(f) > 0 {
			left = append(left, fmt.Sprintf("Deployment %s/%s finalizers %v", d.Namespace, d.Name, f))
		}
		if _, ok := d.Labels[vocab.LabelRolledBack]; ok {
			left = append(left, fmt.Sprintf("Deployment %s/%s label %s", d.Namespace, d.Name, vocab.LabelRolledBack))
		}
	}
	assert.Empty(t, left, "what the guard left behind")
	harness.WaitFor(t, 2*time.Minute, "the guard's pods never went", func(ctx context.Context) (bool, string, error) {
		pods := guardPods(ctx, t)
		return len(pods) == 0, fmt.Sprintf("%d pods", len(pods)), nil
	})
}

// guardFinalizers are d's finalizers of the guard.
func guardFinalizers(d *appsv1.Deployment) []string {
	var out []string
	for _, f := range d.Finalizers {
		if strings.Contains(f, "deployguard.io") {
			out = append(out, f)
		}
	}
	return out
}
