package policy

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// realisticDeployment is about 8 KB of JSON: an application with two
// sidecars, the usual env, probes, volumes, scheduling and annotations.
func realisticDeployment() *appsv1.Deployment {
	container := func(name string, port int32) corev1.Container {
		c := goodContainer(name)
		c.Ports = []corev1.ContainerPort{{Name: "http", ContainerPort: port}, {Name: "metrics", ContainerPort: 9090}}
		for i := range 20 {
			c.Env = append(c.Env, corev1.EnvVar{Name: fmt.Sprintf("%s_SETTING_%02d", name, i), Value: fmt.Sprintf("value-%d-for-the-%s-container", i, name)})
		}
		c.Env = append(c.Env, corev1.EnvVar{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}})
		c.LivenessProbe = &corev1.Probe{
			ProbeHandler:        corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/livez", Port: intstr.FromInt32(port)}},
			InitialDelaySeconds: 10, PeriodSeconds: 10, FailureThreshold: 3,
		}
		c.VolumeMounts = []corev1.VolumeMount{{Name: "config", MountPath: "/etc/" + name}, {Name: "tmp", MountPath: "/tmp"}}
		c.SecurityContext = &corev1.SecurityContext{
			RunAsNonRoot: ptr.To(true), ReadOnlyRootFilesystem: ptr.To(true), AllowPrivilegeEscalation: ptr.To(false),
			Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		}
		c.Resources.Limits[corev1.ResourceCPU] = resource.MustParse("1")
		return c
	}
	d := deployment(container("shop", 8080), container("proxy", 15001), container("logship", 24224))
	d.Labels = map[string]string{"app": "shop", "app.kubernetes.io/name": "shop", "app.kubernetes.io/part-of": "storefront", "team": "checkout"}
	d.Annotations = map[string]string{
		"deployment.kubernetes.io/revision":                "17",
		"kubectl.kubernetes.io/last-applied-configuration": `{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"shop","namespace":"team-a"}}`,
	}
	spec := &d.Spec.Template.Spec
	d.Spec.Template.Annotations = map[string]string{"prometheus.io/scrape": "true", "prometheus.io/port": "9090"}
	spec.ServiceAccountName = "shop"
	spec.TerminationGracePeriodSeconds = ptr.To[int64](45)
	spec.Volumes = []corev1.Volume{
		{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "shop-config"}}}},
		{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
	}
	spec.Tolerations = []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "checkout", Effect: corev1.TaintEffectNoSchedule}}
	spec.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
		PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{
			Weight: 100,
			PodAffinityTerm: corev1.PodAffinityTerm{
				TopologyKey:   "kubernetes.io/hostname",
				LabelSelector: d.Spec.Selector,
			},
		}},
	}}
	d.Spec.Strategy = appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType, RollingUpdate: &appsv1.RollingUpdateDeployment{
		MaxUnavailable: ptr.To(intstr.FromString("25%")), MaxSurge: ptr.To(intstr.FromString("25%")),
	}}
	d.Spec.RevisionHistoryLimit = ptr.To[int32](10)
	d.Spec.ProgressDeadlineSeconds = ptr.To[int32](600)
	return d
}

// BenchmarkEvaluateBuiltins measures one admission decision with the whole
// built-in library on a realistic Deployment, the webhook's hot path once the
// Input is built. It also reports the 99th percentile of single evaluations.
func BenchmarkEvaluateBuiltins(b *testing.B) {
	d := realisticDeployment()
	raw, err := json.Marshal(d)
	require.NoError(b, err)
	require.InDelta(b, 8000, len(raw), 2000, "the Deployment should be about 8 KB")
	e := newEngine(b, Options{}, Builtins()...)
	in := createInput(b, d)
	ctx := context.Background()
	require.True(b, e.Evaluate(ctx, in).Allowed(), "the benchmark Deployment passes")

	durations := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		e.Evaluate(ctx, in)
		durations = append(durations, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(durations)
	b.ReportMetric(float64(durations[len(durations)*99/100].Nanoseconds()), "p99-ns")
	b.ReportMetric(float64(len(raw)), "object-bytes")
}

// BenchmarkInputAndEvaluate adds building the Input from the raw admission
// JSON, which the webhook does once per request.
func BenchmarkInputAndEvaluate(b *testing.B) {
	raw, err := json.Marshal(realisticDeployment())
	require.NoError(b, err)
	e := newEngine(b, Options{}, Builtins()...)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		in, err := NewInput(Request{Operation: "UPDATE", Namespace: "team-a", Name: "shop", Object: raw, OldObject: raw,
			UserInfo: UserInfo{Username: "alice", Groups: []string{"system:authenticated"}}})
		if err != nil {
			b.Fatal(err)
		}
		e.Evaluate(ctx, in)
	}
}
