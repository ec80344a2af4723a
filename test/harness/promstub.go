package harness

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
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
	"sync"
	"syscall"
	"testing"
	"time"
)

// PromStub is a stand-in Prometheus (test/tools/promql -serve): the real
// PromQL engine over a TSDB the test fills with Load.
type PromStub struct {
	url  string
	proc *Process
	http *http.Client
}

// PromStubDir is the module that builds the stand-in (Prometheus's heavy
// dependencies kept out of the main module).
func PromStubDir() string { return filepath.Join(RepoRoot(), "test", "tools", "promql") }

// StartPromStub builds the stand-in once per machine (BuildPromStub), starts
// it on a free port of 127.0.0.1, waits until it is ready and stops it when
// the test ends.
func StartPromStub(t testing.TB) *PromStub {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	bin, err := BuildPromStub(ctx)
	if err != nil {
		t.Fatalf("building the Prometheus stand-in: %v", err)
	}
	s, err := startPromStub(bin, filepath.Join(t.TempDir(), "promql.log"))
	if s != nil {
		t.Cleanup(func() {
			if err := s.proc.Stop(); err != nil {
				t.Logf("stopping the Prometheus stand-in: %v", err)
			}
		})
	}
	if err != nil {
		t.Fatalf("starting the Prometheus stand-in: %v", err)
	}
	return s
}

// LaunchPromStub is StartPromStub for a tier's TestMain, which has no test
// to tie it to: the caller stops it (Stop). Its log goes to logPath.
func LaunchPromStub(ctx context.Context, logPath string) (*PromStub, error) {
	bin, err := BuildPromStub(ctx)
	if err != nil {
		return nil, fmt.Errorf("building the Prometheus stand-in: %w", err)
	}
	s, err := startPromStub(bin, logPath)
	if err != nil {
		if s != nil {
			_ = s.proc.Stop()
		}
		return nil, fmt.Errorf("starting the Prometheus stand-in: %w", err)
	}
	return s, nil
}

// Stop stops the stand-in.
func (s *PromStub) Stop() error { return s.proc.Stop() }

func startPromStub(bin, logPath string) (*PromStub, error) {
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close() // the child holds its own descriptor
	cmd := exec.Command(bin, "-serve", "127.0.0.1:0")
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &PromStub{proc: &Process{cmd: cmd, done: make(chan error, 1)}, http: &http.Client{Timeout: 30 * time.Second}}
	// The first line on stdout is the URL; Wait only once stdout is read
	// to its end (os/exec's rule for StdoutPipe).
	first := make(chan string, 1)
	go func() {
		r := bufio.NewReader(stdout)
		line, _ := r.ReadString('\n')
		first <- strings.TrimSpace(line)
		_, _ = io.Copy(io.Discard, r)
		s.proc.done <- cmd.Wait()
	}()
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	select {
	case s.url = <-first:
	case <-deadline.C:
		return s, fmt.Errorf("no address on stdout within 30s (log %s)", logPath)
	}
	if !strings.HasPrefix(s.url, "http://") {
		return s, fmt.Errorf("exited before listening: %s", tailFile(logPath))
	}
	return s, s.waitReady(deadline.C, logPath)
}

// waitReady polls /-/ready until it answers 200, the process exits or the
// deadline passes.
func (s *PromStub) waitReady(deadline <-chan time.Time, logPath string) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		var last string
		resp, err := s.http.Get(s.url + "/-/ready")
		if err != nil {
			last = err.Error()
		} else {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = resp.Status
		}
		select {
		case <-tick.C:
		case <-deadline:
			return fmt.Errorf("%s/-/ready did not answer 200 within 30s (last: %s); log: %s", s.url, last, tailFile(logPath))
		}
		if s.proc.Exited() {
			return fmt.Errorf("exited: %s", tailFile(logPath))
		}
	}
}

// URL is the stand-in's base URL, as a Prometheus URL for the guard.
func (s *PromStub) URL() string { return s.url }

// Load appends every sample of text (Prometheus text exposition format, e.g.
// `http_requests_total{namespace="a",code="500"} 42`) at at, or now when at
// is zero. Samples up to an hour in the past may be appended after later
// ones, so a test can backfill history.
func (s *PromStub) Load(t testing.TB, text string, at time.Time) {
	t.Helper()
	u := s.url + "/load"
	if !at.IsZero() {
		u += "?time=" + strconv.FormatFloat(float64(at.UnixMilli())/1000, 'f', 3, 64)
	}
	s.post(t, u, "text/plain; version=0.0.4", text)
}

// SetFailing makes every query answer 503 (Prometheus down) while on.
func (s *PromStub) SetFailing(t testing.TB, on bool) {
	t.Helper()
	s.post(t, s.url+"/-/fail?on="+strconv.FormatBool(on), "", "")
}

func (s *PromStub) post(t testing.TB, u, contentType, body string) {
	t.Helper()
	resp, err := s.http.Post(u, contentType, strings.NewReader(body))
	if err != nil {
		t.Fatalf("POST %s: %v", u, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		t.Fatalf("POST %s: %s: %s", u, resp.Status, b)
	}
}

// promStubBuilt caches the binary's path in this process once built.
var promStubBuilt struct {
	sync.Mutex
	bin string
}

// BuildPromStub returns the stand-in's binary, built into
// bin/tools/promql/<hash of the module's go.mod, go.sum and Go files>/promql
// unless it is there already, so that a warm run does not build. A file lock
// keeps parallel test binaries from building it twice.
func BuildPromStub(ctx context.Context) (string, error) {
	promStubBuilt.Lock()
	defer promStubBuilt.Unlock()
	if promStubBuilt.bin != "" {
		return promStubBuilt.bin, nil
	}
	src := PromStubDir()
	sum, err := sourceHash(src)
	if err != nil {
		return "", err
	}
	cache := filepath.Join(RepoRoot(), "bin", "tools", "promql")
	bin := filepath.Join(cache, sum, "promql")
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		return "", err
	}
	unlock, err := lockFile(filepath.Join(cache, ".build.lock"))
	if err != nil {
		return "", err
	}
	defer unlock()
	if _, err := os.Stat(bin); err == nil {
		promStubBuilt.bin = bin
		return bin, nil
	}
	tmp := bin + ".tmp-" + strconv.Itoa(os.Getpid())
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", tmp, ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "GOWORK=off")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		_ = os.Remove(tmp)
		return "", fmt.Errorf("go build in %s: %w\n%s", src, err, tail(out.String(), 2000))
	}
	// Renamed whole: a binary at bin is always complete.
	if err := os.Rename(tmp, bin); err != nil {
		return "", err
	}
	removeOlderBuilds(cache, sum)
	promStubBuilt.bin = bin
	return bin, nil
}

// removeOlderBuilds removes the stand-in's builds from sources other than
// keep's, so that bin/tools/promql holds one build, not one per edit. A
// failure only leaves a stale build behind.
func removeOlderBuilds(cache, keep string) {
	entries, err := os.ReadDir(cache)
	if err != nil {
		return
	}
	for _, e := range entries {
		if e.IsDir() && e.Name() != keep && !strings.HasPrefix(e.Name(), ".") {
			_ = os.RemoveAll(filepath.Join(cache, e.Name()))
		}
	}
}

// sourceHash identifies what the binary is built from.
func sourceHash(dir string) (string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", err
	}
	var names []string
	for _, e := range entries {
		n := e.Name()
		if n == "go.mod" || n == "go.sum" || (strings.HasSuffix(n, ".go") && !strings.HasSuffix(n, "_test.go")) {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	h := sha256.New()
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s %d\n", n, len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// lockFile takes an exclusive flock on path, waiting for it.
func lockFile(path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	return func() { f.Close() }, nil // closing releases the lock
}

func tailFile(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	return tail(string(b), 2000)
}
