// Command localrun is `make run`: a local cluster with deployguard serving
// its webhooks and reconciling rollouts, until Ctrl-C, which stops every
// process it started. With --node=kwok (the default) the cluster's nodes are
// kwok's (real kube-apiserver, kube-controller-manager and kube-scheduler)
// and the guard is a local process; with --node=real (`make run NODE=real`)
// its one node is real (real.go).
package main

import (
	"context"
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/deployguard/deployguard/test/harness"
)

//go:embed guard.yaml
var guardConfig string

// options are localrun's flags.
type options struct {
	tools, guard, workDir string
	// node is kwok or real.
	node string
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("localrun", flag.ContinueOnError)
	fs.StringVar(&o.tools, "tools", "", "folder of the control plane binaries (make tools)")
	fs.StringVar(&o.guard, "guard", "bin/deployguard", "the deployguard binary")
	fs.StringVar(&o.workDir, "workdir", "bin/local", "folder for the cluster's state, kubeconfig and logs")
	fs.StringVar(&o.node, "node", "kwok", "kwok: kwok's simulated nodes, the guard a local process; real: one real node (kubelet, containerd, runc) in a network namespace of its own, the guard's image installed by helm, a real Prometheus (as root)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.node != "kwok" && o.node != "real" {
		return o, fmt.Errorf("--node=%q: want kwok or real", o.node)
	}
	return o, nil
}

func main() {
	o, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "make run:", err)
		os.Exit(2)
	}
	if o.node == "real" {
		os.Exit(runRealNode(o))
	}
	if err := run(o.tools, o.guard, o.workDir); err != nil {
		fmt.Fprintln(os.Stderr, "make run:", err)
		os.Exit(1)
	}
}

func run(tools, guard, workDir string) error {
	if tools == "" {
		var err error
		if tools, err = harness.ToolsDir(); err != nil {
			return err
		}
	}
	workDir, err := filepath.Abs(workDir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(workDir, 0o755); err != nil {
		return err
	}
	logPath := filepath.Join(workDir, "local.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logFile.Close()

	// Ctrl-C during start-up also stops everything.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	fmt.Printf("Starting a local cluster (2 kwok nodes) and deployguard; logs in %s …\n", logPath)
	l, err := harness.StartLocal(ctx, harness.LocalOptions{
		Tools: tools, Guard: guard, Name: "deployguard", WorkDir: workDir, Nodes: 2,
		GuardConfig: guardConfig, Log: logFile, ClientAuth: true,
		CRDs: []string{filepath.Join(harness.RepoRoot(), "config", "crd", "policyreport"), filepath.Join(harness.RepoRoot(), "config", "crd", "exceptions"),
			filepath.Join(harness.RepoRoot(), "config", "crd", "checks")},
	})
	if err != nil {
		return fmt.Errorf("%w (see %s)", err, logPath)
	}
	defer func() {
		fmt.Println("\nStopping deployguard and the local cluster …")
		l.Stop()
		fmt.Println("Stopped; nothing is left running.")
	}()

	kubeconfig := filepath.Join(workDir, "kubeconfig")
	if err := copyFile(l.Cluster.Kubeconfig, kubeconfig); err != nil {
		return err
	}
	kubectl := filepath.Join(tools, "kubectl")
	fmt.Printf(`
deployguard is running and guarding the local cluster.

  kubeconfig: %[1]s
  kubectl:    %[2]s   (the cluster's own version)
  guard logs: %[3]s
  metrics:    https://%[4]s/metrics   (with a token allowed to read them:
              curl -sk -H "Authorization: Bearer $(%[2]s --kubeconfig %[1]s create token deployguard-metrics-scraper -n deployguard-system)" https://%[4]s/metrics)

Try:
  export KUBECONFIG=%[1]s
  alias kubectl=%[2]s
  kubectl get deploy -A
  kubectl apply -f config/samples/good.yaml
  kubectl apply -f config/samples/empty-selector.yaml        # repaired: see the deployguard.io/defaulted annotation
  kubectl apply -f config/samples/unrepairable-selector.yaml # refused, with the labels to add
  kubectl apply -f config/samples/all-down.yaml              # refused: maxUnavailable would take every replica down
  kubectl get policyreport -A                                # the background audit of existing Deployments
  bin/deployguard audit                                      # the same, by policy then namespace

Press Ctrl-C to stop everything.
`, kubeconfig, kubectl, logPath, l.Guard.Metrics)

	select {
	case <-ctx.Done():
	case <-guardExited(l):
		return fmt.Errorf("deployguard exited unexpectedly (see %s)", logPath)
	}
	return nil
}

// guardExited closes when the guard process ends on its own.
func guardExited(l *harness.Local) <-chan struct{} {
	ch := make(chan struct{})
	go func() {
		for !l.Guard.Exited() {
			time.Sleep(500 * time.Millisecond)
		}
		close(ch)
	}()
	return ch
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
