package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/deployguard/deployguard/webhook/native"
)

// NativeDir is config/native: the guard's policies, their bindings and
// params, as deployed.
func NativeDir() string { return filepath.Join(RepoRoot(), "config", "native") }

// InstallNativePolicies creates config/native's policies and bindings as
// deployed, and their params from s, in GuardNamespace; then waits until the
// API server enforces them.
func InstallNativePolicies(ctx context.Context, c client.Client, s native.Settings) error {
	rules, err := native.Load()
	if err != nil {
		return err
	}
	var objs []client.Object
	for _, p := range rules.Policies {
		objs = append(objs, p.DeepCopy())
	}
	for _, p := range rules.Mutations {
		objs = append(objs, p.DeepCopy())
	}
	b, err := os.ReadFile(filepath.Join(NativeDir(), "bindings.yaml"))
	if err != nil {
		return err
	}
	for _, doc := range strings.Split(string(b), "\n---\n") {
		var t metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &t); err != nil {
			return fmt.Errorf("config/native/bindings.yaml: %w", err)
		}
		var o client.Object
		switch t.Kind {
		case "ValidatingAdmissionPolicyBinding":
			o = &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
		case "MutatingAdmissionPolicyBinding":
			o = &admissionregistrationv1.MutatingAdmissionPolicyBinding{}
		default:
			return fmt.Errorf("config/native/bindings.yaml: unexpected kind %q", t.Kind)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), o); err != nil {
			return fmt.Errorf("config/native/bindings.yaml: %w", err)
		}
		objs = append(objs, o)
	}
	objs = append(objs, s.ConfigMap(GuardNamespace))
	for _, o := range objs {
		if err := c.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating %s: %w", o.GetName(), err)
		}
	}
	return WaitForNativePolicies(ctx, c, "default", time.Minute)
}

// WaitForNativePolicies waits until the API server refuses, through the
// guard's policy, a Deployment that would take every replica down at once
// (a dry run in namespace): policies take effect a moment after they are
// written.
func WaitForNativePolicies(ctx context.Context, c client.Client, namespace string, timeout time.Duration) error {
	two, all := int32(2), intstr.FromString("100%")
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "native-policies-probe"},
		Spec: appsv1.DeploymentSpec{
			Replicas: &two,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "native-policies-probe"}},
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType,
				RollingUpdate: &appsv1.RollingUpdateDeployment{MaxUnavailable: &all}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "native-policies-probe"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "probe"}}},
			},
		},
	}
	var last error
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		err := c.Create(ctx, d.DeepCopy(), client.DryRunAll)
		if _, status := err.(apierrors.APIStatus); err == nil || status {
			last = err // the API server's answer, not the client's deadline
		}
		return err != nil && strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+native.Refusals+"'"), nil
	})
	if err != nil {
		return fmt.Errorf("the API server does not enforce the native policies: %w (last answer: %w)", err, last)
	}
	// And repairs an empty selector (deployguard-selector; the guard's
	// webhook, when it is up, gives the same answer).
	d.Spec.Selector, d.Spec.Strategy = nil, appsv1.DeploymentStrategy{}
	var got *appsv1.Deployment
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		got = d.DeepCopy()
		last = c.Create(ctx, got, client.DryRunAll)
		return last == nil && got.Spec.Selector != nil && got.Spec.Selector.MatchLabels["app"] == "native-policies-probe", nil
	})
	if err != nil {
		return fmt.Errorf("the API server does not repair an empty selector: %w (last answer: %w, selector %v)", err, last, got.Spec.Selector)
	}
	return nil
}
