package harness

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// Cluster is a full local cluster: etcd, kube-apiserver, kube-controller-manager
// (every controller: Deployments roll out for real; each controller under its
// own service account, as on kubeadm), kube-scheduler, and kwok
// simulating nodes and pods, all as local processes started by kwokctl.
type Cluster struct {
	Name       string
	Tools      string
	WorkDir    string
	Kubeconfig string // admin
	out        io.Writer
}

// StartCluster creates a cluster named name with nodes fake nodes. Its state
// lives under workDir; a cluster of the same name left by an interrupted run is
// deleted first.
func StartCluster(ctx context.Context, tools, name, workDir string, nodes int, out io.Writer) (*Cluster, error) {
	return StartClusterWith(ctx, tools, name, workDir, nodes, out)
}

// StartClusterWith is StartCluster with extra `kwokctl create cluster` flags,
// such as --disable-qps-limits for a benchmark that fills the cluster faster
// than the controllers' default client rate limits allow.
func StartClusterWith(ctx context.Context, tools, name, workDir string, nodes int, out io.Writer, kwokctlArgs ...string) (*Cluster, error) {
	if out == nil {
		out = io.Discard
	}
	c := &Cluster{Name: name, Tools: tools, WorkDir: workDir, Kubeconfig: filepath.Join(workDir, "kubeconfig"), out: out}
	stageDirs, err := stageDirs(tools)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(workDir, 0o755); err != nil {
		return nil, err
	}
	_ = c.kwokctl(ctx, "delete", "cluster")
	kwokctlArgs, err = withControllerIdentities(kwokctlArgs, workDir)
	if err != nil {
		return nil, err
	}
	err = c.kwokctl(ctx, append([]string{"create", "cluster",
		"--runtime", "binary",
		"--kube-apiserver-binary", filepath.Join(tools, "kube-apiserver"),
		"--kube-controller-manager-binary", filepath.Join(tools, "kube-controller-manager"),
		"--kube-scheduler-binary", filepath.Join(tools, "kube-scheduler"),
		"--etcd-binary", filepath.Join(tools, "etcd"),
		"--kwok-controller-binary", filepath.Join(tools, "kwok"),
		"--kubeconfig", c.Kubeconfig,
		// kwok reads its stages from Stage objects in the cluster, so that the
		// harness can add its own (StagesDir) beside kwok's defaults.
		"--enable-crds", "Stage",
		"--wait", "2m",
	}, kwokctlArgs...)...,
	)
	if err != nil {
		_ = c.Stop()
		return nil, fmt.Errorf("creating the local cluster: %w", err)
	}
	if err := c.waitControllerIdentities(ctx); err != nil {
		_ = c.Stop()
		return nil, err
	}
	// Before any node exists, so that every node and pod meets the full set.
	if err := c.applyStages(ctx, stageDirs); err != nil {
		_ = c.Stop()
		return nil, err
	}
	if nodes == 0 { // a real node joins (StartNode)
		return c, nil
	}
	if err := c.kwokctl(ctx, "scale", "node", "--replicas", strconv.Itoa(nodes)); err != nil {
		_ = c.Stop()
		return nil, fmt.Errorf("adding %d kwok nodes: %w", nodes, err)
	}
	if _, err := c.Kubectl(ctx, c.Kubeconfig, "wait", "--for=condition=Ready", "node", "--all", "--timeout=2m"); err != nil {
		_ = c.Stop()
		return nil, fmt.Errorf("waiting for the kwok nodes to be Ready: %w", err)
	}
	return c, nil
}

// withControllerIdentities are kwokctlArgs with controllersKwokctlConfig's
// argument in the kwokctl configuration they name, or in one of its own
// (written in dir) if they name none. kwokctl merges several --config files
// by replacing their componentsPatches lists whole, so a caller's patch of
// kube-controller-manager (the node tier's) and this one must be one entry
// of one file.
func withControllerIdentities(kwokctlArgs []string, dir string) ([]string, error) {
	args := slices.Clone(kwokctlArgs)
	for i := 0; i < len(args)-1; i++ {
		if args[i] != "--config" && args[i] != "-c" {
			continue
		}
		raw, err := os.ReadFile(args[i+1])
		if err != nil {
			return nil, fmt.Errorf("reading the kwokctl configuration: %w", err)
		}
		var cfg map[string]any
		if err := yaml.Unmarshal(raw, &cfg); err != nil {
			return nil, fmt.Errorf("reading the kwokctl configuration %s: %w", args[i+1], err)
		}
		if cfg["kind"] != "KwokctlConfiguration" {
			continue
		}
		patches, _ := cfg["componentsPatches"].([]any)
		kcm := -1
		for j, p := range patches {
			if m, _ := p.(map[string]any); m != nil && m["name"] == "kube-controller-manager" {
				kcm = j
			}
		}
		if kcm < 0 {
			patches = append(patches, map[string]any{"name": "kube-controller-manager"})
			kcm = len(patches) - 1
		}
		m := patches[kcm].(map[string]any)
		extra, _ := m["extraArgs"].([]any)
		m["extraArgs"] = append(extra, map[string]any{"key": "use-service-account-credentials", "value": "true"})
		cfg["componentsPatches"] = patches
		out, err := yaml.Marshal(cfg)
		if err != nil {
			return nil, err
		}
		merged := filepath.Join(dir, "kwokctl-"+filepath.Base(args[i+1]))
		if err := os.WriteFile(merged, out, 0o644); err != nil {
			return nil, err
		}
		args[i+1] = merged
		return args, nil
	}
	own := filepath.Join(dir, "kwokctl-controllers.yaml")
	if err := os.WriteFile(own, []byte(controllersKwokctlConfig), 0o644); err != nil {
		return nil, err
	}
	return append(args, "--config", own), nil
}

// controllersKwokctlConfig runs kube-controller-manager as kubeadm and the
// managed offerings do: each controller with the credentials of its own
// service account in kube-system (deployment-controller,
// generic-garbage-collector, namespace-controller, ...), so that the
// webhooks and native policies see a controller's write under the name a
// real cluster sends, and what they exempt by that name is what is tested.
// kwokctl already gives it --service-account-private-key-file and the API
// server the matching keys; the controllers' ClusterRoles
// (system:controller:*) are the API server's bootstrap RBAC.
const controllersKwokctlConfig = `apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokctlConfiguration
componentsPatches:
- name: kube-controller-manager
  extraArgs:
  - key: use-service-account-credentials
    value: "true"
`

// ControllerIdentity is the username the Deployment controller writes
// with on this cluster, as on kubeadm's.
const ControllerIdentity = "system:serviceaccount:kube-system:deployment-controller"

// waitControllerIdentities waits until kube-controller-manager has created
// the service accounts its controllers act as: proof that it runs with
// --use-service-account-credentials (a configuration kwokctl did not merge
// would leave every controller acting as the admin, and every exemption of
// the webhooks untested).
func (c *Cluster) waitControllerIdentities(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	want := []string{"deployment-controller", "generic-garbage-collector", "namespace-controller", "replicaset-controller"}
	var last string
	for {
		out, err := c.Kubectl(ctx, c.Kubeconfig, "get", "serviceaccounts", "-n", "kube-system", "-o", "jsonpath={.items[*].metadata.name}")
		if err == nil {
			have := strings.Fields(out)
			missing := slices.DeleteFunc(slices.Clone(want), func(n string) bool { return slices.Contains(have, n) })
			if len(missing) == 0 {
				return nil
			}
			last = fmt.Sprintf("missing %v", missing)
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kube-controller-manager does not act as its controllers' service accounts (%s): is --use-service-account-credentials set?\n--- end of its log ---\n%s",
				last, c.ComponentLog(context.Background(), "kube-controller-manager", 3000))
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// StagesDir holds the kwok stages every local cluster gets on top of kwok's
// defaults: one Stage per YAML file, such as pods whose image cannot exist
// staying in ImagePullBackOff. A stage added here must leave every other pod
// to kwok's default lifecycle.
func StagesDir() string { return filepath.Join(RepoRoot(), "test", "harness", "stages") }

// stageDirs are kwok's default stages (copied from its module by
// test/tools/build.sh, as kwokctl applies none once the Stage CRD is enabled)
// and StagesDir.
func stageDirs(tools string) ([]string, error) {
	defaults := filepath.Join(tools, "kwok-stages")
	if _, err := os.Stat(filepath.Join(defaults, ".complete")); err != nil {
		return nil, fmt.Errorf("kwok's default stages missing in %s: run `make tools`", defaults)
	}
	return []string{defaults, StagesDir()}, nil
}

// applyStages creates the Stage objects of every YAML file in dirs, once the
// API server serves the Stage kind.
func (c *Cluster) applyStages(ctx context.Context, dirs []string) error {
	if _, err := c.Kubectl(ctx, c.Kubeconfig, "wait", "--for=condition=Established", "crd/stages.kwok.x-k8s.io", "--timeout=1m"); err != nil {
		return fmt.Errorf("waiting for kwok's Stage CRD: %w", err)
	}
	args := []string{"apply"}
	for _, d := range dirs {
		args = append(args, "-f", d)
	}
	if _, err := c.Kubectl(ctx, c.Kubeconfig, args...); err != nil {
		return fmt.Errorf("applying the kwok stages: %w", err)
	}
	return nil
}

// Stop deletes the cluster and every process it started.
func (c *Cluster) Stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return c.kwokctl(ctx, "delete", "cluster")
}

// StopControlPlane stops every process of the cluster: etcd (which keeps its
// data), kube-apiserver, the controllers and kwok, as a control-plane restart
// or a whole-cluster shutdown does.
func (c *Cluster) StopControlPlane(ctx context.Context) error {
	return c.kwokctl(ctx, "stop", "cluster")
}

// StartControlPlane starts them again and returns once kube-apiserver
// answers. kwokctl exits 0 even when the cluster never became ready (it
// only logs it): a kube-apiserver that does not answer is started once more
// (one was seen to stay down after a restart on a loaded machine), and then
// the error carries its log.
func (c *Cluster) StartControlPlane(ctx context.Context) error {
	var last error
	for attempt := range 2 {
		if attempt > 0 {
			_ = c.kwokctl(ctx, "stop", "cluster")
		}
		if err := c.kwokctl(ctx, "start", "cluster", "--wait", "2m"); err != nil {
			last = err
			continue
		}
		if _, err := c.Kubectl(ctx, c.Kubeconfig, "get", "--raw", "/readyz"); err != nil {
			last = fmt.Errorf("kube-apiserver does not answer after kwokctl start: %w\n--- end of the kube-apiserver log ---\n%s",
				err, c.ComponentLog(ctx, "kube-apiserver", 3000))
			fmt.Fprintln(c.out, last)
			continue
		}
		return nil
	}
	return last
}

func (c *Cluster) kwokctl(ctx context.Context, args ...string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(c.Tools, "kwokctl"), append([]string{"--name", c.Name}, args...)...)
	cmd.Env = append(os.Environ(), "KWOK_WORKDIR="+filepath.Join(c.WorkDir, "kwok"))
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = io.MultiWriter(c.out, &buf), io.MultiWriter(c.out, &buf)
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("kwokctl %s: %w\n%s", strings.Join(args, " "), err, tail(buf.String(), 2000))
	}
	return nil
}

// ComponentLog is the tail (up to n bytes) of a control-plane component's
// log: kube-apiserver, kube-controller-manager, kube-scheduler,
// kwok-controller, etcd. For a failed test's report.
func (c *Cluster) ComponentLog(ctx context.Context, component string, n int) string {
	cmd := exec.CommandContext(ctx, filepath.Join(c.Tools, "kwokctl"), "--name", c.Name, "logs", component)
	cmd.Env = append(os.Environ(), "KWOK_WORKDIR="+filepath.Join(c.WorkDir, "kwok"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Sprintf("kwokctl logs %s: %v\n%s", component, err, tail(string(out), 500))
	}
	return tail(string(out), n)
}

// Kubectl runs the cluster's own kubectl with kubeconfig and returns its
// combined output.
func (c *Cluster) Kubectl(ctx context.Context, kubeconfig string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.Tools, "kubectl"), append([]string{"--kubeconfig", kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// RESTConfig is the admin configuration.
func (c *Cluster) RESTConfig() (*rest.Config, error) {
	return clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
}

// GuardKubeconfig gives the guard its real identity: the deployguard service
// account, with the RBAC of config/rbac applied by kubectl, and a kubeconfig
// holding a token for it. The guard then runs with exactly the rights it has
// when deployed, and the webhooks see its real username.
func (c *Cluster) GuardKubeconfig(ctx context.Context, cl client.Client, path string) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: GuardNamespace,
		Labels: map[string]string{"deployguard.io/guard": "disabled"}}}
	if err := cl.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	if _, err := c.Kubectl(ctx, c.Kubeconfig, "apply", "-k", filepath.Join(RepoRoot(), "config", "rbac")); err != nil {
		return err
	}
	token, err := c.Kubectl(ctx, c.Kubeconfig, "create", "token", "deployguard", "-n", GuardNamespace, "--duration", "24h")
	if err != nil {
		return err
	}
	admin, err := clientcmd.LoadFromFile(c.Kubeconfig)
	if err != nil {
		return err
	}
	ctxName := admin.CurrentContext
	cluster := admin.Clusters[admin.Contexts[ctxName].Cluster]
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["local"] = cluster
	cfg.AuthInfos["deployguard"] = &clientcmdapi.AuthInfo{Token: strings.TrimSpace(token)}
	if err := c.addMetricsScraper(ctx, cl, cfg); err != nil {
		return err
	}
	cfg.Contexts["deployguard"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: "deployguard", Namespace: GuardNamespace}
	cfg.CurrentContext = "deployguard"
	return clientcmd.WriteToFile(*cfg, path)
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}
