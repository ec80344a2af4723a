package main

import (
	"bufio"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/deployguard/deployguard/reconciler/analysis/checks"
	"github.com/deployguard/deployguard/test/harness"
	"github.com/deployguard/deployguard/test/image"
)

func TestParseFlags(t *testing.T) {
	for _, tc := range []struct {
		name     string
		args     []string
		wantNode string
		errHas   string
	}{
		{name: "kwok by default", wantNode: "kwok"},
		{name: "a real node", args: []string{"--node=real", "--workdir", "bin/local-node"}, wantNode: "real"},
		{name: "another node", args: []string{"--node=kind"}, errHas: `--node="kind": want kwok or real`},
		{name: "an argument", args: []string{"real"}, errHas: `unexpected arguments ["real"]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parseFlags(tc.args)
			if tc.errHas != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.errHas)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.wantNode, o.node)
		})
	}
}

// Without root a real node stops before anything starts, saying why.
func TestRealNodeNeedsRoot(t *testing.T) {
	err := requireRoot(1000)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "runs as root")
	assert.Contains(t, err.Error(), "network namespace")
	assert.Contains(t, err.Error(), "kubelet")
	assert.NoError(t, requireRoot(0))
}

func TestParentPID(t *testing.T) {
	for _, tc := range []struct {
		name, stat string
		want       int
		ok         bool
	}{
		{name: "plain", stat: "4242 (localrun) S 4241 4242 4000 0", want: 4241, ok: true},
		{name: "spaces and parentheses in the name", stat: "17 (a (b) c) R 1 17 17 0", want: 1, ok: true},
		{name: "truncated", stat: "17 (x", ok: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := parentPID(tc.stat)
			assert.Equal(t, tc.ok, ok)
			assert.Equal(t, tc.want, got)
		})
	}
}

// The samples `make run NODE=real` applies and prints fit together and fit
// the real node: the check is valid and selects the app; the app's images
// are tags the node's registry holds (v1, and errors, which the printed
// `kubectl set image` names for the container "app", the one Prometheus
// scrapes); the Service reaches the app's port.
func TestRealNodeSamples(t *testing.T) {
	var check checks.ClusterDeploymentCheck
	b, err := os.ReadFile(filepath.Join(harness.RepoRoot(), checkSample))
	require.NoError(t, err)
	require.NoError(t, yaml.UnmarshalStrict(b, &check))

	var ns corev1.Namespace
	var d appsv1.Deployment
	var svc corev1.Service
	f, err := os.Open(filepath.Join(harness.RepoRoot(), appSample))
	require.NoError(t, err)
	defer f.Close()
	docs := utilyaml.NewYAMLReader(bufio.NewReader(f))
	for _, into := range []any{&ns, &d, &svc} {
		doc, err := docs.Read()
		require.NoError(t, err)
		require.NoError(t, yaml.UnmarshalStrict(doc, into))
	}
	_, err = docs.Read()
	assert.ErrorIs(t, err, io.EOF, "three objects")

	assert.Equal(t, appNS, ns.Name)
	assert.Equal(t, appNS, d.Namespace)
	assert.Equal(t, appName, d.Name)
	assert.Equal(t, appName, svc.Name)
	metrics, invalid := checks.Select(&d, ns.Labels, &checks.Library{}, []checks.ClusterDeploymentCheck{check}, nil)
	assert.Empty(t, invalid)
	require.Len(t, metrics, 1, "the check selects the app")
	assert.Equal(t, "ClusterDeploymentCheck/error-rate/error-rate", metrics[0].Key())

	var tags []string
	for _, tag := range image.AppTags() {
		tags = append(tags, tag.Tag)
	}
	assert.Subset(t, tags, []string{"v1", "errors"})
	require.Len(t, d.Spec.Template.Spec.Containers, 1)
	c := d.Spec.Template.Spec.Containers[0]
	assert.Equal(t, "app", c.Name)
	assert.Equal(t, harness.Registry+"/"+image.AppRepository+":v1", c.Image)
	require.Len(t, svc.Spec.Ports, 1)
	assert.Equal(t, image.AppPort, svc.Spec.Ports[0].TargetPort.IntValue())
	assert.Equal(t, d.Spec.Selector.MatchLabels, svc.Spec.Selector)
}
