package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/test/harness"
)

// release is the Helm release of the guard, installed as the chart's README
// says.
const release = "deployguard"

func chartDir() string { return filepath.Join(harness.RepoRoot(), "config", "helm", "deployguard") }

// result is a command's outcome, as a user reads it.
type result struct {
	Code           int
	Stdout, Stderr string
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\n--- stdout ---\n%s--- stderr ---\n%s", r.Code, r.Stdout, r.Stderr)
}

// command runs a client (kubectl, helm, the guard's CLI) against the node's
// cluster, with Helm's state in the tier's folder.
func command(ctx context.Context, bin string, args ...string) result {
	cmd := exec.CommandContext(ctx, bin, args...)
	helm := filepath.Join(tierDir, "helm")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+node.Kubeconfig,
		"HELM_CACHE_HOME="+filepath.Join(helm, "cache"), "HELM_CONFIG_HOME="+filepath.Join(helm, "config"), "HELM_DATA_HOME="+filepath.Join(helm, "data"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{Stdout: stdout.String(), Stderr: stderr.String()}
	if err != nil {
		r.Code = -1
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			r.Code = ee.ExitCode()
		} else {
			r.Stderr += err.Error()
		}
	}
	return r
}

func kubectl(ctx context.Context, args ...string) result {
	return command(ctx, filepath.Join(node.Tools, "kubectl"), args...)
}

func helm(ctx context.Context, args ...string) result {
	return command(ctx, filepath.Join(node.Tools, "helm"), args...)
}

// helmInstall installs the chart as its README says, with the guard's image
// from the registry, and waits for it.
func helmInstall(ctx context.Context, tier *harness.Tier) error {
	start := time.Now()
	r := helm(ctx, "install", release, chartDir(), "-n", harness.GuardNamespace, "--create-namespace",
		"--set", "image.repository="+harness.Registry+"/deployguard", "--wait", "--timeout", "4m")
	fmt.Fprintf(tier.Log, "helm install: %s\n", r)
	if r.Code != 0 {
		return fmt.Errorf("helm install of the chart: %s", r)
	}
	fmt.Fprintf(tier.Log, "the guard installed by helm and Ready in %s\n", time.Since(start).Round(time.Second))
	return nil
}

// The guard runs from its own image, pulled from the registry, on the real
// node; the API server calls it through its Service, with the certificate
// cert-manager issued and the CA cainjector injected.
func TestInstalledByHelmServesThroughItsService(t *testing.T) {
	ctx := context.Background()
	pods := guardPods(ctx, t)
	require.NotEmpty(t, pods)
	for _, p := range pods {
		assert.Equal(t, harness.NodeName, p.Spec.NodeName)
		require.NotEmpty(t, p.Status.ContainerStatuses, p.Name)
		cs := p.Status.ContainerStatuses[0]
		assert.True(t, cs.Ready, "%s is Ready", p.Name)
		assert.Equal(t, guardImage, cs.Image, "%s runs the guard's image from the registry", p.Name)
		assert.NotEmpty(t, cs.ImageID)
	}

	var mutating admissionregistrationv1.MutatingWebhookConfigurationList
	require.NoError(t, cl.List(ctx, &mutating))
	var validating admissionregistrationv1.ValidatingWebhookConfigurationList
	require.NoError(t, cl.List(ctx, &validating))
	seen := 0
	check := func(config, webhook string, cc admissionregistrationv1.WebhookClientConfig) {
		if !strings.HasPrefix(config, "deployguard") {
			return
		}
		seen++
		assert.Nil(t, cc.URL, "%s/%s: the chart's service reference, not a URL", config, webhook)
		if assert.NotNil(t, cc.Service, "%s/%s", config, webhook) {
			assert.Equal(t, harness.GuardNamespace, cc.Service.Namespace)
		}
		assert.NotEmpty(t, cc.CABundle, "%s/%s: the CA injected by cainjector", config, webhook)
	}
	for _, c := range mutating.Items {
		for _, w := range c.Webhooks {
			check(c.Name, w.Name, w.ClientConfig)
		}
	}
	for _, c := range validating.Items {
		for _, w := range c.Webhooks {
			check(c.Name, w.Name, w.ClientConfig)
		}
	}
	assert.NotZero(t, seen, "the chart's webhook configurations")

	// What kubectl says, through that path.
	ns := harness.NewNamespace(t, cl)
	first := app(ns, "web", "v1")
	r := apply(ctx, t, first)
	t.Logf("kubectl apply: %s", r)
	require.Zero(t, r.Code, r.String())

	// A refusal: a selector that overlaps web's.
	overlap := app(ns, "web-copy", "v1")
	overlap.Spec.Selector = first.Spec.Selector
	overlap.Spec.Template.Labels = first.Spec.Template.Labels
	r = apply(ctx, t, overlap)
	t.Logf("kubectl apply of an overlapping selector: %s", r)
	assert.NotZero(t, r.Code, "refused")
	assert.Contains(t, r.Stderr, `The Deployment "web-copy" is invalid: spec.selector`)
	assert.Contains(t, r.Stderr, `this selector also selects the pods of Deployment "web"`)

	// A repair: no selector at all; the guard derives it from the
	// template's stable label and says so.
	repaired := app(ns, "api", "v1")
	repaired.Spec.Selector = nil
	r = apply(ctx, t, repaired)
	t.Logf("kubectl apply without a selector: %s", r)
	require.Zero(t, r.Code, r.String())
	assert.Contains(t, r.Stderr, "Warning: spec.selector")
	got, err := get(ctx, ns, "api")
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"app.kubernetes.io/name": "api"}, got.Spec.Selector.MatchLabels)

	// A warning: a container without a readiness probe (the probes
	// policy advises by default).
	unprobed := app(ns, "worker", "v1")
	unprobed.Spec.Template.Spec.Containers[0].ReadinessProbe = nil
	r = apply(ctx, t, unprobed)
	t.Logf("kubectl apply without a readiness probe: %s", r)
	require.Zero(t, r.Code, r.String())
	assert.Contains(t, r.Stderr, "Warning:")
	assert.Contains(t, r.Stderr, "readinessProbe")
}

// apply runs kubectl apply of d, as a user does, and returns what kubectl
// printed.
func apply(ctx context.Context, t *testing.T, d *appsv1.Deployment) result {
	t.Helper()
	d.APIVersion, d.Kind = "apps/v1", "Deployment"
	f := filepath.Join(t.TempDir(), d.Name+".yaml")
	b, err := yamlOf(d)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(f, b, 0o644))
	return kubectl(ctx, "apply", "-f", f)
}

// guardPods are the guard's pods in its namespace.
func guardPods(ctx context.Context, t *testing.T) []corev1.Pod {
	t.Helper()
	var pods corev1.PodList
	require.NoError(t, cl.List(ctx, &pods, client.InNamespace(harness.GuardNamespace), client.MatchingLabels{"app.kubernetes.io/name": "deployguard"}))
	return pods.Items
}

// guardImages are the images the guard's pods run, terminating ones
// included.
func guardImages(ctx context.Context, t *testing.T) []string {
	t.Helper()
	var out []string
	for _, p := range guardPods(ctx, t) {
		for _, c := range p.Spec.Containers {
			out = append(out, c.Image)
		}
	}
	return out
}
