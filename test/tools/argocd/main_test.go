package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	log "github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// TestMain quiets Argo CD's settings manager, which logs through logrus.
func TestMain(m *testing.M) {
	log.SetLevel(log.WarnLevel)
	os.Exit(m.Run())
}

var (
	scriptPath = filepath.Join("..", "..", "..", "config", "argocd", "deployment-health.lua")
	patchPath  = filepath.Join("..", "..", "..", "config", "argocd", "argocd-cm-patch.yaml")
)

const configMapKey = "resource.customizations.health.apps_Deployment"

// rollbackMessage is the guard's Stalled message after a rollback.
const rollbackMessage = "deployguard rolled back revision 3 (ReplicaSet web-7d9f): 2/2 new pods ImagePullBackOff for 15s " +
	"(container app, image nginx:no-such-tag); running known-good revision 2."

// deployment is a Deployment "web" whose rollout of generation 2 is complete:
// 2 replicas, all updated and available. Tests change what they need.
func deployment(change func(d *appsv1.Deployment)) *appsv1.Deployment {
	replicas := int32(2)
	d := &appsv1.Deployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", Generation: 2},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "web"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "nginx:1.27"}}},
			},
		},
		Status: appsv1.DeploymentStatus{
			ObservedGeneration: 2, Replicas: 2, UpdatedReplicas: 2, ReadyReplicas: 2, AvailableReplicas: 2,
			Conditions: []appsv1.DeploymentCondition{
				{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue, Reason: "MinimumReplicasAvailable",
					Message: "Deployment has minimum availability."},
				progressing(corev1.ConditionTrue, "NewReplicaSetAvailable", `ReplicaSet "web-5c6b" has successfully progressed.`),
			},
		},
	}
	if change != nil {
		change(d)
	}
	return d
}

func progressing(status corev1.ConditionStatus, reason, message string) appsv1.DeploymentCondition {
	return appsv1.DeploymentCondition{Type: appsv1.DeploymentProgressing, Status: status, Reason: reason, Message: message}
}

func stalled(status corev1.ConditionStatus) appsv1.DeploymentCondition {
	return appsv1.DeploymentCondition{Type: "Stalled", Status: status, Reason: "AutoRollback", Message: rollbackMessage}
}

// live is d as Argo CD's cluster cache holds it: its JSON, decoded unstructured.
func live(t *testing.T, d any) *unstructured.Unstructured {
	t.Helper()
	data, err := json.Marshal(d)
	require.NoError(t, err)
	obj, err := DecodeObject(data)
	require.NoError(t, err)
	return obj
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	return data
}

// TestDeploymentHealthScript runs config/argocd/deployment-health.lua in Argo
// CD's Lua VM, as the apps/Deployment health customization, and the built-in
// check (gitops-engine) on the same live objects. Without a Stalled=True
// condition the script must say exactly what the built-in check says.
func TestDeploymentHealthScript(t *testing.T) {
	script := string(readFile(t, scriptPath))
	fromCM, err := OverridesFromConfigMap(context.Background(), readFile(t, patchPath))
	require.NoError(t, err)

	type verdict struct{ status, message string }
	cases := []struct {
		name string
		obj  any
		want verdict
		// guard marks the cases the script decides differently from the
		// built-in check: deployguard's Stalled condition.
		guard bool
	}{
		{name: "healthy", obj: deployment(nil),
			want: verdict{"Healthy", ""}},
		{name: "scaled to zero", obj: deployment(func(d *appsv1.Deployment) {
			zero := int32(0)
			d.Spec.Replicas = &zero
			d.Status = appsv1.DeploymentStatus{ObservedGeneration: 2}
		}), want: verdict{"Healthy", ""}},
		{name: "paused", obj: deployment(func(d *appsv1.Deployment) { d.Spec.Paused = true }),
			want: verdict{"Suspended", "Deployment is paused"}},
		{name: "paused wins over the progress deadline", obj: deployment(func(d *appsv1.Deployment) {
			d.Spec.Paused = true
			d.Status.Conditions[1] = progressing(corev1.ConditionFalse, "ProgressDeadlineExceeded", `ReplicaSet "web-7d9f" has timed out progressing.`)
		}), want: verdict{"Suspended", "Deployment is paused"}},
		{name: "generation not observed", obj: deployment(func(d *appsv1.Deployment) { d.Generation = 3 }),
			want: verdict{"Progressing", "Waiting for rollout to finish: observed deployment generation less than desired generation"}},
		{name: "generation not observed wins over the progress deadline", obj: deployment(func(d *appsv1.Deployment) {
			d.Generation = 3
			d.Status.Conditions[1] = progressing(corev1.ConditionFalse, "ProgressDeadlineExceeded", `ReplicaSet "web-7d9f" has timed out progressing.`)
		}), want: verdict{"Progressing", "Waiting for rollout to finish: observed deployment generation less than desired generation"}},
		{name: "no status yet", obj: deployment(func(d *appsv1.Deployment) {
			d.Generation = 1
			d.Status = appsv1.DeploymentStatus{}
		}), want: verdict{"Progressing", "Waiting for rollout to finish: observed deployment generation less than desired generation"}},
		{name: "new replicas being updated", obj: deployment(func(d *appsv1.Deployment) {
			d.Status.Replicas, d.Status.UpdatedReplicas, d.Status.AvailableReplicas = 3, 1, 2
			d.Status.Conditions[1] = progressing(corev1.ConditionTrue, "ReplicaSetUpdated", `ReplicaSet "web-7d9f" is progressing.`)
		}), want: verdict{"Progressing", "Waiting for rollout to finish: 1 out of 2 new replicas have been updated..."}},
		{name: "old replicas pending termination", obj: deployment(func(d *appsv1.Deployment) {
			d.Status.Replicas, d.Status.UpdatedReplicas, d.Status.AvailableReplicas = 3, 2, 3
			d.Status.Conditions[1] = progressing(corev1.ConditionTrue, "ReplicaSetUpdated", `ReplicaSet "web-7d9f" is progressing.`)
		}), want: verdict{"Progressing", "Waiting for rollout to finish: 1 old replicas are pending termination..."}},
		{name: "updated replicas not available", obj: deployment(func(d *appsv1.Deployment) {
			d.Status.AvailableReplicas = 1
			d.Status.Conditions[1] = progressing(corev1.ConditionTrue, "ReplicaSetUpdated", `ReplicaSet "web-7d9f" is progressing.`)
		}), want: verdict{"Progressing", "Waiting for rollout to finish: 1 of 2 updated replicas are available..."}},
		{name: "no spec.replicas", obj: func() any {
			// Only an object that never went through the API server lacks
			// spec.replicas; the built-in check then skips that wait.
			u := live(t, deployment(func(d *appsv1.Deployment) { d.Status.UpdatedReplicas, d.Status.AvailableReplicas = 1, 1 }))
			unstructured.RemoveNestedField(u.Object, "spec", "replicas")
			return u.Object
		}(), want: verdict{"Progressing", "Waiting for rollout to finish: 1 old replicas are pending termination..."}},
		{name: "progress deadline exceeded", obj: deployment(func(d *appsv1.Deployment) {
			d.Status.Replicas, d.Status.UpdatedReplicas, d.Status.UnavailableReplicas = 4, 2, 2
			d.Status.Conditions[1] = progressing(corev1.ConditionFalse, "ProgressDeadlineExceeded", `ReplicaSet "web-7d9f" has timed out progressing.`)
		}), want: verdict{"Degraded", `Deployment "web" exceeded its progress deadline`}},
		{name: "only the first Progressing condition counts", obj: deployment(func(d *appsv1.Deployment) {
			d.Status.Conditions = append(d.Status.Conditions,
				progressing(corev1.ConditionFalse, "ProgressDeadlineExceeded", "a second condition of the same type"))
		}), want: verdict{"Healthy", ""}},
		{name: "Stalled False is not the guard's verdict", obj: deployment(func(d *appsv1.Deployment) {
			d.Status.Conditions = append(d.Status.Conditions, stalled(corev1.ConditionFalse))
		}), want: verdict{"Healthy", ""}},
		{name: "being deleted", obj: deployment(func(d *appsv1.Deployment) {
			now := metav1.Now()
			d.DeletionTimestamp = &now
		}), want: verdict{"Progressing", "Pending deletion"}},

		// After deployguard's rollback the old template runs again and
		// upstream's conditions read healthy: the built-in check says Healthy.
		{name: "rolled back by deployguard", guard: true, obj: deployment(func(d *appsv1.Deployment) {
			d.Generation, d.Status.ObservedGeneration = 4, 4
			d.Status.Conditions = append(d.Status.Conditions, stalled(corev1.ConditionTrue))
		}), want: verdict{"Degraded", "AutoRollback: " + rollbackMessage}},
		{name: "rolled back while the rollback's pods start", guard: true, obj: deployment(func(d *appsv1.Deployment) {
			d.Generation, d.Status.ObservedGeneration = 4, 4
			d.Status.Replicas, d.Status.UpdatedReplicas, d.Status.AvailableReplicas = 4, 2, 0
			d.Status.Conditions[1] = progressing(corev1.ConditionTrue, "ReplicaSetUpdated", `ReplicaSet "web-5c6b" is progressing.`)
			d.Status.Conditions = append(d.Status.Conditions, stalled(corev1.ConditionTrue))
		}), want: verdict{"Degraded", "AutoRollback: " + rollbackMessage}},
		// Paused reads as the built-in check says, as kstatus's order has it.
		{name: "rolled back and paused", obj: deployment(func(d *appsv1.Deployment) {
			d.Spec.Paused = true
			d.Status.Conditions = append(d.Status.Conditions, stalled(corev1.ConditionTrue))
		}), want: verdict{"Suspended", "Deployment is paused"}},
		// A new template ends the verdict: until the Deployment controller
		// sees it, it is a rollout in progress, not the old failure.
		{name: "a new template after a rollback, not yet observed", obj: deployment(func(d *appsv1.Deployment) {
			d.Generation = 3
			d.Status.Conditions = append(d.Status.Conditions, stalled(corev1.ConditionTrue))
		}), want: verdict{"Progressing", "Waiting for rollout to finish: observed deployment generation less than desired generation"}},
	}

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			obj := live(t, tc.obj)
			builtin := Evaluate(obj, nil)
			customized := Evaluate(obj, DeploymentHealthOverride(script))
			viaConfigMap := Evaluate(obj, fromCM)
			require.True(t, builtin != nil && customized != nil && viaConfigMap != nil,
				"no verdict: builtin %v, customized %v, argocd-cm %v", builtin, customized, viaConfigMap)
			for _, v := range []*Verdict{builtin, customized, viaConfigMap} {
				require.Empty(t, v.Error, "health check failed")
			}
			got := verdict{string(customized.Status), customized.Message}
			assert.Equal(t, tc.want, got, "script")
			assert.Equal(t, *customized, *viaConfigMap, "argocd-cm patch against the script alone")
			builtinGot := verdict{string(builtin.Status), builtin.Message}
			if tc.guard {
				assert.NotEqual(t, "Degraded", builtinGot.status, "built-in check already Degraded (%q): the case does not show what the script adds", builtinGot)
			} else {
				assert.Equal(t, builtinGot, got, "the script differs from the built-in check")
			}
		})
	}
}

// TestArgoCDConfigMapPatch checks that the argocd-cm patch carries
// deployment-health.lua byte for byte under the key Argo CD reads.
func TestArgoCDConfigMapPatch(t *testing.T) {
	script := readFile(t, scriptPath)
	var cm corev1.ConfigMap
	require.NoError(t, yaml.UnmarshalStrict(readFile(t, patchPath), &cm))
	// No namespace: a patch naming one matches nothing in a kustomization of
	// Argo CD's install.yaml (namespaceless) with `namespace: argocd`.
	assert.Equal(t, [4]string{"v1", "ConfigMap", "", "argocd-cm"}, [4]string{cm.APIVersion, cm.Kind, cm.Namespace, cm.Name},
		"the patch: want v1 ConfigMap argocd-cm in no namespace")
	assert.Len(t, cm.Data, 1, "the patch sets only %s", configMapKey)
	assert.Empty(t, cm.BinaryData, "the patch sets only %s", configMapKey)
	got, ok := cm.Data[configMapKey]
	require.True(t, ok, "the patch has no key %s", configMapKey)
	assert.True(t, bytes.Equal([]byte(got), script), "the patch's script differs from %s at byte %d: copy the script under the key again, "+
		"each non-empty line indented by four spaces (sed 's/^\\(.\\)/    \\1/')", scriptPath, firstDiff([]byte(got), script))
	// What Argo CD's settings manager makes of it.
	overrides, err := OverridesFromConfigMap(context.Background(), readFile(t, patchPath))
	require.NoError(t, err)
	o := overrides["apps/Deployment"]
	assert.True(t, o.HealthLua == string(script) && !o.UseOpenLibs, "Argo CD's settings manager does not read the script as the apps/Deployment health check "+
		"(%d bytes of health Lua, useOpenLibs %v)", len(o.HealthLua), o.UseOpenLibs)
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestCommand runs the command's code path on a rolled-back Deployment.
func TestCommand(t *testing.T) {
	obj, err := json.Marshal(deployment(func(d *appsv1.Deployment) {
		d.Status.Conditions = append(d.Status.Conditions, stalled(corev1.ConditionTrue))
	}))
	require.NoError(t, err)
	for _, args := range [][2]string{{scriptPath, ""}, {"", patchPath}} {
		var out bytes.Buffer
		require.NoError(t, run(args[0], args[1], "-", bytes.NewReader(obj), &out))
		var res Result
		require.NoError(t, json.Unmarshal(out.Bytes(), &res), out.String())
		assert.True(t, res.Builtin != nil && res.Builtin.Status == "Healthy" &&
			res.Customized != nil && res.Customized.Status == "Degraded" && strings.HasPrefix(res.Customized.Message, "AutoRollback: "),
			"got %s", out.String())
		assert.True(t, strings.HasPrefix(res.ArgoCD, "v3."), "argocd version %q", res.ArgoCD)
	}
	// Without a customization both verdicts are the built-in check's.
	var out bytes.Buffer
	require.NoError(t, run("", "", "-", bytes.NewReader(obj), &out))
	var res Result
	require.NoError(t, json.Unmarshal(out.Bytes(), &res))
	assert.Equal(t, *res.Builtin, *res.Customized, "without a customization: %s", out.String())
}
