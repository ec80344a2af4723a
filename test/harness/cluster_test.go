package harness

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"
)

// kwokctl replaces, not merges, the componentsPatches of several --config
// files: the controller manager's flag must land in the one file a caller
// names, beside that caller's own arguments for it.
func TestControllerIdentitiesJoinTheCallersConfiguration(t *testing.T) {
	for _, tc := range []struct {
		name   string
		config string // "" none
		// want: each component's extra args, by key.
		want map[string][]string
	}{
		{"no configuration of the caller's", "", map[string][]string{
			"kube-controller-manager": {"use-service-account-credentials"}}},
		{"the client-auth configuration (kube-apiserver alone)", `apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokctlConfiguration
componentsPatches:
- name: kube-apiserver
  extraArgs:
  - key: admission-control-config-file
    value: /x/admission.yaml
`, map[string][]string{
			"kube-apiserver":          {"admission-control-config-file"},
			"kube-controller-manager": {"use-service-account-credentials"}}},
		{"the node's (kube-controller-manager too)", nodeKwokctlConfig, map[string][]string{
			"kube-apiserver":          {"advertise-address", "service-cluster-ip-range", "kubelet-preferred-address-types"},
			"kube-controller-manager": {"service-cluster-ip-range", "use-service-account-credentials"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			args := []string{"--disable", "kwok-controller"}
			if tc.config != "" {
				p := filepath.Join(dir, "kwokctl.yaml")
				require.NoError(t, os.WriteFile(p, []byte(tc.config), 0o644))
				args = append(args, "--config", p)
			}
			got, err := withControllerIdentities(args, dir)
			require.NoError(t, err)
			var configs []string
			for i := range got {
				if got[i] == "--config" {
					configs = append(configs, got[i+1])
				}
			}
			require.Len(t, configs, 1, "one configuration: %v", got)
			assert.Equal(t, []string{"--disable", "kwok-controller"}, got[:2])
			raw, err := os.ReadFile(configs[0])
			require.NoError(t, err)
			var cfg struct {
				APIVersion        string `json:"apiVersion"`
				Kind              string `json:"kind"`
				ComponentsPatches []struct {
					Name      string `json:"name"`
					ExtraArgs []struct {
						Key, Value string
					} `json:"extraArgs"`
				} `json:"componentsPatches"`
				Options map[string]any `json:"options"`
			}
			require.NoError(t, yaml.UnmarshalStrict(raw, &cfg), "%s", raw)
			assert.Equal(t, "KwokctlConfiguration", cfg.Kind)
			have := map[string][]string{}
			for _, p := range cfg.ComponentsPatches {
				for _, a := range p.ExtraArgs {
					have[p.Name] = append(have[p.Name], a.Key)
				}
			}
			assert.Equal(t, tc.want, have)
			if tc.config == nodeKwokctlConfig {
				assert.Equal(t, "0.0.0.0", cfg.Options["bindAddress"], "the caller's options are kept")
			}
		})
	}
}
