package harness

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// NamespaceOption changes the namespace NewNamespace creates.
type NamespaceOption func(*namespaceOptions)

type namespaceOptions struct {
	ns   corev1.Namespace
	keep bool
}

// NamespaceLabels labels the namespace (to opt it out of the guard, say).
func NamespaceLabels(labels map[string]string) NamespaceOption {
	return func(o *namespaceOptions) { o.ns.Labels = labels }
}

// NamespaceNamed gives the namespace a fixed name, for a test on a cluster of
// its own whose configuration names it.
func NamespaceNamed(name string) NamespaceOption {
	return func(o *namespaceOptions) { o.ns.Name, o.ns.GenerateName = name, "" }
}

// KeepNamespace leaves the namespace in place when the test ends: on an API
// server without a namespace controller (envtest) a deleted namespace is
// never emptied, and stays Terminating, refusing new objects, for the rest of
// the tier.
func KeepNamespace() NamespaceOption {
	return func(o *namespaceOptions) { o.keep = true }
}

// NewNamespace creates a namespace for one test, named after the test with a
// unique suffix the API server picks, and deletes it when the test ends (in
// the background: the test does not wait for its content to go).
func NewNamespace(t *testing.T, c client.Client, opts ...NamespaceOption) string {
	t.Helper()
	o := namespaceOptions{ns: corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: dnsLabel(t.Name(), 20) + "-"}}}
	for _, opt := range opts {
		opt(&o)
	}
	ns := &o.ns
	require.NoError(t, c.Create(context.Background(), ns), "creating namespace %s%s", ns.Name, ns.GenerateName)
	if o.keep {
		return ns.Name
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := c.Delete(ctx, ns); err != nil && !apierrors.IsNotFound(err) {
			t.Logf("deleting namespace %s: %v", ns.Name, err)
		}
	})
	return ns.Name
}

// DeploymentOption changes the Deployment that Deployment builds.
type DeploymentOption func(*appsv1.Deployment)

// Replicas sets spec.replicas.
func Replicas(n int32) DeploymentOption {
	return func(d *appsv1.Deployment) { d.Spec.Replicas = ptr.To(n) }
}

// ProgressDeadline sets spec.progressDeadlineSeconds (the API server's
// default is 600).
func ProgressDeadline(seconds int32) DeploymentOption {
	return func(d *appsv1.Deployment) { d.Spec.ProgressDeadlineSeconds = ptr.To(seconds) }
}

// Deployment is an application as a user writes it: 2 replicas, a selector
// on the stable label app.kubernetes.io/name: name, and one container "app"
// running image with a readiness probe and resource requests. opts change it,
// in order.
func Deployment(ns, name, image string, opts ...DeploymentOption) *appsv1.Deployment {
	labels := map[string]string{"app.kubernetes.io/name": name}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app.kubernetes.io/name": name}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name: "app", Image: image,
					ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/", Port: intstr.FromInt32(80)}}},
					Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
						corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("16Mi")}},
				}}},
			},
		},
	}
	for _, o := range opts {
		o(d)
	}
	return d
}
