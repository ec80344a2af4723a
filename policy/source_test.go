package policy

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestFromDir(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) {
		t.Helper()
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644))
	}
	write("b.rego", "package deployguard.b")
	write("a.rego", "package deployguard.a")
	write("a_test.rego", "package deployguard.a")
	write("notes.md", "not rego")
	write("..2024_01_01/a.rego", "an older copy of a mounted ConfigMap")
	// A mounted ConfigMap: the visible file is a symlink into ..data.
	write("..data_target/c.rego", "package deployguard.c")
	require.NoError(t, os.Symlink(filepath.Join(dir, "..data_target/c.rego"), filepath.Join(dir, "c.rego")))

	got, err := FromDir(dir)
	require.NoError(t, err)
	assert.Equal(t, []Source{
		{Name: filepath.Join(dir, "a.rego"), Module: "package deployguard.a"},
		{Name: filepath.Join(dir, "b.rego"), Module: "package deployguard.b"},
		{Name: filepath.Join(dir, "c.rego"), Module: "package deployguard.c"},
	}, got)

	_, err = FromDir(filepath.Join(dir, "missing"))
	assert.Error(t, err)
}

func TestFromConfigMap(t *testing.T) {
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: "deployguard-system", Name: "team-rules"},
		Data: map[string]string{
			"replicas.rego":    "package deployguard.replicas",
			"labels.rego":      "package deployguard.labels",
			"labels_test.rego": "package deployguard.labels",
			"README.md":        "how to",
		},
	}
	assert.Equal(t, []Source{
		{Name: "configmap/deployguard-system/team-rules/labels.rego", Module: "package deployguard.labels"},
		{Name: "configmap/deployguard-system/team-rules/replicas.rego", Module: "package deployguard.replicas"},
	}, FromConfigMap(cm))
}
