package yamlpath

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	yaml "go.yaml.in/yaml/v3"
)

func TestSplit(t *testing.T) {
	assert.Equal(t, []string{"spec", "template", "spec", "containers", "0", "image"}, Split("spec.template.spec.containers[0].image"))
	assert.Equal(t, []string{"metadata", "labels", "app.kubernetes.io/name"}, Split("metadata.labels[app.kubernetes.io/name]"))
	assert.Equal(t, []string{"selector", "stableLabelKeys", "1"}, Split("selector.stableLabelKeys[1]"))
	assert.Empty(t, Split(""))
}

func TestLine(t *testing.T) {
	const doc = `kind: Deployment
metadata:
  labels:
    app.kubernetes.io/name: web
spec:
  template:
    spec:
      containers:
      - name: sidecar
        image: proxy:1
      - name: web
        image: web:1
`
	var root yaml.Node
	require.NoError(t, yaml.Unmarshal([]byte(doc), &root))
	tests := []struct {
		name, path string
		line       int
		exact      bool
	}{
		{"a scalar", "kind", 1, true},
		{"a mapping: its key's line", "spec.template", 6, true},
		{"a key with dots", "metadata.labels[app.kubernetes.io/name]", 4, true},
		{"a list element", "spec.template.spec.containers[1].image", 12, true},
		{"a missing field: its nearest ancestor", "spec.template.spec.containers[1].resources", 11, false},
		{"none of it", "status.replicas", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			line, exact := Line(&root, Split(tt.path))
			assert.Equal(t, tt.line, line)
			assert.Equal(t, tt.exact, exact)
		})
	}
	line, exact := Line(&root, []string{"spec", "template", "spec", "containers", "name=web", "image"})
	assert.Equal(t, 12, line, "an element by its name")
	assert.True(t, exact)
}
