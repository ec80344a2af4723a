package harness

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// CertManagerVersion is the cert-manager module whose CRDs and controllers the
// tests run; the main module requires the same version for its API types.
const CertManagerVersion = "v1.21.2"

// CertManagerCRDs is the folder of cert-manager's CRDs in its Go module.
func CertManagerCRDs(ctx context.Context) (string, error) {
	cmd := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", "github.com/cert-manager/cert-manager")
	cmd.Dir = RepoRoot()
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("finding the cert-manager module: %w", err)
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), "deploy", "crds")
	if _, err := os.Stat(dir); err != nil {
		return "", fmt.Errorf("cert-manager's CRDs: %w", err)
	}
	return dir, nil
}

// BuildCertManager builds test/tools/certmanager (cert-manager's controllers
// and cainjector from its Go module) into bin/tools/cert-manager-VERSION and
// returns the binary's path. Go's build cache makes a second build a no-op;
// the first takes minutes.
func BuildCertManager(ctx context.Context, out io.Writer) (string, error) {
	bin := filepath.Join(RepoRoot(), "bin", "tools", "cert-manager-"+CertManagerVersion, "certmanager")
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", bin, ".")
	cmd.Dir = filepath.Join(RepoRoot(), "test", "tools", "certmanager")
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = io.MultiWriter(logOr(out), &buf), io.MultiWriter(logOr(out), &buf)
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("building cert-manager's controllers: %w\n%s", err, tail(buf.String(), 2000))
	}
	return bin, nil
}

// InstallCertManagerCRDs applies cert-manager's CRDs from its module and waits
// until they are established.
func (c *Cluster) InstallCertManagerCRDs(ctx context.Context) error {
	dir, err := CertManagerCRDs(ctx)
	if err != nil {
		return err
	}
	if _, err := c.Kubectl(ctx, c.Kubeconfig, "apply", "--server-side", "-f", dir); err != nil {
		return err
	}
	_, err = c.Kubectl(ctx, c.Kubeconfig, "wait", "--for=condition=Established", "--timeout=60s",
		"crd/certificates.cert-manager.io", "crd/certificaterequests.cert-manager.io", "crd/issuers.cert-manager.io", "crd/clusterissuers.cert-manager.io")
	return err
}

// Process is a test program running in its own process group.
type Process struct {
	cmd  *exec.Cmd
	done chan error
}

// StartCertManager runs cert-manager's controllers and cainjector against the
// cluster of kubeconfig.
func StartCertManager(bin, kubeconfig string, out io.Writer) (*Process, error) {
	cmd := exec.Command(bin, "--kubeconfig", kubeconfig, "--v", "2")
	cmd.Stdout, cmd.Stderr = logOr(out), logOr(out)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting cert-manager's controllers: %w", err)
	}
	p := &Process{cmd: cmd, done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait() }()
	return p, nil
}

// Exited reports whether the process has ended.
func (p *Process) Exited() bool {
	select {
	case err := <-p.done:
		p.done <- err
		return true
	default:
		return false
	}
}

// Stop ends the process (SIGTERM, SIGKILL after 10s) and waits for it.
func (p *Process) Stop() error {
	if p == nil || p.cmd.Process == nil {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		p.done <- err
		var ee *exec.ExitError
		if errors.As(err, &ee) && !ee.Exited() {
			return nil // ended by the signal
		}
		return exitErr(err)
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		err := <-p.done
		p.done <- err
		return errors.New("did not stop within 10s of SIGTERM; killed")
	}
}
