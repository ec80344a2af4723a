package load

import (
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Deployment is an application Deployment of the shape seen in production:
// containers with env vars, probes, resources and a volume, the labels of a
// chart, a version label on the pods. It passes every check and built-in
// policy, so that the load measures the cost of admitting, not of refusing.
func Deployment(namespace, name string, replicas int32, containers, envVars int) *appsv1.Deployment {
	labels := map[string]string{"app.kubernetes.io/name": name, "app.kubernetes.io/instance": name, "app.kubernetes.io/part-of": "bench"}
	pod := map[string]string{"app.kubernetes.io/name": name, "app.kubernetes.io/instance": name, "app.kubernetes.io/version": "1.0.0"}
	var cs []corev1.Container
	for i := range containers {
		c := corev1.Container{
			Name:  fmt.Sprintf("c%d", i),
			Image: fmt.Sprintf("registry.example.com/bench/c%d:1.0.0", i),
			Ports: []corev1.ContainerPort{{Name: fmt.Sprintf("http-%d", i), ContainerPort: int32(8080 + i)}},
			Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
				Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")},
			},
			ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/ready", Port: intstr.FromInt32(int32(8080 + i))}}, PeriodSeconds: 5},
			LivenessProbe:  &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/live", Port: intstr.FromInt32(int32(8080 + i))}}, PeriodSeconds: 10},
			VolumeMounts:   []corev1.VolumeMount{{Name: "config", MountPath: "/etc/app"}},
		}
		for j := range envVars {
			c.Env = append(c.Env, corev1.EnvVar{Name: fmt.Sprintf("SETTING_%02d", j), Value: fmt.Sprintf("value-of-setting-%02d-for-%s", j, name)})
		}
		cs = append(cs, c)
	}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": name, "app.kubernetes.io/instance": name}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: pod},
				Spec: corev1.PodSpec{
					Containers: cs,
					Volumes:    []corev1.Volume{{Name: "config", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
				},
			},
		},
	}
}
