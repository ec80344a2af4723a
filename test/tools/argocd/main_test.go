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
	if err != nil {
		t.Fatal(err)
	}
	obj, err := DecodeObject(data)
	if err != nil {
		t.Fatal(err)
	}
	return obj
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestDeploymentHealthScript runs config/argocd/deployment-health.lua in Argo
// CD's Lua VM, as the apps/Deployment health customization, and the built-in
// check (gitops-engine) on the same live objects. Without a Stalled=True
// condition the script must say exactly what the built-in check says.
func TestDeploymentHealthScript(t *testing.T) {
	script := string(readFile(t, scriptPath))
	fromCM, err := OverridesFromConfigMap(context.Background(), readFile(t, patchPath))
	if err != nil {
		t.Fatal(err)
	}

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
			if builtin == nil || customized == nil || viaConfigMap == nil {
				t.Fatalf("no verdict: builtin %v, customized %v, argocd-cm %v", builtin, customized, viaConfigMap)
			}
			for _, v := range []*Verdict{builtin, customized, viaConfigMap} {
				if v.Error != "" {
					t.Fatalf("health check failed: %s", v.Error)
				}
			}
			got := verdict{string(customized.Status), customized.Message}
			if got != tc.want {
				t.Errorf("script: got %q, want %q", got, tc.want)
			}
			if *viaConfigMap != *customized {
				t.Errorf("argocd-cm patch: got %+v, the script alone %+v", *viaConfigMap, *customized)
			}
			builtinGot := verdict{string(builtin.Status), builtin.Message}
			switch {
			case tc.guard && builtinGot.status == "Degraded":
				t.Errorf("built-in check already Degraded (%q): the case does not show what the script adds", builtinGot)
			case !tc.guard && builtinGot != got:
				t.Errorf("script %q differs from the built-in check %q", got, builtinGot)
			}
		})
	}
}

// TestArgoCDConfigMapPatch checks that the argocd-cm patch carries
// deployment-health.lua byte for byte under the key Argo CD reads.
func TestArgoCDConfigMapPatch(t *testing.T) {
	script := readFile(t, scriptPath)
	var cm corev1.ConfigMap
	if err := yaml.UnmarshalStrict(readFile(t, patchPath), &cm); err != nil {
		t.Fatal(err)
	}
	// No namespace: a patch naming one matches nothing in a kustomization of
	// Argo CD's install.yaml (namespaceless) with `namespace: argocd`.
	if cm.APIVersion != "v1" || cm.Kind != "ConfigMap" || cm.Name != "argocd-cm" || cm.Namespace != "" {
		t.Errorf("the patch is %s %s %s/%s, want v1 ConfigMap argocd-cm in no namespace", cm.APIVersion, cm.Kind, cm.Namespace, cm.Name)
	}
	if len(cm.Data) != 1 || len(cm.BinaryData) != 0 {
		t.Errorf("the patch sets %d keys, want only %s", len(cm.Data)+len(cm.BinaryData), configMapKey)
	}
	got, ok := cm.Data[configMapKey]
	if !ok {
		t.Fatalf("the patch has no key %s", configMapKey)
	}
	if !bytes.Equal([]byte(got), script) {
		t.Errorf("the patch's script differs from %s at byte %d: copy the script under the key again, "+
			"each non-empty line indented by four spaces (sed 's/^\\(.\\)/    \\1/')", scriptPath, firstDiff([]byte(got), script))
	}
	// What Argo CD's settings manager makes of it.
	overrides, err := OverridesFromConfigMap(context.Background(), readFile(t, patchPath))
	if err != nil {
		t.Fatal(err)
	}
	if o := overrides["apps/Deployment"]; o.HealthLua != string(script) || o.UseOpenLibs {
		t.Errorf("Argo CD's settings manager does not read the script as the apps/Deployment health check "+
			"(%d bytes of health Lua, useOpenLibs %v)", len(o.HealthLua), o.UseOpenLibs)
	}
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
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][2]string{{scriptPath, ""}, {"", patchPath}} {
		var out bytes.Buffer
		if err := run(args[0], args[1], "-", bytes.NewReader(obj), &out); err != nil {
			t.Fatal(err)
		}
		var res Result
		if err := json.Unmarshal(out.Bytes(), &res); err != nil {
			t.Fatalf("%v\n%s", err, out.String())
		}
		if res.Builtin == nil || res.Builtin.Status != "Healthy" ||
			res.Customized == nil || res.Customized.Status != "Degraded" || !strings.HasPrefix(res.Customized.Message, "AutoRollback: ") {
			t.Errorf("got %s", out.String())
		}
		if !strings.HasPrefix(res.ArgoCD, "v3.") {
			t.Errorf("argocd version %q", res.ArgoCD)
		}
	}
	// Without a customization both verdicts are the built-in check's.
	var out bytes.Buffer
	if err := run("", "", "-", bytes.NewReader(obj), &out); err != nil {
		t.Fatal(err)
	}
	var res Result
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatal(err)
	}
	if *res.Builtin != *res.Customized {
		t.Errorf("without a customization: %s", out.String())
	}
}
