package integration

import (
	"bufio"
	"bytes"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/deployguard/deployguard/test/harness"
)

// config/default renders with the cluster's own kubectl, wires cert-manager's
// CA injection into both webhook configurations, and runs the guard hardened.
func TestDefaultInstallRenders(t *testing.T) {
	tools, err := harness.ToolsDir("kubectl")
	require.NoError(t, err)
	out, err := exec.Command(filepath.Join(tools, "kubectl"), "kustomize", filepath.Join(harness.RepoRoot(), "config", "default")).CombinedOutput()
	require.NoError(t, err, "%s", out)

	kinds := map[string]int{}
	var guard *appsv1.Deployment
	rd := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(out)))
	for {
		doc, err := rd.Read()
		if err != nil {
			break
		}
		var obj struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name        string            `json:"name"`
				Namespace   string            `json:"namespace"`
				Annotations map[string]string `json:"annotations"`
			} `json:"metadata"`
		}
		require.NoError(t, yaml.Unmarshal(doc, &obj))
		kinds[obj.Kind]++
		switch obj.Kind {
		case "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration":
			assert.Equal(t, "deployguard-system/deployguard-webhook-tls", obj.Metadata.Annotations["cert-manager.io/inject-ca-from"], obj.Kind)
		case "Deployment":
			guard = &appsv1.Deployment{}
			require.NoError(t, yaml.Unmarshal(doc, guard))
		}
	}
	for _, k := range []string{"Namespace", "ServiceAccount", "ClusterRole", "Service", "Deployment", "Issuer", "Certificate", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"} {
		assert.Positive(t, kinds[k], "config/default renders a %s", k)
	}
	require.NotNil(t, guard)
	c := guard.Spec.Template.Spec.Containers[0]
	require.NotNil(t, c.SecurityContext)
	assert.True(t, *c.SecurityContext.ReadOnlyRootFilesystem)
	assert.False(t, *c.SecurityContext.AllowPrivilegeEscalation)
	assert.True(t, *guard.Spec.Template.Spec.SecurityContext.RunAsNonRoot)
	assert.GreaterOrEqual(t, *guard.Spec.Replicas, int32(2), "several replicas serve the webhooks")
}
