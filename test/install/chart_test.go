package install

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/deployguard/deployguard/cmd/deployguard/config"
	"github.com/deployguard/deployguard/test/harness"
)

const release = "deployguard"

func chartDir() string { return filepath.Join(harness.RepoRoot(), "config", "helm", "deployguard") }

// helm runs the helm built by `make tools` with its state in a temporary
// folder, and returns its standard output.
func helm(t *testing.T, args ...string) []byte {
	t.Helper()
	home := t.TempDir()
	cmd := exec.Command(filepath.Join(tools, "helm"), args...)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"), "HELM_DATA_HOME="+filepath.Join(home, "data"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "helm %s\n%s%s", strings.Join(args, " "), stdout.String(), stderr.String())
	return stdout.Bytes()
}

// helmTemplate renders the chart as for this tier's cluster, Kubernetes
// 1.36: offline, helm knows no MutatingAdmissionPolicy unless told.
func helmTemplate(t *testing.T, namespace string, values ...string) []byte {
	return helm(t, append([]string{"template", release, chartDir(), "--namespace", namespace,
		"--api-versions", "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"}, values...)...)
}

// On an older cluster the chart leaves the selector repair out, and keeps
// the refusals.
func TestChartWithoutMutatingAdmissionPolicies(t *testing.T) {
	out := string(helm(t, "template", release, chartDir(), "--namespace", "deployguard-system"))
	assert.NotContains(t, out, "kind: MutatingAdmissionPolicy")
	assert.Contains(t, out, "kind: ValidatingAdmissionPolicyBinding")
	assert.Contains(t, out, "name: deployguard-refusals")
}

// kustomize renders config/<dir> with the cluster's kubectl, as
// `kubectl apply -k` would.
func kustomize(t *testing.T, dirs ...string) []byte {
	t.Helper()
	var all []byte
	for _, d := range dirs {
		out, err := exec.Command(filepath.Join(tools, "kubectl"), "kustomize", filepath.Join(harness.RepoRoot(), "config", d)).Output()
		require.NoError(t, err, "kubectl kustomize config/%s", d)
		all = append(append(all, "\n---\n"...), out...)
	}
	return all
}

// object is one rendered manifest, as generic JSON.
type object = map[string]any

// objects parses a multi-document YAML stream into objects keyed by
// kind/namespace/name, after normalize.
func objects(b []byte) (map[string]object, error) {
	out := map[string]object{}
	rd := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
	for {
		doc, err := rd.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		var o object
		if err := yaml.Unmarshal(doc, &o); err != nil {
			return nil, err
		}
		if len(o) == 0 {
			continue
		}
		if err := normalize(o); err != nil {
			return nil, err
		}
		key := objectKey(o)
		if _, dup := out[key]; dup {
			return nil, fmt.Errorf("%s rendered twice", key)
		}
		out[key] = o
	}
}

func objectKey(o object) string {
	return fmt.Sprintf("%s/%s/%s", o["kind"], str(o, "metadata", "namespace"), str(o, "metadata", "name"))
}

// kustomizeHashed is config/manager's generated ConfigMap name with
// kustomize's content hash.
var kustomizeHashed = regexp.MustCompile(`^(deployguard-config)-[a-z0-9]{10}$`)

// normalize removes what only tells the two renderings apart, never what a
// cluster would run differently: the labels Helm adds, the chart's config
// checksum annotation (which rolls the Deployment as kustomize's hashed
// ConfigMap name does), that hash, and the formatting of embedded files
// (guard.yaml and dashboard.json are compared as data, CEL expressions with
// their white space collapsed: kustomize turns the folded lines of
// config/webhook's matchConditions and config/native's expressions into
// blank lines, which CEL ignores).
func normalize(o object) error {
	md, _ := o["metadata"].(map[string]any)
	if md == nil {
		return fmt.Errorf("an object without metadata: %v", o)
	}
	deleteEmpty(md, "labels", "app.kubernetes.io/managed-by", "helm.sh/chart")
	if k := o["kind"]; k == "ValidatingAdmissionPolicy" || k == "ValidatingAdmissionPolicyBinding" ||
		k == "MutatingAdmissionPolicy" || k == "MutatingAdmissionPolicyBinding" {
		// Cluster-scoped, which kustomize's namespace transformer does not
		// know; the API server clears the namespace it adds.
		delete(md, "namespace")
		spec, _ := o["spec"].(map[string]any)
		for _, list := range []string{"variables", "validations", "matchConditions"} {
			items, _ := spec[list].([]any)
			for _, it := range items {
				if m, _ := it.(map[string]any); m != nil {
					for _, k := range []string{"expression", "messageExpression", "message"} {
						if _, ok := m[k]; ok {
							m[k] = strings.Join(strings.Fields(str(m, k)), " ")
						}
					}
				}
			}
		}
		mutations, _ := spec["mutations"].([]any)
		for _, mu := range mutations {
			if jp, _ := dig(mu, "jsonPatch").(map[string]any); jp != nil {
				jp["expression"] = strings.Join(strings.Fields(str(jp, "expression")), " ")
			}
		}
	}
	if whs, _ := o["webhooks"].([]any); whs != nil {
		for _, wh := range whs {
			conds, _ := dig(wh, "matchConditions").([]any)
			for _, c := range conds {
				if m, _ := c.(map[string]any); m != nil {
					m["expression"] = strings.Join(strings.Fields(str(m, "expression")), " ")
				}
			}
		}
	}
	if name, _ := md["name"].(string); o["kind"] == "ConfigMap" {
		md["name"] = kustomizeHashed.ReplaceAllString(name, "$1")
		data, _ := o["data"].(map[string]any)
		for k, v := range data {
			s, _ := v.(string)
			var parsed any
			switch filepath.Ext(k) {
			case ".yaml":
				if err := yaml.Unmarshal([]byte(s), &parsed); err != nil {
					return fmt.Errorf("ConfigMap %s key %s: %w", name, k, err)
				}
			case ".json":
				if err := json.Unmarshal([]byte(s), &parsed); err != nil {
					return fmt.Errorf("ConfigMap %s key %s: %w", name, k, err)
				}
			default:
				continue
			}
			data[k] = parsed
		}
	}
	if o["kind"] != "Deployment" {
		return nil
	}
	tmpl, _ := dig(o, "spec", "template").(map[string]any)
	if tm, _ := tmpl["metadata"].(map[string]any); tm != nil {
		deleteEmpty(tm, "annotations", "checksum/config")
	}
	vols, _ := dig(o, "spec", "template", "spec", "volumes").([]any)
	for _, v := range vols {
		if cm, _ := v.(map[string]any)["configMap"].(map[string]any); cm != nil {
			cm["name"] = kustomizeHashed.ReplaceAllString(cm["name"].(string), "$1")
		}
	}
	return nil
}

// deleteEmpty deletes keys from the map at m[field], and the map itself once
// it is empty.
func deleteEmpty(m map[string]any, field string, keys ...string) {
	sub, _ := m[field].(map[string]any)
	if sub == nil {
		return
	}
	for _, k := range keys {
		delete(sub, k)
	}
	if len(sub) == 0 {
		delete(m, field)
	}
}

func dig(o any, path ...string) any {
	for _, p := range path {
		m, _ := o.(map[string]any)
		if m == nil {
			return nil
		}
		o = m[p]
	}
	return o
}

func str(o any, path ...string) string {
	s, _ := dig(o, path...).(string)
	return s
}

func sortedKeys(m map[string]object) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// The chart with default values installs exactly what the kustomize bases
// install, object by object and field by field: one source of truth for what
// runs, whichever way it is installed. A change to config/ that the chart
// does not follow (or the other way round) fails here.
func TestChartMatchesKustomize(t *testing.T) {
	monitoring := []string{"--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.prometheusRule.enabled=true", "--set", "metrics.dashboard.enabled=true"}
	for _, tc := range []struct {
		name   string
		values []string
		bases  []string
	}{
		{name: "cert-manager is config/default", bases: []string{"default"}},
		{name: "self-managed is config/self-managed", values: []string{"--set", "certificates.mode=self-managed"}, bases: []string{"self-managed"}},
		{name: "monitoring on is config/default and config/monitoring", values: monitoring, bases: []string{"default", "monitoring"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The kustomize bases hold the namespace; the chart renders it on
			// request (helm install cannot create its own release namespace).
			values := append([]string{"--set", "createNamespace=true"}, tc.values...)
			chart, err := objects(helmTemplate(t, harness.GuardNamespace, values...))
			require.NoError(t, err)
			kust, err := objects(kustomize(t, tc.bases...))
			require.NoError(t, err)
			require.Equal(t, sortedKeys(kust), sortedKeys(chart), "the same objects")
			for _, k := range sortedKeys(kust) {
				assert.Equal(t, kust[k], chart[k], "%s: the chart (right) differs from kustomize (left)", k)
			}
		})
	}
}

// valueSet is one way a platform team installs the chart.
type valueSet struct {
	name      string
	namespace string
	values    []string
	check     func(t *testing.T, objs map[string]object)
}

func valueSets() []valueSet {
	team := filepath.Join(harness.RepoRoot(), "test", "install", "testdata", "team.rego")
	return []valueSet{{
		name: "defaults", namespace: harness.GuardNamespace,
		check: func(t *testing.T, objs map[string]object) {
			for _, k := range []string{"Certificate/deployguard-system/deployguard-webhook-tls",
				"PodDisruptionBudget/deployguard-system/deployguard", "Deployment/deployguard-system/deployguard"} {
				assert.Contains(t, objs, k)
			}
			// helm install --create-namespace makes it: Helm stores the
			// release there before it creates anything.
			assert.NotContains(t, objs, "Namespace//deployguard-system")
			for k := range objs {
				assert.False(t, strings.HasPrefix(k, "ServiceMonitor/") || strings.HasPrefix(k, "PrometheusRule/"), "monitoring is off by default: %s", k)
			}
		},
	}, {
		name: "rendered for a tool that applies it (createNamespace)", namespace: harness.GuardNamespace,
		values: []string{"--set", "createNamespace=true"},
		check: func(t *testing.T, objs map[string]object) {
			ns := objs["Namespace//deployguard-system"]
			require.NotNil(t, ns, "the release namespace, rendered")
			assert.Equal(t, "disabled", str(ns, "metadata", "labels", "deployguard.io/guard"))
			for _, mode := range []string{"enforce", "audit", "warn"} {
				assert.Equal(t, "restricted", str(ns, "metadata", "labels", "pod-security.kubernetes.io/"+mode), "Pod Security %s", mode)
			}
		},
	}, {
		name: "cert-manager in a namespace of its own", namespace: "guard-cm",
		check: func(t *testing.T, objs map[string]object) {
			cert := objs["Certificate/guard-cm/deployguard-webhook-tls"]
			require.NotNil(t, cert)
			assert.Equal(t, []any{"deployguard-webhook.guard-cm.svc", "deployguard-webhook.guard-cm.svc.cluster.local"}, dig(cert, "spec", "dnsNames"),
				"the certificate names the Service in the release namespace")
			assert.Equal(t, "guard-cm/deployguard-webhook-tls", str(objs["ValidatingWebhookConfiguration//deployguard-validating"], "metadata", "annotations", "cert-manager.io/inject-ca-from"))
			assert.NotContains(t, container(t, objs, "guard-cm").Args, "--cert-mode=self-managed")
		},
	}, {
		name: "self-managed in a namespace of its own", namespace: "platform-guard",
		values: []string{"--set", "certificates.mode=self-managed"},
		check: func(t *testing.T, objs map[string]object) {
			c := container(t, objs, "platform-guard")
			assert.Contains(t, c.Args, "--cert-mode=self-managed")
			assert.Contains(t, c.Args, "--cert-dns-names=deployguard-webhook.platform-guard.svc", "the certificate names the Service in the release namespace")
			for k := range objs {
				assert.False(t, strings.HasPrefix(k, "Certificate/") || strings.HasPrefix(k, "Issuer/"), "no cert-manager objects: %s", k)
			}
			for _, kind := range []string{"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"} {
				wc := objs[kind+"//deployguard-"+map[string]string{"MutatingWebhookConfiguration": "mutating", "ValidatingWebhookConfiguration": "validating"}[kind]]
				require.NotNil(t, wc, kind)
				assert.Empty(t, dig(wc, "metadata", "annotations"), "%s: no cert-manager CA injection", kind)
				wh := dig(wc, "webhooks").([]any)[0]
				assert.Equal(t, "platform-guard", str(wh, "clientConfig", "service", "namespace"))
				assert.Contains(t, dig(wh, "namespaceSelector", "matchExpressions").([]any)[0].(map[string]any)["values"], "platform-guard", "%s: the guard's own namespace is excluded", kind)
				assert.Contains(t, str(dig(wh, "matchConditions").([]any)[0], "expression"), `"platform-guard"`, kind)
			}
			assert.Equal(t, "platform-guard", str(objs["ClusterRoleBinding//deployguard"]["subjects"].([]any)[0], "namespace"))
			assert.Equal(t, "platform-guard", str(objs["ClusterRoleBinding//deployguard-metrics-auth"]["subjects"].([]any)[0], "namespace"))
			// PolicyExceptions are read in the release namespace only.
			exRole := objs["Role/platform-guard/deployguard-exceptions-reader"]
			require.NotNil(t, exRole, "the exceptions Role, in the release namespace")
			assert.Equal(t, []any{"list", "watch"}, dig(dig(exRole, "rules").([]any)[0], "verbs"))
			for _, rule := range dig(objs["ClusterRole//deployguard"], "rules").([]any) {
				assert.NotContains(t, dig(rule, "resources"), "policyexceptions", "no cluster-wide PolicyException rights")
			}
		},
	}, {
		name: "sized and tuned with a team policy", namespace: harness.GuardNamespace,
		values: []string{
			"--set", "replicas=3", "--set", "resources.limits.memory=1Gi",
			"--set", "image.repository=registry.example.com/deployguard", "--set-string", "image.tag=1.2.3",
			"--set", "webhooks.validating.failurePolicy=Ignore", "--set", "webhooks.validating.timeoutSeconds=5",
			"--set", "webhooks.mutating.failurePolicy=Fail", "--set", "webhooks.excludedNamespaces={kube-system,batch}",
			"--set", "podDisruptionBudget.enabled=false", "--set", "createNamespace=false",
			"--set", "config.policy.modes.resources=enforce", "--set", "config.cleanup.steps={record}",
			"--set-file", `policies.team-policy.team\.rego=` + team,
		},
		check: func(t *testing.T, objs map[string]object) {
			d := objs["Deployment/deployguard-system/deployguard"]
			assert.EqualValues(t, 3, dig(d, "spec", "replicas"))
			c := container(t, objs, harness.GuardNamespace)
			assert.Equal(t, "registry.example.com/deployguard:1.2.3", c.Image)
			assert.Equal(t, "1Gi", c.Resources.Limits.Memory().String())
			var memEnv *corev1.EnvVar
			for i := range c.Env {
				if c.Env[i].Name == "DEPLOYGUARD_MEMORY_LIMIT" {
					memEnv = &c.Env[i]
				}
			}
			require.NotNil(t, memEnv, "the soft memory limit follows the container's")
			require.NotNil(t, memEnv.ValueFrom)
			assert.Equal(t, "limits.memory", memEnv.ValueFrom.ResourceFieldRef.Resource)

			v := dig(objs["ValidatingWebhookConfiguration//deployguard-validating"], "webhooks").([]any)[0]
			assert.Equal(t, "Ignore", str(v, "failurePolicy"))
			assert.EqualValues(t, 5, dig(v, "timeoutSeconds"))
			assert.Equal(t, []any{"kube-system", "batch", "deployguard-system"}, dig(v, "namespaceSelector", "matchExpressions").([]any)[0].(map[string]any)["values"])
			assert.Equal(t, `!(request.namespace in ["kube-system", "batch", "deployguard-system"])`, str(dig(v, "matchConditions").([]any)[0], "expression"))
			m := dig(objs["MutatingWebhookConfiguration//deployguard-mutating"], "webhooks").([]any)[0]
			assert.Equal(t, "Fail", str(m, "failurePolicy"))
			for _, mc := range dig(m, "matchConditions").([]any) {
				assert.NotEqual(t, "guard-may-change-it", str(mc, "name"), "cleanup.steps for every Deployment: the mutating webhook is called for every one")
			}

			cfg, err := config.Parse(guardYAML(t, objs, harness.GuardNamespace))
			require.NoError(t, err, "the values block is a valid GuardConfig")
			assert.Equal(t, "enforce", fmt.Sprint(cfg.Policy.Modes["resources"]))
			assert.Len(t, cfg.Cleanup.Steps, 1)

			policyCM := objs["ConfigMap/deployguard-system/team-policy"]
			require.NotNil(t, policyCM, "the policy from --set-file")
			assert.Equal(t, "true", str(policyCM, "metadata", "labels", "deployguard.io/policy"))
			want, err := os.ReadFile(team)
			require.NoError(t, err)
			assert.Equal(t, string(want), str(policyCM, "data", "team.rego"))
			assert.NotContains(t, objs, "PodDisruptionBudget/deployguard-system/deployguard")
			assert.NotContains(t, objs, "Namespace//deployguard-system")
		},
	}, {
		name: "monitoring for a kube-prometheus-stack", namespace: harness.GuardNamespace,
		values: []string{"--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.serviceMonitor.labels.release=kube-prometheus-stack",
			"--set", "metrics.prometheusRule.enabled=true", "--set", "metrics.prometheusRule.labels.release=kube-prometheus-stack",
			"--set", "metrics.dashboard.enabled=true",
			"--set", "metrics.readers[0].name=prometheus-k8s", "--set", "metrics.readers[0].namespace=monitoring"},
		check: func(t *testing.T, objs map[string]object) {
			sm := objs["ServiceMonitor/deployguard-system/deployguard"]
			require.NotNil(t, sm)
			assert.Equal(t, "kube-prometheus-stack", str(sm, "metadata", "labels", "release"))
			ep := dig(sm, "spec", "endpoints").([]any)[0]
			assert.Equal(t, "https", str(ep, "scheme"), "metrics behind TLS")
			assert.Equal(t, "/var/run/secrets/kubernetes.io/serviceaccount/token", str(ep, "bearerTokenFile"), "Prometheus sends its ServiceAccount token")
			assert.Equal(t, "deployguard-webhook.deployguard-system.svc", str(ep, "tlsConfig", "serverName"), "the name on the webhook's certificate")
			assert.Equal(t, "deployguard-webhook-tls", str(ep, "tlsConfig", "ca", "secret", "name"))
			assert.Equal(t, "ca.crt", str(ep, "tlsConfig", "ca", "secret", "key"))
			assert.NotContains(t, container(t, objs, harness.GuardNamespace).Args, "--metrics-secure=false")
			assert.Contains(t, objs, "ClusterRole//deployguard-metrics-reader")
			crb := objs["ClusterRoleBinding//deployguard-metrics-reader"]
			require.NotNil(t, crb, "metrics.readers bound to the reader role")
			assert.Equal(t, []any{map[string]any{"kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": "monitoring"}}, dig(crb, "subjects"))
			svc := objs["Service/deployguard-system/deployguard-metrics"]
			require.NotNil(t, svc, "the ServiceMonitor's Service")
			for k, v := range dig(sm, "spec", "selector", "matchLabels").(map[string]any) {
				assert.Equal(t, v, str(svc, "metadata", "labels", k), "the ServiceMonitor selects the metrics Service")
			}
			assert.Equal(t, "kube-prometheus-stack", str(objs["PrometheusRule/deployguard-system/deployguard"], "metadata", "labels", "release"))
			assert.Equal(t, "1", str(objs["ConfigMap/deployguard-system/deployguard-dashboard"], "metadata", "labels", "grafana_dashboard"))
		},
	}, {
		name: "metrics in plain HTTP and exceptions in another namespace", namespace: harness.GuardNamespace,
		values: []string{"--set", "metrics.secure=false", "--set", "metrics.serviceMonitor.enabled=true",
			"--set", "config.exceptions.namespace=default"},
		check: func(t *testing.T, objs map[string]object) {
			assert.Contains(t, container(t, objs, harness.GuardNamespace).Args, "--metrics-secure=false")
			ep := dig(objs["ServiceMonitor/deployguard-system/deployguard"], "spec", "endpoints").([]any)[0]
			assert.Empty(t, str(ep, "scheme"), "plain HTTP")
			assert.Nil(t, dig(ep, "tlsConfig"))
			assert.Empty(t, str(ep, "bearerTokenFile"))
			assert.NotContains(t, objs, "ClusterRole//deployguard-metrics-auth", "no token to review")
			assert.NotContains(t, objs, "ClusterRoleBinding//deployguard-metrics-auth")
			assert.Contains(t, objs, "Role/default/deployguard-exceptions-reader", "the exceptions Role follows exceptions.namespace")
			rb := objs["RoleBinding/default/deployguard-exceptions-reader"]
			require.NotNil(t, rb)
			assert.Equal(t, harness.GuardNamespace, str(dig(rb, "subjects").([]any)[0], "namespace"))
			assert.NotContains(t, objs, "Role/deployguard-system/deployguard-exceptions-reader")
		},
	}, {
		name: "a network policy: the API server's nodes and a tunnel's pods, metrics from the monitoring namespace", namespace: "platform-guard",
		values: []string{"--set", "networkPolicy.enabled=true", "--set", "networkPolicy.webhook.cidrs={10.0.0.0/24,fd00::/64}",
			"--set", `networkPolicy.webhook.namespaceSelector.matchLabels.kubernetes\.io/metadata\.name=kube-system`,
			"--set", "networkPolicy.webhook.podSelector.matchLabels.k8s-app=konnectivity-agent",
			"--set", "networkPolicy.metrics.namespace=monitoring"},
		check: func(t *testing.T, objs map[string]object) {
			np := objs["NetworkPolicy/platform-guard/deployguard"]
			require.NotNil(t, np, "the NetworkPolicy, in the release namespace")
			assert.Equal(t, map[string]any{"app.kubernetes.io/name": "deployguard"}, dig(np, "spec", "podSelector", "matchLabels"), "it selects the guard's pods")
			assert.Equal(t, []any{"Ingress"}, dig(np, "spec", "policyTypes"), "the guard's own calls to the API server are not restricted")
			ingress, _ := dig(np, "spec", "ingress").([]any)
			require.Len(t, ingress, 2, "the webhook port and the metrics port; no other")
			assert.Equal(t, []any{map[string]any{"port": "webhook", "protocol": "TCP"}}, dig(ingress[0], "ports"))
			assert.Equal(t, []any{
				map[string]any{"ipBlock": map[string]any{"cidr": "10.0.0.0/24"}},
				map[string]any{"ipBlock": map[string]any{"cidr": "fd00::/64"}},
				map[string]any{
					"namespaceSelector": map[string]any{"matchLabels": map[string]any{"kubernetes.io/metadata.name": "kube-system"}},
					"podSelector":       map[string]any{"matchLabels": map[string]any{"k8s-app": "konnectivity-agent"}},
				},
			}, dig(ingress[0], "from"), "the webhook port only from where the API server's calls come from")
			assert.Equal(t, []any{map[string]any{"port": "metrics", "protocol": "TCP"}}, dig(ingress[1], "ports"))
			assert.Equal(t, []any{map[string]any{"namespaceSelector": map[string]any{"matchLabels": map[string]any{"kubernetes.io/metadata.name": "monitoring"}}}},
				dig(ingress[1], "from"), "the metrics port only from the monitoring namespace")
		},
	}}
}

func container(t *testing.T, objs map[string]object, ns string) corev1.Container {
	t.Helper()
	d := objs["Deployment/"+ns+"/deployguard"]
	require.NotNil(t, d, "the guard's Deployment")
	b, err := json.Marshal(dig(d, "spec", "template", "spec"))
	require.NoError(t, err)
	var spec corev1.PodSpec
	require.NoError(t, json.Unmarshal(b, &spec))
	require.Len(t, spec.Containers, 1)
	return spec.Containers[0]
}

func guardYAML(t *testing.T, objs map[string]object, ns string) []byte {
	t.Helper()
	cm := objs["ConfigMap/"+ns+"/deployguard-config"]
	require.NotNil(t, cm, "the guard's configuration")
	b, err := yaml.Marshal(dig(cm, "data", "guard.yaml"))
	require.NoError(t, err)
	return b
}

// Each value set passes helm lint, renders a GuardConfig the guard itself
// accepts, sets what it says, and is accepted object by object by a real
// kube-apiserver (server-side dry-run: the built-in schemas, the CEL of the
// webhook configurations' matchConditions, and the cert-manager and
// Prometheus Operator CRDs' schemas).
func TestChartValueSets(t *testing.T) {
	for _, vs := range valueSets() {
		t.Run(vs.name, func(t *testing.T) {
			helm(t, append([]string{"lint", "--strict", chartDir(), "--namespace", vs.namespace}, vs.values...)...)
			rendered := helmTemplate(t, vs.namespace, vs.values...)
			objs, err := objects(rendered)
			require.NoError(t, err)
			_, err = config.Parse(guardYAML(t, objs, vs.namespace))
			require.NoError(t, err, "the rendered guard.yaml is a valid GuardConfig")
			vs.check(t, objs)
			dryRun(t, vs.namespace, rendered)
		})
	}
}

// dryRun applies the manifests server-side without persisting them. The
// release namespace must exist for the namespaced objects (a dry-run creates
// nothing), so it is created, as the chart labels it. The cluster's guard
// already has webhook configurations by the chart's names, pointing at it by
// URL; applied over them, the chart's would be merged with them, so the
// dry-run gives the chart's their own names.
func dryRun(t *testing.T, namespace string, manifests []byte) {
	t.Helper()
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace, Labels: map[string]string{"deployguard.io/guard": "disabled"}}}
	if err := local.Client.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		require.NoError(t, err)
	}
	for _, name := range []string{"deployguard-mutating", "deployguard-validating"} {
		manifests = bytes.ReplaceAll(manifests, []byte("\n  name: "+name+"\n"), []byte("\n  name: "+name+"-dry-run\n"))
	}
	f := filepath.Join(t.TempDir(), "rendered.yaml")
	require.NoError(t, os.WriteFile(f, manifests, 0o600))
	out, err := local.Cluster.Kubectl(ctx, local.Cluster.Kubeconfig, "apply", "--server-side", "--dry-run=server",
		"--force-conflicts", "--field-manager=helm", "-f", f)
	require.NoError(t, err)
	assert.Equal(t, strings.Count(string(manifests), "\nkind: ")+boolInt(bytes.HasPrefix(manifests, []byte("kind: "))), strings.Count(out, "(server dry run)"),
		"every object accepted:\n%s", out)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Values that would install a guard that cannot work are refused by helm
// itself (values.schema.json), with the value's path.
func TestChartRefusesBadValues(t *testing.T) {
	for _, tc := range []struct {
		name, set, want string
	}{
		{"a failure policy the API server does not know", "webhooks.validating.failurePolicy=Fial", "/webhooks/validating/failurePolicy"},
		{"a certificate mode the guard does not know", "certificates.mode=selfmanaged", "/certificates/mode"},
		{"no replica", "replicas=0", "/replicas"},
		{"a time-out above the API server's 30s", "webhooks.mutating.timeoutSeconds=31", "/webhooks/mutating/timeoutSeconds"},
		{"a policy that is not a ConfigMap's keys", "policies.team=deny", "/policies/team"},
		// The guard refuses it at start; the probe's Role would go to default.
		{"no namespace for the floor probe", "config.nativePolicies.probeNamespace=", "/config/nativePolicies/probeNamespace"},
		{"a probe namespace that is not a namespace name", "config.nativePolicies.probeNamespace=Team_A", "/config/nativePolicies/probeNamespace"},
		// It would shut the API server out, and the enforce entry fails closed.
		{"a network policy that admits no one to the webhook port", "networkPolicy.enabled=true", "networkPolicy.webhook.cidrs"},
		{"a metrics reader without its namespace", "metrics.readers[0].name=prometheus", "/metrics/readers/0"},
		{"a network policy source that is not a CIDR", "networkPolicy.webhook.cidrs={10.0.0.1}", "/networkPolicy/webhook/cidrs/0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(filepath.Join(tools, "helm"), "template", release, chartDir(), "--set", tc.set)
			cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
			out, err := cmd.CombinedOutput()
			require.Error(t, err, "helm template --set %s: %s", tc.set, out)
			assert.Contains(t, string(out), tc.want)
		})
	}
}
