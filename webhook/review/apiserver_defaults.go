package review

import (
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// APIServerDefaults applies the API server's built-in defaults for apps/v1
// Deployments (k8s.io/kubernetes pkg/apis/apps/v1 and core/v1 defaulting) to a
// manifest, so that the offline check sees what the webhooks would see. It
// covers the fields the guard's checks and the built-in policies read.
func APIServerDefaults(d *appsv1.Deployment) {
	s := &d.Spec
	orDefault(&s.Replicas, ptr(int32(1)))
	orDefault(&s.Strategy.Type, appsv1.RollingUpdateDeploymentStrategyType)
	if s.Strategy.Type == appsv1.RollingUpdateDeploymentStrategyType {
		orDefault(&s.Strategy.RollingUpdate, &appsv1.RollingUpdateDeployment{})
		orDefault(&s.Strategy.RollingUpdate.MaxUnavailable, ptr(intstr.FromString("25%")))
		orDefault(&s.Strategy.RollingUpdate.MaxSurge, ptr(intstr.FromString("25%")))
	}
	orDefault(&s.RevisionHistoryLimit, ptr(builtinRevisionHistoryLimit))
	orDefault(&s.ProgressDeadlineSeconds, ptr(builtinProgressDeadlineSeconds))
	podSpecDefaults(&s.Template.Spec)
}

func podSpecDefaults(p *corev1.PodSpec) {
	orDefault(&p.RestartPolicy, corev1.RestartPolicyAlways)
	orDefault(&p.DNSPolicy, corev1.DNSClusterFirst)
	orDefault(&p.SchedulerName, corev1.DefaultSchedulerName)
	orDefault(&p.TerminationGracePeriodSeconds, ptr(int64(corev1.DefaultTerminationGracePeriodSeconds)))
	orDefault(&p.SecurityContext, &corev1.PodSecurityContext{})
	for i := range p.InitContainers {
		containerDefaults(&p.InitContainers[i])
	}
	for i := range p.Containers {
		containerDefaults(&p.Containers[i])
	}
}

func containerDefaults(c *corev1.Container) {
	orDefault(&c.TerminationMessagePath, corev1.TerminationMessagePathDefault)
	orDefault(&c.TerminationMessagePolicy, corev1.TerminationMessageReadFile)
	if c.ImagePullPolicy == "" {
		c.ImagePullPolicy = corev1.PullIfNotPresent
		if latestOrUntagged(c.Image) {
			c.ImagePullPolicy = corev1.PullAlways
		}
	}
	for i := range c.Ports {
		orDefault(&c.Ports[i].Protocol, corev1.ProtocolTCP)
	}
	for _, p := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe, c.StartupProbe} {
		probeDefaults(p)
	}
}

func probeDefaults(p *corev1.Probe) {
	if p == nil {
		return
	}
	orDefault(&p.TimeoutSeconds, 1)
	orDefault(&p.PeriodSeconds, 10)
	orDefault(&p.SuccessThreshold, 1)
	orDefault(&p.FailureThreshold, 3)
	if p.HTTPGet != nil {
		orDefault(&p.HTTPGet.Scheme, corev1.URISchemeHTTP)
	}
}

// orDefault sets a field the manifest leaves unset (its zero value: "", 0 or
// nil) to the API server's default.
func orDefault[T comparable](field *T, def T) {
	var unset T
	if *field == unset {
		*field = def
	}
}

// latestOrUntagged mirrors the API server's rule for imagePullPolicy: Always
// for an image with no tag or the :latest tag, unless pinned by digest.
func latestOrUntagged(image string) bool {
	if strings.Contains(image, "@") {
		return false
	}
	name := image[strings.LastIndex(image, "/")+1:]
	i := strings.LastIndex(name, ":")
	return i < 0 || name[i+1:] == "latest"
}

func ptr[T any](v T) *T { return &v }
