package policy

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// TestBuiltins evaluates the built-in library through the Engine, as the
// webhook does, on good and bad Deployments. Every built-in ships in warn
// mode: a default install refuses nothing the policies find, it says it.
func TestBuiltins(t *testing.T) {
	e := newEngine(t, Options{}, Builtins()...)

	tests := []struct {
		name     string
		mutate   func(d *appsv1.Deployment)
		warnings []string // rendered findings, in order
	}{
		{
			name:   "good deployment passes",
			mutate: func(*appsv1.Deployment) {},
		},
		{
			name: "latest tag warned",
			mutate: func(d *appsv1.Deployment) {
				d.Spec.Template.Spec.Containers[0].Image = "nginx:latest"
			},
			warnings: []string{`[policy images] spec.template.spec.containers[0].image: image "nginx:latest" of container "web" uses the mutable tag "latest": set a version tag (nginx:<version>) or pin a digest (nginx@sha256:<digest>)`},
		},
		{
			name: "untagged init container warned",
			mutate: func(d *appsv1.Deployment) {
				c := goodContainer("migrate")
				c.Image = "registry.example.com:5000/migrate"
				d.Spec.Template.Spec.InitContainers = []corev1.Container{c}
			},
			warnings: []string{`[policy images] spec.template.spec.initContainers[0].image: image "registry.example.com:5000/migrate" of container "migrate" has no tag, which means "latest": set a version tag (registry.example.com:5000/migrate:<version>) or pin a digest (registry.example.com:5000/migrate@sha256:<digest>)`},
		},
		{
			name: "latest pinned by digest passes",
			mutate: func(d *appsv1.Deployment) {
				d.Spec.Template.Spec.Containers[0].Image = "nginx:latest@sha256:4c0fdaa8b6341bfdeca5f18f7837462c80cff90527ee35ef185571e1c327beac"
			},
		},
		{
			name: "missing readiness probe warned",
			mutate: func(d *appsv1.Deployment) {
				d.Spec.Template.Spec.Containers[1].ReadinessProbe = nil
			},
			warnings: []string{`[policy probes] spec.template.spec.containers[1].readinessProbe: container "sidecar" has no readinessProbe: add one (httpGet, tcpSocket, grpc or exec), or a rollout of pods that cannot serve completes anyway and is never rolled back`},
		},
		{
			name: "missing requests warned once per container",
			mutate: func(d *appsv1.Deployment) {
				d.Spec.Template.Spec.Containers[1].Resources = corev1.ResourceRequirements{}
			},
			warnings: []string{
				`[policy resources] spec.template.spec.containers[1].resources.requests: container "sidecar" has no cpu or memory request: set resources.requests.cpu (for example "100m") and resources.requests.memory (for example "128Mi")`,
			},
		},
		{
			name: "host namespaces warned",
			mutate: func(d *appsv1.Deployment) {
				d.Spec.Template.Spec.HostNetwork = true
				d.Spec.Template.Spec.HostPID = true
			},
			warnings: []string{
				`[policy hostnamespaces] spec.template.spec.hostNetwork: the pod template sets hostNetwork: true, which shares the node's network namespace with the pod: remove hostNetwork or set it to false`,
				`[policy hostnamespaces] spec.template.spec.hostPID: the pod template sets hostPID: true, which shares the node's process namespace with the pod: remove hostPID or set it to false`,
			},
		},
		{
			name: "every problem reported at once",
			mutate: func(d *appsv1.Deployment) {
				d.Spec.Template.Spec.HostIPC = true
				d.Spec.Template.Spec.Containers[0].Image = "nginx"
				d.Spec.Template.Spec.Containers[0].ReadinessProbe = nil
				delete(d.Spec.Template.Spec.Containers[0].Resources.Requests, corev1.ResourceCPU)
			},
			warnings: []string{
				`[policy hostnamespaces] spec.template.spec.hostIPC: the pod template sets hostIPC: true, which shares the node's IPC namespace with the pod: remove hostIPC or set it to false`,
				`[policy images] spec.template.spec.containers[0].image: image "nginx" of container "web" has no tag, which means "latest": set a version tag (nginx:<version>) or pin a digest (nginx@sha256:<digest>)`,
				`[policy probes] spec.template.spec.containers[0].readinessProbe: container "web" has no readinessProbe: add one (httpGet, tcpSocket, grpc or exec), or a rollout of pods that cannot serve completes anyway and is never rolled back`,
				`[policy resources] spec.template.spec.containers[0].resources.requests.cpu: container "web" has no cpu request: set resources.requests.cpu (for example "100m")`,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := deployment(goodContainer("web"), goodContainer("sidecar"))
			tt.mutate(d)
			got := e.Evaluate(context.Background(), createInput(t, d))
			assert.Empty(t, Lines(got.Denied), "denied")
			assert.Equal(t, tt.warnings, Lines(got.Warnings), "warnings")
			assert.Empty(t, got.Audited, "audited")
			assert.True(t, got.Allowed())
		})
	}
}

// TestBuiltinsEnforced: enforcing a built-in is one mode in the options (one
// line of the config file, policy.modes), and then its findings refuse.
func TestBuiltinsEnforced(t *testing.T) {
	e := newEngine(t, Options{PolicyModes: map[string]Mode{"images": ModeEnforce, "resources": ModeEnforce}}, Builtins()...)
	d := deployment(goodContainer("web"), goodContainer("sidecar"))
	d.Spec.Template.Spec.Containers[0].Image = "nginx:latest"
	d.Spec.Template.Spec.Containers[1].Resources = corev1.ResourceRequirements{}
	d.Spec.Template.Spec.HostNetwork = true

	got := e.Evaluate(context.Background(), createInput(t, d))
	assert.False(t, got.Allowed())
	assert.Equal(t, []string{
		`[policy images] spec.template.spec.containers[0].image: image "nginx:latest" of container "web" uses the mutable tag "latest": set a version tag (nginx:<version>) or pin a digest (nginx@sha256:<digest>)`,
		`[policy resources] spec.template.spec.containers[1].resources.requests: container "sidecar" has no cpu or memory request: set resources.requests.cpu (for example "100m") and resources.requests.memory (for example "128Mi")`,
	}, Lines(got.Denied))
	assert.Equal(t, []string{
		`[policy hostnamespaces] spec.template.spec.hostNetwork: the pod template sets hostNetwork: true, which shares the node's network namespace with the pod: remove hostNetwork or set it to false`,
	}, Lines(got.Warnings), "the others stay in warn")
}

// TestBuiltinsOnDelete: a DELETE has no object, and the built-ins judge only
// the object, so deleting a Deployment that breaks them is never refused.
func TestBuiltinsOnDelete(t *testing.T) {
	e := newEngine(t, Options{}, Builtins()...)
	old := deployment(goodContainer("web"))
	old.Spec.Template.Spec.Containers[0].Image = "nginx:latest"
	in, err := NewInput(Request{Operation: "DELETE", Namespace: "team-a", Name: "shop", OldObject: old})
	assert.NoError(t, err)
	got := e.Evaluate(context.Background(), in)
	assert.True(t, got.Allowed())
	assert.Empty(t, got.Warnings)
}

// TestBuiltinsDisabled: Options.Disabled takes a built-in out by name.
func TestBuiltinsDisabled(t *testing.T) {
	e := newEngine(t, Options{Disabled: []string{"images", "probes"}}, Builtins()...)
	d := deployment(goodContainer("web"))
	d.Spec.Template.Spec.Containers[0].Image = "nginx:latest"
	d.Spec.Template.Spec.Containers[0].ReadinessProbe = nil

	got := e.Evaluate(context.Background(), createInput(t, d))
	assert.True(t, got.Allowed())
	assert.Empty(t, got.Warnings)
	var names []string
	for _, p := range e.Policies() {
		names = append(names, p.Name)
	}
	assert.Equal(t, []string{"hostnamespaces", "resources"}, names)
}
