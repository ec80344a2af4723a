package harness

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// GuardNamespace is the guard's own namespace in every local cluster.
const GuardNamespace = "deployguard-system"

// E2EGuardConfig is the guard configuration of the e2e tier, and of `make
// bench-reaction`, which measures on the same settings. It lowers the
// progress deadline floor so that failed rollouts are seen within seconds,
// and shortens the fail-fast window so that its tests are quick. The drain
// timeout leaves room for a guard killed during a drain to regain the lead
// (its lease expires after 15s) and finish it.
const E2EGuardConfig = `apiVersion: deployguard.io/v1alpha1
kind: GuardConfig
bounds:
  progressDeadlineSeconds: {min: 3, max: 7200}
rollback:
  failFast: {window: 15s, transientWindow: 2m}
cleanup:
  drainTimeout: 45s
`

// GuardOptions start a `deployguard serve` process.
type GuardOptions struct {
	Binary     string
	Kubeconfig string
	// WorkDir holds the guard's certificates and config file.
	WorkDir string
	// Config is the GuardConfig YAML; empty for the defaults.
	Config string
	// WebhookPort is fixed across restarts of the same guard (the webhook
	// configurations point at it); 0 picks a free one.
	WebhookPort int
	// ProbePort is /healthz and /readyz's port; 0 picks a free one. A load
	// balancer health-checking a fixed slot sets it.
	ProbePort int
	ExtraArgs []string
	// Env is added to the guard's environment; DeployedRuntimeEnv is what
	// config/manager gives the deployed guard.
	Env []string
	// Output receives the guard's logs.
	Output io.Writer
}

// DeployedRuntimeEnv is the Go runtime's settings of the deployed guard
// (config/manager/deployment.yaml: GOGC 400, and the 256Mi memory limit, of
// which the guard makes 90% its soft limit), so that what `make run` and the
// benchmarks measure is what runs in clusters.
func DeployedRuntimeEnv() []string {
	return []string{"GOGC=400", "DEPLOYGUARD_MEMORY_LIMIT=268435456"}
}

// Guard is a running deployguard process.
type Guard struct {
	Opts      GuardOptions
	URL       string // https://127.0.0.1:PORT, for webhook configurations
	ProbeAddr string
	Metrics   string
	// Pid is the guard's process id, for /proc readings.
	Pid  int
	cmd  *exec.Cmd
	done chan error
}

// FreePort asks the kernel for a free loopback port, never one it has handed
// out before in this process: a port is closed again until its user binds
// it, and the kernel may offer it again meanwhile (two guards of one test
// were once given the same port, one for its probes, one for its webhook).
func FreePort() (int, error) {
	handedOut.Lock()
	defer handedOut.Unlock()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !handedOut.ports[port] {
			handedOut.ports[port] = true
			return port, nil
		}
	}
	return 0, errors.New("no free loopback port that was not handed out already")
}

var handedOut = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// GuardCertDir is the guard's --cert-dir under its work folder: where it writes
// its self-managed certificate, or where a test puts the files it serves with
// --cert-mode files.
func GuardCertDir(workDir string) string { return filepath.Join(workDir, "tls") }

// StartGuard starts the guard in self-managed certificate mode on loopback and
// returns once the process runs; WaitReady waits for /readyz.
func StartGuard(opts GuardOptions) (*Guard, error) {
	if opts.WebhookPort == 0 {
		p, err := FreePort()
		if err != nil {
			return nil, err
		}
		opts.WebhookPort = p
	}
	probe := opts.ProbePort
	if probe == 0 {
		p, err := FreePort()
		if err != nil {
			return nil, err
		}
		probe = p
	}
	metrics, err := FreePort()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(opts.WorkDir, 0o755); err != nil {
		return nil, err
	}
	args := []string{"serve",
		"--kubeconfig", opts.Kubeconfig,
		"--namespace", GuardNamespace,
		"--cert-mode", "self-managed",
		"--cert-dir", GuardCertDir(opts.WorkDir),
		"--cert-dns-names", "localhost",
		"--cert-ip-addresses", "127.0.0.1",
		"--webhook-host", "127.0.0.1",
		"--webhook-port", strconv.Itoa(opts.WebhookPort),
		"--health-probe-bind-address", "127.0.0.1:" + strconv.Itoa(probe),
		"--metrics-bind-address", "127.0.0.1:" + strconv.Itoa(metrics),
		"--leader-elect",
		// The API server calls this one replica directly: no endpoints to
		// drop it from, so no reason to wait before stopping. A tier with a
		// load balancer in front passes --shutdown-delay in ExtraArgs.
		"--shutdown-delay=0s",
	}
	if opts.Config != "" {
		p := filepath.Join(opts.WorkDir, "guard.yaml")
		if err := os.WriteFile(p, []byte(opts.Config), 0o600); err != nil {
			return nil, err
		}
		args = append(args, "--config", p)
	}
	args = append(args, opts.ExtraArgs...)
	cmd := exec.Command(opts.Binary, args...)
	cmd.Env = append(os.Environ(), opts.Env...)
	out := opts.Output
	if out == nil {
		out = io.Discard
	}
	cmd.Stdout, cmd.Stderr = out, out
	// Its own process group, so that an interrupted test run cannot leave it
	// behind attached to a terminal's signals in odd ways.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting deployguard: %w", err)
	}
	g := &Guard{
		Opts: opts, cmd: cmd, done: make(chan error, 1), Pid: cmd.Process.Pid,
		URL:       fmt.Sprintf("https://127.0.0.1:%d", opts.WebhookPort),
		ProbeAddr: fmt.Sprintf("127.0.0.1:%d", probe),
		Metrics:   fmt.Sprintf("127.0.0.1:%d", metrics),
	}
	go func() { g.done <- cmd.Wait() }()
	return g, nil
}

// WaitReady waits until /readyz answers 200, or the process exits.
func (g *Guard) WaitReady(ctx context.Context, timeout time.Duration) error {
	hc := &http.Client{Timeout: time.Second}
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		select {
		case err := <-g.done:
			g.done <- err
			return false, fmt.Errorf("deployguard exited before it was ready: %w", err)
		default:
		}
		resp, err := hc.Get("http://" + g.ProbeAddr + "/readyz")
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
}

// Get fetches a path of the guard's metrics or probe endpoints; /metrics as
// Prometheus scrapes it (Scrape).
func (g *Guard) Get(addr, path string) (int, string, error) {
	if addr == g.Metrics && path == "/metrics" {
		return g.Scrape()
	}
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := hc.Get("http://" + addr + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// Stop ends the guard as Kubernetes would (SIGTERM, then SIGKILL after a grace
// period) and waits for it.
func (g *Guard) Stop() error {
	if g == nil || g.cmd.Process == nil {
		return nil
	}
	_ = g.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-g.done:
		g.done <- err
		return exitErr(err)
	case <-time.After(15 * time.Second):
		_ = g.cmd.Process.Kill()
		err := <-g.done
		g.done <- err
		return fmt.Errorf("deployguard did not stop within 15s of SIGTERM; killed")
	}
}

// Kill ends the guard at once (SIGKILL), as a crash or a node loss would.
func (g *Guard) Kill() {
	if g == nil || g.cmd.Process == nil {
		return
	}
	_ = g.cmd.Process.Kill()
	err := <-g.done
	g.done <- err
}

// Exited reports whether the process has ended.
func (g *Guard) Exited() bool {
	select {
	case err := <-g.done:
		g.done <- err
		return true
	default:
		return false
	}
}

func exitErr(err error) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == 0 {
		return nil
	}
	return err
}
