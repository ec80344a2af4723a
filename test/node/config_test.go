package node

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/test/harness"
)

// configChart is a release of the test app reading its one setting from a
// ConfigMap, with Helm's checksum annotation: a config change is a rollout.
var configChart = filepath.Join(harness.RepoRoot(), "test", "node", "testdata", "configapp")

// installConfigApp installs the release with a good config and waits for it
// to be recorded known-good (by the guard, where it runs).
func installConfigApp(ctx context.Context, t *testing.T, ns, rel string, guarded bool) {
	t.Helper()
	r := helm(ctx, "install", rel, configChart, "-n", ns, "--wait", "--timeout", "3m")
	require.Zero(t, r.Code, "helm install: %s", r)
	if guarded {
		waitDeployment(t, ns, rel, "revision 1 was not recorded known-good", 2*time.Minute, func(l rollout.Ledger, d *appsv1.Deployment) bool {
			n := l.Newest()
			return n != nil && n.Revision == 1 && len(n.Config) == 1 && completed(d)
		})
	}
}

// restartOnePod deletes one Ready pod of the Deployment, as a node drain or
// an eviction does, and returns the state of its replacement once it has
// either become Ready or failed to start: whether the config the template
// reads now lets a pod start.
func restartOnePod(ctx context.Context, t *testing.T, ns, name string) (ready bool, state string) {
	t.Helper()
	d, err := get(ctx, ns, name)
	require.NoError(t, err)
	var pods corev1.PodList
	require.NoError(t, cl.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels(d.Spec.Selector.MatchLabels)))
	var victim *corev1.Pod
	for i, p := range pods.Items {
		if p.DeletionTimestamp == nil && len(p.Status.ContainerStatuses) > 0 && p.Status.ContainerStatuses[0].Ready {
			victim = &pods.Items[i]
			break
		}
	}
	require.NotNil(t, victim, "a Ready pod: %v", podStates(ctx, ns))
	before := map[string]bool{}
	for _, p := range pods.Items {
		before[p.Name] = true
	}
	t.Logf("deleting %s", victim.Name)
	require.NoError(t, cl.Delete(ctx, victim))
	harness.WaitFor(t, 2*time.Minute, "the replacement pod neither became Ready nor failed", func(ctx context.Context) (bool, string, error) {
		var now corev1.PodList
		if err := cl.List(ctx, &now, client.InNamespace(ns), client.MatchingLabels(d.Spec.Selector.MatchLabels)); err != nil {
			return false, err.Error(), nil
		}
		for _, p := range now.Items {
			if before[p.Name] || len(p.Status.ContainerStatuses) == 0 {
				continue
			}
			s := p.Status.ContainerStatuses[0]
			switch {
			case s.Ready:
				ready, state = true, p.Name+" Ready"
				return true, state, nil
			case s.LastTerminationState.Terminated != nil:
				state = fmt.Sprintf("%s exited %d times: %s", p.Name, s.RestartCount, strings.TrimSpace(s.LastTerminationState.Terminated.Message))
				return true, state, nil
			}
		}
		return false, strings.Join(podStates(ctx, ns), "; "), nil
	})
	return ready, state
}

// A Helm release whose upgrade puts a bad value in its ConfigMap (and the
// checksum in its template): the new pods exit on start, the guard rolls
// back, and the restored pods read the config revision 1 ran with, from its
// snapshot. The pipeline step fails and names the restored config.
func helmConfigChangeIsRestoredFromItsSnapshot(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, cl)
	installConfigApp(ctx, t, ns, "shop", true)

	r := helm(ctx, "upgrade", "shop", configChart, "-n", ns, "--set", "config=bad")
	require.Zero(t, r.Code, "helm upgrade: %s", r)
	step := kubectlDeployguard(ctx, "rollout", "status", "deploy/shop", "-n", ns, "--timeout=4m")
	t.Logf("kubectl deployguard rollout status: %s", step)
	assert.Equal(t, 1, step.Code, "the pipeline step fails")
	assert.Contains(t, step.Stdout+step.Stderr, "Config restored: ConfigMap shop-config from snapshot shop-config-dg-")

	d := rolledBack(ctx, t, ns, "shop", 4*time.Minute)
	t.Logf("AutoRollback: %s", d)
	assert.Contains(t, d, "Config restored: ConfigMap shop-config from snapshot shop-config-dg-")
	got, err := get(ctx, ns, "shop")
	require.NoError(t, err)
	snap := got.Spec.Template.Spec.Volumes[0].ConfigMap.Name
	assert.True(t, strings.HasPrefix(snap, "shop-config-dg-"), "the restored template mounts the snapshot: %s", snap)
	var cm corev1.ConfigMap
	require.NoError(t, cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: "shop-config"}, &cm))
	assert.Equal(t, "bad", cm.Data["config"], "the release's ConfigMap is left as Helm wrote it")

	ready, state := restartOnePod(ctx, t, ns, "shop")
	assert.True(t, ready, "a pod of the restored revision starts again with the good config: %s", state)
}

// The same upgrade, in a namespace the guard leaves alone, undone with
// upstream's `kubectl rollout undo`: the template comes back, but it reads
// the same ConfigMap, which now holds the bad value; the first pod that
// starts again fails.
func rolloutUndoAloneDoesNotHealAConfigChange(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, cl, harness.NamespaceLabels(map[string]string{vocab.LabelGuard: vocab.LabelGuardDisabled}))
	installConfigApp(ctx, t, ns, "shop", false)

	r := helm(ctx, "upgrade", "shop", configChart, "-n", ns, "--set", "config=bad")
	require.Zero(t, r.Code, "helm upgrade: %s", r)
	waitDeployment(t, ns, "shop", "the bad config's pods never failed", 2*time.Minute, func(_ rollout.Ledger, d *appsv1.Deployment) bool {
		return strings.Contains(strings.Join(podStates(ctx, ns), ";"), "bad configuration")
	})
	logEvidence(ctx, t, ns)
	r = kubectl(ctx, "rollout", "undo", "deploy/shop", "-n", ns)
	require.Zero(t, r.Code, "kubectl rollout undo: %s", r)
	waitDeployment(t, ns, "shop", "the undo never completed", 2*time.Minute, func(_ rollout.Ledger, d *appsv1.Deployment) bool {
		return completed(d)
	})
	ready, state := restartOnePod(ctx, t, ns, "shop")
	t.Logf("after kubectl rollout undo, a restarted pod: %s", state)
	assert.False(t, ready, "upstream's undo restores the template, not the config it ran with")
}

// kubectlDeployguard runs the guard's CLI as the kubectl plugin, as a
// pipeline does (setup puts bin/, with kubectl-deployguard, on PATH).
func kubectlDeployguard(ctx context.Context, args ...string) result {
	return kubectl(ctx, append([]string{"deployguard"}, args...)...)
}

// kustomizeApp is the test app as kustomize builds it: its config from a
// configMapGenerator (a name with the content's hash), so that a config
// change is a new ConfigMap and a rollout. extra literals make a new hash.
func kustomizeApp(ns, config string, extra ...string) map[string]string {
	literals := append([]string{"config=" + config}, extra...)
	quoted := make([]string, len(literals))
	for i, l := range literals {
		quoted[i] = fmt.Sprintf("%q", l)
	}
	return map[string]string{
		"kustomization.yaml": fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: %s
resources: [deployment.yaml]
configMapGenerator:
  - name: app-config
    literals: [%s]
`, ns, strings.Join(quoted, ", ")),
		"deployment.yaml": `apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 2
  selector:
    matchLabels: {app.kubernetes.io/name: web}
  template:
    metadata:
      labels: {app.kubernetes.io/name: web}
    spec:
      containers:
        - name: app
          image: ` + harness.Registry + `/testapp:v1
          imagePullPolicy: IfNotPresent
          terminationMessagePolicy: FallbackToLogsOnError
          readinessProbe:
            httpGet: {path: /readyz, port: 8080}
            periodSeconds: 1
          resources:
            requests: {cpu: 10m, memory: 16Mi}
          volumeMounts:
            - {name: config, mountPath: /etc/testapp}
      volumes:
        - name: config
          configMap: {name: app-config}
`,
	}
}

// Kustomize's configMapGenerator through Flux, pruning on: a bad config is
// a new ConfigMap, and Flux deletes the old one as it applies. The guard
// rolls back to the known-good pods, which start although their ConfigMap
// was pruned (its snapshot); Flux's re-applies of the bad release are
// refused without flapping; a fixed config rolls out and reads Ready.
func fluxPrunedConfigIsRestoredFromItsSnapshot(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, cl)
	repo := "apps/" + ns
	push := func(files map[string]string) {
		t.Helper()
		_, err := fluxSource.PushFiles(repo, "latest", files)
		require.NoError(t, err)
	}
	push(kustomizeApp(ns, "good"))
	manifest := fmt.Sprintf(`apiVersion: source.toolkit.fluxcd.io/v1
kind: OCIRepository
metadata: {name: web, namespace: %[1]s}
spec:
  interval: 2s
  insecure: true
  url: %[2]s
  ref: {tag: latest}
---
apiVersion: kustomize.toolkit.fluxcd.io/v1
kind: Kustomization
metadata: {name: web, namespace: %[1]s}
spec:
  interval: 10m
  retryInterval: 5s
  timeout: 2m
  prune: true
  wait: true
  sourceRef: {kind: OCIRepository, name: web}
`, ns, fluxSource.URL(repo))
	f := filepath.Join(t.TempDir(), "flux.yaml")
	require.NoError(t, os.WriteFile(f, []byte(manifest), 0o644))
	r := kubectl(ctx, "apply", "-f", f)
	require.Zero(t, r.Code, r.String())

	first := waitDeployment(t, ns, "web", "revision 1 was not recorded known-good", 3*time.Minute, func(l rollout.Ledger, d *appsv1.Deployment) bool {
		n := l.Newest()
		return n != nil && n.Revision == 1 && len(n.Config) == 1 && completed(d)
	})
	goodCM := first.Spec.Template.Spec.Volumes[0].ConfigMap.Name
	require.True(t, strings.HasPrefix(goodCM, "app-config-"), "kustomize's hashed name: %s", goodCM)

	push(kustomizeApp(ns, "bad"))
	harness.WaitFor(t, 2*time.Minute, "Flux never pruned the good config's ConfigMap", func(ctx context.Context) (bool, string, error) {
		err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: goodCM}, &corev1.ConfigMap{})
		return apierrors.IsNotFound(err), fmt.Sprint(err), nil
	})
	note := rolledBack(ctx, t, ns, "web", 4*time.Minute)
	t.Logf("AutoRollback: %s", note)
	assert.Contains(t, note, "Config restored: ConfigMap "+goodCM+" from snapshot ")
	assert.Contains(t, note, "(deleted since)")

	// Flux applies the bad release again every retryInterval: refused, so
	// the Deployment's spec stays the restored one for a quiet half minute.
	restored, err := get(ctx, ns, "web")
	require.NoError(t, err)
	quiet := time.Now().Add(30 * time.Second)
	harness.WaitFor(t, time.Minute, "the Deployment flapped", func(ctx context.Context) (bool, string, error) {
		d, err := get(ctx, ns, "web")
		if err != nil {
			return false, err.Error(), nil
		}
		if d.Generation != restored.Generation || !completed(d) {
			return false, "", fmt.Errorf("changed after the rollback: generation %d to %d, %s", restored.Generation, d.Generation, describe(ctx, d))
		}
		return time.Now().After(quiet), "", nil
	})
	ready, state := restartOnePod(ctx, t, ns, "web")
	assert.True(t, ready, "a pod of the restored revision starts again, its pruned config read from the snapshot: %s", state)

	// A fixed config: a new ConfigMap, a rollout that completes.
	push(kustomizeApp(ns, "good", "release=fixed"))
	waitDeployment(t, ns, "web", "the fixed config never rolled out", 3*time.Minute, func(l rollout.Ledger, d *appsv1.Deployment) bool {
		name := d.Spec.Template.Spec.Volumes[0].ConfigMap.Name
		return strings.HasPrefix(name, "app-config-") && name != goodCM && !strings.Contains(name, "-dg-") && completed(d)
	})
}

// readsConfigMap mounts ConfigMap name where the test app reads its setting,
// with a checksum annotation as Helm's pattern writes it.
func readsConfigMap(name, checksum string) harness.DeploymentOption {
	return func(d *appsv1.Deployment) {
		spec := &d.Spec.Template.Spec
		spec.Volumes = append(spec.Volumes, corev1.Volume{Name: "config", VolumeSource: corev1.VolumeSource{
			ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: name}}}})
		c := &spec.Containers[0]
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "config", MountPath: "/etc/testapp"})
		c.TerminationMessagePolicy = corev1.TerminationMessageFallbackToLogsOnError
		if d.Spec.Template.Annotations == nil {
			d.Spec.Template.Annotations = map[string]string{}
		}
		d.Spec.Template.Annotations["checksum/config"] = checksum
	}
}

// A ConfigMap shared by two Deployments gets a bad value, and one of them
// rolls (its checksum changed): that one is rolled back onto the snapshot;
// the shared ConfigMap keeps its new data and the other Deployment is not
// touched (no rollout of its own, nothing to roll back), as
// reconciler/README.md says.
func sharedConfigMapOnlyTheFailedDeploymentIsRestored(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, cl)
	shared := &corev1.ConfigMap{}
	shared.Namespace, shared.Name, shared.Data = ns, "shared", map[string]string{"config": "good"}
	require.NoError(t, cl.Create(ctx, shared))
	require.NoError(t, cl.Create(ctx, app(ns, "other", "v1", readsConfigMap("shared", "1"))))
	deployGood(ctx, t, ns, "web", readsConfigMap("shared", "1"))
	waitDeployment(t, ns, "other", "the other Deployment never completed", 2*time.Minute, func(_ rollout.Ledger, d *appsv1.Deployment) bool { return completed(d) })
	other, err := get(ctx, ns, "other")
	require.NoError(t, err)

	shared.Data = map[string]string{"config": "bad"}
	require.NoError(t, cl.Update(ctx, shared))
	r := kubectl(ctx, "patch", "deploy/web", "-n", ns, "--type=merge", "-p", `{"spec":{"template":{"metadata":{"annotations":{"checksum/config":"2"}}}}}`)
	require.Zero(t, r.Code, r.String())
	note := rolledBack(ctx, t, ns, "web", 4*time.Minute)
	t.Logf("AutoRollback: %s", note)
	assert.Contains(t, note, "Config restored: ConfigMap shared from snapshot shared-dg-")

	require.NoError(t, cl.Get(ctx, client.ObjectKeyFromObject(shared), shared))
	assert.Equal(t, "bad", shared.Data["config"], "the shared ConfigMap keeps its new data")
	now, err := get(ctx, ns, "other")
	require.NoError(t, err)
	assert.Equal(t, other.Generation, now.Generation, "the other Deployment was not written")
	assert.Equal(t, "shared", now.Spec.Template.Spec.Volumes[0].ConfigMap.Name)
	assert.True(t, completed(now), "its running pods run on: %s", describe(ctx, now))
}
