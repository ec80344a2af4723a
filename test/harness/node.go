package harness

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// A real node: containerd, runc, kubelet and kube-proxy (built by
// test/tools/build-node.sh) joined to a local control plane, with
// distribution's registry on loopback. The tier runs inside a network
// namespace of its own (EnterOwnNetwork): the node's address, the pods'
// bridge, the Services' iptables rules and the registry exist only there.
const (
	NodeName = "dg-node"
	// NodeIP is the node's address (on the namespace's loopback device):
	// kube-apiserver advertises it, the kubelet serves on it.
	NodeIP = "10.99.0.1"
	// PodCIDR is the CNI bridge's range; ServiceCIDR the Services'.
	PodCIDR     = "10.88.0.0/16"
	ServiceCIDR = "10.96.0.0/16"
	// kubernetesServiceIP is the kubernetes Service's ClusterIP, the first
	// of ServiceCIDR: pods reach the API server there through kube-proxy.
	kubernetesServiceIP = "10.96.0.1"
	// Registry is where the node pulls images from: distribution's registry
	// on the namespace's loopback, over HTTP.
	Registry = "127.0.0.1:5000"
)

// ownNetworkEnv marks the test binary run again inside its own network
// namespace.
const ownNetworkEnv = "DEPLOYGUARD_OWN_NETWORK"

// EnterOwnNetwork is the first thing a real-node tier's TestMain does. Run
// outside, it runs the test binary again with the same arguments in a new
// network namespace (unshare --net, as root) and returns that run's exit
// code with again false. Inside, it brings the namespace's loopback up with
// NodeIP and returns again true: the caller goes on with its tests.
func EnterOwnNetwork() (code int, again bool) {
	if os.Getenv(ownNetworkEnv) == "" {
		if os.Geteuid() != 0 {
			fmt.Fprintln(os.Stderr, "the real node's tier runs as root: it creates a network namespace, cgroups and mounts")
			return 1, false
		}
		cmd := exec.Command("unshare", append([]string{"--net", "--", os.Args[0]}, os.Args[1:]...)...)
		cmd.Env = append(os.Environ(), ownNetworkEnv+"=1")
		cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
		err := cmd.Run()
		var ee *exec.ExitError
		switch {
		case errors.As(err, &ee):
			return ee.ExitCode(), false
		case err != nil:
			fmt.Fprintf(os.Stderr, "entering a network namespace of the tier's own (unshare --net, util-linux): %v\n", err)
			return 1, false
		}
		return 0, false
	}
	for _, args := range [][]string{
		{"link", "set", "lo", "up"},
		{"addr", "add", NodeIP + "/32", "dev", "lo"},
		// A node's own connections to a Service's ClusterIP (the API
		// server's calls to webhooks) need a route before kube-proxy's
		// OUTPUT rules rewrite them to a pod: a real node's default route.
		// Here the namespace has no uplink; any route does, since the
		// rewritten packet is routed again (to the pods' bridge).
		{"route", "add", ServiceCIDR, "dev", "lo"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "ip %s: %v\n%s", strings.Join(args, " "), err, out)
			return 1, false
		}
	}
	// Pods' packets to Services and to the node are routed by this
	// namespace.
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
		fmt.Fprintf(os.Stderr, "enabling forwarding in the tier's network namespace: %v\n", err)
		return 1, false
	}
	return 0, true
}

// NodeToolsDir is where the node's binaries are: $DEPLOYGUARD_NODE_TOOLS, or
// bin/tools/node-<version> beside the control plane's folder (the Makefile's
// NODE_TOOLS_DIR).
func NodeToolsDir(tools string) (string, error) {
	dir := os.Getenv("DEPLOYGUARD_NODE_TOOLS")
	if dir == "" {
		dir = filepath.Join(filepath.Dir(tools), strings.Replace(filepath.Base(tools), "k8s-", "node-", 1))
	}
	for _, b := range []string{"containerd", "containerd-shim-runc-v2", "runc", "kubelet", "kube-proxy", "registry"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return "", fmt.Errorf("the real node's %s is missing in %s: run `make node-tools`", b, dir)
		}
	}
	return dir, nil
}

// Node is a local cluster whose one node is real.
type Node struct {
	*Cluster
	NodeTools string
	dir       string

	registry, containerd, kubeProxy, kubelet *Process
	// cgroupRoot is the kubelet's --cgroup-root: every container of the run
	// is below it, in each hierarchy, so Stop finds and ends them all.
	cgroupRoot string
}

// StartNode starts the control plane (kwokctl, without kwok nodes), the
// registry, containerd, kube-proxy and the kubelet, and waits for the node
// to be Ready. Call it inside the tier's own network namespace.
func StartNode(ctx context.Context, tools, nodeTools, name, workDir string, out io.Writer) (*Node, error) {
	n := &Node{NodeTools: nodeTools, dir: filepath.Join(workDir, "node"), cgroupRoot: "/" + name}
	if err := os.MkdirAll(n.dir, 0o755); err != nil {
		return nil, err
	}
	cfg := filepath.Join(n.dir, "kwokctl.yaml")
	if err := os.WriteFile(cfg, []byte(nodeKwokctlConfig), 0o644); err != nil {
		return nil, err
	}
	// No kwok controller: it would take the real node's pods for its own and
	// mark them Ready before their containers start.
	c, err := StartClusterWith(ctx, tools, name, workDir, 0, out, "--config", cfg, "--disable", "kwok-controller")
	if err != nil {
		return nil, err
	}
	n.Cluster = c
	// kube-proxy reads its node's addresses at start: it comes once the
	// kubelet has registered the node.
	for _, start := range []func(context.Context) error{n.StartRegistry, n.startContainerd, n.startKubelet, n.waitReady, n.startKubeProxy} {
		if err := start(ctx); err != nil {
			n.Stop()
			return nil, err
		}
	}
	return n, nil
}

// waitReady waits until the kubelet has registered the node and it is Ready.
func (n *Node) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for {
		out, err := n.Kubectl(ctx, n.Kubeconfig, "get", "node", NodeName, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		if err == nil && strings.TrimSpace(out) == "True" {
			return nil
		}
		if n.kubelet.Exited() || ctx.Err() != nil {
			return fmt.Errorf("the real node never became Ready (%s)\n--- end of the kubelet's log ---\n%s", strings.TrimSpace(out), TailFile(n.logPath("kubelet"), 4000))
		}
		select {
		case <-ctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// The control plane of a real node's cluster: kube-apiserver advertises
// NodeIP (pods reach it through the kubernetes Service) with a certificate
// that names the Service's address, and reaches the kubelet by its address.
const nodeKwokctlConfig = `apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokctlConfiguration
options:
  kubeApiserverCertSANs: ["` + kubernetesServiceIP + `", "` + NodeIP + `"]
  bindAddress: 0.0.0.0
componentsPatches:
- name: kube-apiserver
  extraArgs:
  - key: advertise-address
    value: ` + NodeIP + `
  - key: service-cluster-ip-range
    value: ` + ServiceCIDR + `
  - key: kubelet-preferred-address-types
    value: InternalIP
- name: kube-controller-manager
  extraArgs:
  - key: service-cluster-ip-range
    value: ` + ServiceCIDR + `
`

func (n *Node) logPath(component string) string { return filepath.Join(n.dir, component+".log") }

// start runs a node component with its log in the node's folder.
func (n *Node) start(component string, args ...string) (*Process, error) {
	f, err := os.OpenFile(n.logPath(component), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	p, err := startProcess(filepath.Join(n.NodeTools, component), args, append(os.Environ(), "PATH="+n.NodeTools+":"+os.Getenv("PATH")), f)
	f.Close() // the process has its own descriptor
	if err != nil {
		return nil, fmt.Errorf("starting %s: %w", component, err)
	}
	return p, nil
}

// waitFor polls ok until it holds, the process exits, or a minute passes.
func (n *Node) waitFor(ctx context.Context, component string, p *Process, ok func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for !ok() {
		if p.Exited() {
			return fmt.Errorf("%s exited\n--- end of its log ---\n%s", component, TailFile(n.logPath(component), 3000))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s did not start within a minute\n--- end of its log ---\n%s", component, TailFile(n.logPath(component), 3000))
		case <-time.After(200 * time.Millisecond):
		}
	}
	return nil
}

// StartRegistry starts distribution's registry on Registry, keeping what was
// pushed (its storage is a folder): after StopRegistry, the same images are
// served again.
func (n *Node) StartRegistry(ctx context.Context) error {
	cfg := filepath.Join(n.dir, "registry.yaml")
	err := os.WriteFile(cfg, []byte(fmt.Sprintf(`version: 0.1
log:
  level: info
storage:
  filesystem:
    rootdirectory: %s
  delete:
    enabled: true
http:
  addr: %s
`, filepath.Join(n.dir, "registry"), Registry)), 0o644)
	if err != nil {
		return err
	}
	if n.registry, err = n.start("registry", "serve", cfg); err != nil {
		return err
	}
	return n.waitFor(ctx, "registry", n.registry, func() bool {
		resp, err := http.Get("http://" + Registry + "/v2/")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// StopRegistry stops the registry: pulls fail with connection refused.
func (n *Node) StopRegistry() error {
	err := n.registry.Stop()
	n.registry = nil
	return err
}

// Push pushes every tag of the OCI layout dir (bin/image/<repository>, as
// `make image` writes it) to the registry as Registry/repository:tag.
func (n *Node) Push(ctx context.Context, dir, repository string) ([]string, error) {
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("reading %s (run `make image`): %w", dir, err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	var pushed []string
	for _, d := range m.Manifests {
		tag := d.Annotations["org.opencontainers.image.ref.name"]
		if tag == "" {
			continue
		}
		img, err := idx.Image(d.Digest)
		if err != nil {
			return nil, err
		}
		ref, err := name.NewTag(Registry+"/"+repository+":"+tag, name.Insecure)
		if err != nil {
			return nil, err
		}
		if err := remote.Write(ref, img, remote.WithContext(ctx)); err != nil {
			return nil, fmt.Errorf("pushing %s: %w", ref, err)
		}
		pushed = append(pushed, ref.String())
	}
	return pushed, nil
}

// Tag gives the registry's repository:from a second tag, to: an image no
// node has pulled yet under that name.
func (n *Node) Tag(ctx context.Context, repository, from, to string) error {
	src, err := name.NewTag(Registry+"/"+repository+":"+from, name.Insecure)
	if err != nil {
		return err
	}
	desc, err := remote.Get(src, remote.WithContext(ctx))
	if err != nil {
		return fmt.Errorf("reading %s: %w", src, err)
	}
	dst, err := name.NewTag(Registry+"/"+repository+":"+to, name.Insecure)
	if err != nil {
		return err
	}
	return remote.Tag(dst, desc, remote.WithContext(ctx))
}

// SandboxImage is the pod sandbox's image: the test app's pause tag.
const SandboxImage = Registry + "/testapp:pause"

func (n *Node) containerdSocket() string {
	return filepath.Join(n.dir, "containerd", "containerd.sock")
}

func (n *Node) startContainerd(ctx context.Context) error {
	hosts := filepath.Join(n.dir, "certs.d", Registry)
	if err := os.MkdirAll(hosts, 0o755); err != nil {
		return err
	}
	// The registry speaks HTTP on loopback.
	if err := os.WriteFile(filepath.Join(hosts, "hosts.toml"), []byte(fmt.Sprintf(`server = "http://%s"
[host."http://%s"]
  capabilities = ["pull", "resolve"]
`, Registry, Registry)), 0o644); err != nil {
		return err
	}
	cni := filepath.Join(n.dir, "cni")
	if err := os.MkdirAll(cni, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(cni, "10-pods.conflist"), []byte(`{"cniVersion": "1.0.0", "name": "pods", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "`+PodCIDR+`"}]], "routes": [{"dst": "0.0.0.0/0"}],
            "dataDir": "`+filepath.Join(n.dir, "cni-ipam")+`"}},
  {"type": "portmap", "capabilities": {"portMappings": true}},
  {"type": "loopback"}]}
`), 0o644); err != nil {
		return err
	}
	root := filepath.Join(n.dir, "containerd")
	cfg := filepath.Join(n.dir, "containerd.toml")
	// restrict_oom_score_adj: the CRI plugin asks -998 for every sandbox,
	// which needs CAP_SYS_RESOURCE; root here lacks it and runc's child
	// then dies before it sends its PID. Restricted, a score is never set
	// below containerd's own. AppArmor is not on these hosts.
	// netns_mounts_under_state_dir: the pods' network namespaces are
	// mounted in the node's folder, which Stop unmounts, not in /run/netns,
	// where each run left one per pod.
	err := os.WriteFile(cfg, []byte(fmt.Sprintf(`version = 3
root = "%[1]s/root"
state = "%[1]s/state"
[grpc]
  address = "%[2]s"
[ttrpc]
  address = "%[2]s.ttrpc"
[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_unprivileged_ports = false
  enable_unprivileged_icmp = false
  disable_apparmor = true
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "%[3]s"
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "%[4]s"
        SystemdCgroup = false
[plugins."io.containerd.cri.v1.images"]
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "%[5]s"
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = "%[6]s"
`, root, n.containerdSocket(), cni, filepath.Join(n.NodeTools, "runc"), SandboxImage, filepath.Join(n.dir, "certs.d"))), 0o644)
	if err != nil {
		return err
	}
	if n.containerd, err = n.start("containerd", "--config", cfg); err != nil {
		return err
	}
	return n.waitFor(ctx, "containerd", n.containerd, func() bool {
		_, err := os.Stat(n.containerdSocket())
		return err == nil
	})
}

func (n *Node) startKubeProxy(ctx context.Context) error {
	cfg := filepath.Join(n.dir, "kube-proxy.yaml")
	// iptables mode, as most clusters run; conntrack's sizes are the host's
	// (a network namespace cannot set them).
	err := os.WriteFile(cfg, []byte(fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clusterCIDR: %s
hostnameOverride: %s
bindAddress: %s
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
clientConnection:
  kubeconfig: %s
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
`, PodCIDR, NodeName, NodeIP, n.Kubeconfig)), 0o644)
	if err != nil {
		return err
	}
	if n.kubeProxy, err = n.start("kube-proxy", "--config", cfg, "--v=2"); err != nil {
		return err
	}
	return n.waitFor(ctx, "kube-proxy", n.kubeProxy, func() bool {
		resp, err := http.Get("http://127.0.0.1:10256/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return true
	})
}

func (n *Node) startKubelet(ctx context.Context) error {
	pki := filepath.Join(n.WorkDir, "kwok", "clusters", n.Name, "pki")
	for _, h := range cgroupHierarchies() {
		if err := os.MkdirAll(filepath.Join(h, n.cgroupRoot), 0o755); err != nil {
			return fmt.Errorf("creating the kubelet's cgroup root: %w", err)
		}
	}
	cfg := filepath.Join(n.dir, "kubelet.yaml")
	// failCgroupV1: false, for these hosts' cgroup v1; oomScoreAdj 0 and
	// no kernel defaults, since root here may not lower scores or set every
	// sysctl; no eviction thresholds, since the test machine's disk is
	// shared.
	err := os.WriteFile(cfg, []byte(fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: %[1]s
containerRuntimeEndpoint: unix://%[2]s
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %[3]s/ca.crt}
authorization: {mode: Webhook}
tlsCertFile: %[3]s/admin.crt
tlsPrivateKeyFile: %[3]s/admin.key
address: %[4]s
port: 10250
healthzPort: 0
readOnlyPort: 0
failSwapOn: false
protectKernelDefaults: false
makeIPTablesUtilChains: false
localStorageCapacityIsolation: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {}
enforceNodeAllocatable: []
oomScoreAdj: 0
serializeImagePulls: false
resolvConf: /etc/resolv.conf
podLogsDir: %[5]s
`, n.cgroupRoot, n.containerdSocket(), pki, NodeIP, filepath.Join(n.dir, "pods"))), 0o644)
	if err != nil {
		return err
	}
	n.kubelet, err = n.start("kubelet", "--config", cfg, "--kubeconfig", n.Kubeconfig,
		"--root-dir", filepath.Join(n.dir, "kubelet"), "--hostname-override", NodeName, "--node-ip", NodeIP, "--v=2")
	return err
}

// cgroupHierarchies are the mounted cgroup v1 hierarchies (or the v2 root).
func cgroupHierarchies() []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		sep := -1
		for i, f := range fields {
			if f == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || sep+1 >= len(fields) {
			continue
		}
		if t := fields[sep+1]; t == "cgroup" || t == "cgroup2" {
			out = append(out, fields[4])
		}
	}
	return out
}

// Stop ends the node and the cluster: the kubelet, every container (by the
// cgroups below the kubelet's root), the shims, containerd, kube-proxy, the
// registry and the control plane; then unmounts what they mounted in the
// node's folder and removes their cgroups.
func (n *Node) Stop() {
	if n.kubelet != nil {
		_ = n.kubelet.Stop()
	}
	for range 3 {
		if killCgroup(n.cgroupRoot) == 0 {
			break
		}
		time.Sleep(200 * time.Millisecond) // the kernel reaps what was killed
	}
	killByExe(filepath.Join(n.NodeTools, "containerd-shim-runc-v2"))
	for _, p := range []*Process{n.containerd, n.kubeProxy, n.registry} {
		if p != nil {
			_ = p.Stop()
		}
	}
	unmountBelow(n.dir)
	removeCgroup(n.cgroupRoot)
	if n.Cluster != nil {
		_ = n.Cluster.Stop()
	}
}

// killCgroup sends SIGKILL to every process in root's cgroups, in every
// hierarchy, and returns how many it found.
func killCgroup(root string) int {
	found := 0
	for _, h := range cgroupHierarchies() {
		_ = filepath.WalkDir(filepath.Join(h, root), func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
				return nil
			}
			b, _ := os.ReadFile(p)
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil {
					found++
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
			return nil
		})
	}
	return found
}

// removeCgroup removes root's cgroups, deepest first.
func removeCgroup(root string) {
	for _, h := range cgroupHierarchies() {
		var dirs []string
		_ = filepath.WalkDir(filepath.Join(h, root), func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			_ = syscall.Rmdir(dirs[i])
		}
	}
}

// killByExe kills every process whose executable is exe: the shims, which
// containerd starts detached from itself.
func killByExe(exe string) {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if target, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe")); err == nil && strings.TrimSuffix(target, " (deleted)") == exe {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// unmountBelow unmounts every mount point under dir, deepest first.
func unmountBelow(dir string) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var points []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) > 4 && (fields[4] == dir || strings.HasPrefix(fields[4], dir+"/")) {
			points = append(points, fields[4])
		}
	}
	f.Close()
	sort.Sort(sort.Reverse(sort.StringSlice(points)))
	for _, p := range points {
		_ = syscall.Unmount(p, syscall.MNT_DETACH)
	}
}
