package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/test/harness"
	"github.com/deployguard/deployguard/test/image"
)

// The samples a newcomer applies (config/samples/checks): the check is
// applied by the run, the app by the newcomer, and the run sends traffic
// to the app's Service.
const (
	checkSample = "config/samples/checks/error-rate.yaml"
	appSample   = "config/samples/checks/web.yaml"
	appNS       = "shop"
	appName     = "web"
)

// runRealNode is `make run NODE=real`. Outside the network namespace it
// checks for root and runs itself again inside one (harness.EnterOwnNetwork),
// passing signals on; inside, it runs the cluster until a signal.
func runRealNode(o options) int {
	if err := requireRoot(os.Geteuid()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	stopForwarding := forwardSignals()
	code, again := harness.EnterOwnNetwork()
	stopForwarding()
	if !again {
		return code
	}
	if err := realNode(o); err != nil {
		fmt.Fprintln(os.Stderr, "make run:", err)
		return 1
	}
	return 0
}

// realNode starts, in this network namespace: the control plane and a real
// node (kubelet, containerd, runc, kube-proxy, the node's registry, which
// gets the guard's and the test app's images), a real Prometheus scraping
// the node's pods, the guard installed by helm (its own certificate,
// pointed at that Prometheus), and the sample check; it then sends traffic
// to the sample app once it exists, until a signal, and stops everything.
func realNode(o options) (err error) {
	// Ctrl-C during start-up also stops everything.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if o.tools == "" {
		if o.tools, err = harness.ToolsDir(); err != nil {
			return err
		}
	}
	nodeTools, err := harness.NodeToolsDir(o.tools)
	if err != nil {
		return err
	}
	if o.guard, err = filepath.Abs(o.guard); err != nil {
		return err
	}
	if o.workDir, err = filepath.Abs(o.workDir); err != nil {
		return err
	}
	// First: a name taken means another run, whose folders stay as they are.
	if err := attachNetns(); err != nil {
		return err
	}
	defer func() {
		if derr := detachNetns(); derr != nil && err == nil {
			err = derr
		}
		fmt.Println("Stopped; nothing is left running (no process, mount or network namespace of the run).")
	}()
	// Each run's node and Prometheus start empty.
	for _, d := range []string{"node", "prometheus", "helm"} {
		if err := os.RemoveAll(filepath.Join(o.workDir, d)); err != nil {
			return fmt.Errorf("removing the last run's %s: %w", d, err)
		}
	}
	if err := os.MkdirAll(o.workDir, 0o755); err != nil {
		return err
	}
	logPath := filepath.Join(o.workDir, "local.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logFile.Close()

	var cleanups []func()
	defer func() {
		fmt.Println("\nStopping the traffic, Prometheus, the node (its pods, containerd, the kubelet) and the control plane …")
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}()

	step := func(what string) func() {
		fmt.Printf("%s … ", what)
		start := time.Now()
		return func() { fmt.Printf("%s\n", time.Since(start).Round(time.Second)) }
	}
	fmt.Printf("Logs in %s and %s\n", logPath, filepath.Join(o.workDir, "node"))
	start, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()

	done := step("Starting the control plane and a real node (kubelet, containerd, runc) in network namespace " + netnsName)
	netnsBefore := podNetns()
	cleanups = append(cleanups, func() {
		if err := removePodNetns(netnsBefore); err != nil {
			fmt.Fprintln(os.Stderr, "make run: removing the pods' network namespaces:", err)
		}
	})
	node, err := harness.StartNode(start, o.tools, nodeTools, "deployguard-node", o.workDir, logFile)
	if err != nil {
		return fmt.Errorf("%w (see %s)", err, logPath)
	}
	cleanups = append(cleanups, node.Stop)
	done()

	done = step("Pushing the guard's and the test app's images to the node's registry")
	for _, repo := range []string{image.AppRepository, image.GuardRepository} {
		if _, err := node.Push(start, filepath.Join(harness.RepoRoot(), "bin", "image", repo), repo); err != nil {
			return err
		}
	}
	done()

	done = step("Starting Prometheus, which discovers the node's pods through the API server")
	prom, err := harness.StartPrometheus(start, harness.PrometheusOptions{
		NodeTools: nodeTools, Kubeconfig: node.Kubeconfig, Dir: filepath.Join(o.workDir, "prometheus"), Host: harness.NodeIP})
	if err != nil {
		return err
	}
	cleanups = append(cleanups, func() { _ = prom.Stop() })
	done()

	done = step("Installing deployguard with helm (its image, its own certificate, checks.prometheus.url " + prom.URL + ")")
	if err := helmInstall(start, node, o.workDir, prom.URL, logFile); err != nil {
		return err
	}
	done()

	done = step("Applying " + checkSample)
	if err := applyCheck(start, node); err != nil {
		return err
	}
	done()

	cfg, err := node.RESTConfig()
	if err != nil {
		return err
	}
	cl, err := client.New(cfg, client.Options{})
	if err != nil {
		return err
	}
	trafficDone := make(chan struct{})
	go func() {
		defer close(trafficDone)
		sendTraffic(ctx, cl, appNS, appName, os.Stdout)
	}()
	cleanups = append(cleanups, func() { <-trafficDone })

	printRealNodeHelp(os.Stdout, o, node.Kubeconfig, prom.URL, logPath)
	<-ctx.Done()
	return nil
}

// helmInstall installs the chart as its README says, without cert-manager
// (certificates.mode=self-managed), with the guard's image from the node's
// registry and its metric checks pointed at prometheus; it waits for the
// guard's pods to be Ready.
func helmInstall(ctx context.Context, node *harness.Node, workDir, prometheus string, log io.Writer) error {
	helm := filepath.Join(workDir, "helm")
	cmd := exec.CommandContext(ctx, filepath.Join(node.Tools, "helm"), "install", "deployguard", filepath.Join(harness.RepoRoot(), "config", "helm", "deployguard"),
		"-n", harness.GuardNamespace, "--create-namespace",
		"--set", "image.repository="+harness.Registry+"/"+image.GuardRepository,
		"--set", "certificates.mode=self-managed",
		"--set", "config.checks.prometheus.url="+prometheus,
		"--wait", "--timeout", "5m")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+node.Kubeconfig,
		"HELM_CACHE_HOME="+filepath.Join(helm, "cache"), "HELM_CONFIG_HOME="+filepath.Join(helm, "config"), "HELM_DATA_HOME="+filepath.Join(helm, "data"))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = io.MultiWriter(log, &out), io.MultiWriter(log, &out)
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("helm install of config/helm/deployguard: %w\n%s", err, out.String())
	}
	return nil
}

// applyCheck applies the sample check once the chart's CRD serves it and
// the guard's webhook, which judges checks, answers (its CA is injected by
// the guard's leader, which may come a moment after helm's wait).
func applyCheck(ctx context.Context, node *harness.Node) error {
	if _, err := node.Kubectl(ctx, node.Kubeconfig, "wait", "--for=condition=Established", "--timeout=1m", "crd/clusterdeploymentchecks.deployguard.io"); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		_, err := node.Kubectl(ctx, node.Kubeconfig, "apply", "-f", filepath.Join(harness.RepoRoot(), checkSample))
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(2 * time.Second):
		}
	}
}

func printRealNodeHelp(w io.Writer, o options, kubeconfig, prometheus, logPath string) {
	fmt.Fprintf(w, `
deployguard is installed by helm on a real node and measures each new revision
in Prometheus with the check %[1]s.

  kubeconfig: %[2]s
  Prometheus: %[3]s
  logs:       %[4]s, and the node's in %[5]s

The cluster exists only in the network namespace %[6]q. In a second terminal,
as root:

  ip netns exec %[6]s bash
  cd %[7]s
  export KUBECONFIG=%[2]s PATH=%[8]s:%[9]s:$PATH
  kubectl apply -f %[10]s        # namespace shop (tier=web), web at v1 and its Service
  # This process sends 20 requests a second to the Service and prints what they get.
  kubectl -n shop rollout status deploy/web
  kubectl deployguard status shop/web      # "known-good revision 1" once its 30s bake window passed
  kubectl -n shop set image deploy/web app=%[11]s/testapp:errors   # serves 30%% 5xx while Ready
  kubectl -n shop get events --field-selector involvedObject.kind=Deployment -w
  # MetricCheckFailed (error-rate), then AutoRollback to known-good revision 1
  kubectl deployguard status shop/web

Press Ctrl-C to stop everything.
`, checkSample, kubeconfig, prometheus, logPath, filepath.Join(o.workDir, "node"), netnsName, harness.RepoRoot(),
		o.tools, filepath.Dir(o.guard), appSample, harness.Registry)
}
