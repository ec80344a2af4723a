package policy

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// goodContainer passes every built-in policy.
func goodContainer(name string) corev1.Container {
	return corev1.Container{
		Name:  name,
		Image: "registry.example.com/team/" + name + ":1.4.2",
		Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}},
		Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{
				corev1.ResourceCPU:    resource.MustParse("250m"),
				corev1.ResourceMemory: resource.MustParse("256Mi"),
			},
			Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("512Mi")},
		},
		ReadinessProbe: &corev1.Probe{
			ProbeHandler: corev1.ProbeHandler{
				HTTPGet: &corev1.HTTPGetAction{Path: "/readyz", Port: intstr.FromString("http")},
			},
			PeriodSeconds: 5,
		},
	}
}

// deployment is a Deployment with the given containers that is otherwise
// unremarkable.
func deployment(containers ...corev1.Container) *appsv1.Deployment {
	labels := map[string]string{"app": "shop"}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "shop", Namespace: "team-a", Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](3),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: containers},
			},
		},
	}
}

// createInput is an admission CREATE of d by a plain user.
func createInput(t testing.TB, d *appsv1.Deployment) *Input {
	t.Helper()
	in, err := NewInput(Request{
		Operation: "CREATE",
		Namespace: d.Namespace,
		Name:      d.Name,
		Object:    d,
		UserInfo:  UserInfo{Username: "alice", Groups: []string{"system:authenticated", "team-a"}},
	})
	require.NoError(t, err)
	return in
}

// newEngine builds an Engine and loads sources, failing the test on error.
func newEngine(t testing.TB, opts Options, sources ...Source) *Engine {
	t.Helper()
	e, err := New(opts)
	require.NoError(t, err)
	require.NoError(t, e.Load(context.Background(), sources))
	return e
}

// regoSource is a test module named like a file.
func regoSource(name, module string) Source {
	return Source{Name: name, Module: module}
}

// denyAlways is a policy that denies every request with one message.
func denyAlways(name, mode string) Source {
	meta := ""
	if mode != "" {
		meta = fmt.Sprintf("# METADATA\n# custom:\n#   mode: %s\n", mode)
	}
	return regoSource(name+".rego", meta+"package deployguard."+name+"\n\n"+
		`deny contains {"msg": "always refused", "field": "metadata.name"} if input.operation`+"\n")
}

// policiesOf lists the policy names of findings, in order.
func policiesOf(fs []Finding) []string {
	var names []string
	for _, f := range fs {
		names = append(names, f.Policy)
	}
	return names
}
