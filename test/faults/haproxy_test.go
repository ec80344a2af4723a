package faults

import (
	"context"
	"encoding/csv"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/deployguard/deployguard/test/harness"
)

// slot is one place for a guard replica behind the load balancer: its webhook
// port and its health-probe port. A slot without a process is simply down, as
// an endpoint of a Service whose pod is gone; a rolling update starts each new
// replica in a fresh slot, as a new pod gets a new address.
type slot struct {
	name                   string
	webhookPort, probePort int
}

// haproxy plays the part of the guard's Service: TCP mode, so that TLS goes
// through to the guards, whose certificate the webhook configurations'
// caBundle trusts; each replica is health-checked on /readyz of its probe
// port, as the kubelet's readiness probe feeds a Service's endpoints.
type haproxy struct {
	front, stats int
	slots        []slot
	cmd          *exec.Cmd
	done         chan error
}

// haproxyConfig is the load balancer's configuration. A check every 500ms and
// two failed ones to mark a replica down (1s at most) leave the guard's 5s
// shutdown delay plenty; one good check brings a replica in. redispatch and
// retries move a connection that cannot be made (a replica just killed) to
// another replica; nothing can move a request already sent. The client and
// server timeouts are longer than any idle keep-alive connection of the API
// server, so that the load balancer never closes one under a request.
func haproxyConfig(front, stats int, slots []slot) string {
	var b strings.Builder
	fmt.Fprintf(&b, `global
  log stdout format raw local0
  maxconn 4000

defaults
  mode tcp
  log global
  option tcplog
  option redispatch
  retries 3
  timeout connect 1s
  timeout client 10m
  timeout server 10m
  timeout check 1s

frontend webhooks
  bind 127.0.0.1:%d
  default_backend guards

backend guards
  balance roundrobin
  option httpchk GET /readyz
  http-check expect status 200
  default-server inter 500ms fall 2 rise 1
`, front)
	for _, s := range slots {
		fmt.Fprintf(&b, "  server %s 127.0.0.1:%d check port %d\n", s.name, s.webhookPort, s.probePort)
	}
	fmt.Fprintf(&b, `
frontend stats
  mode http
  bind 127.0.0.1:%d
  stats enable
  stats uri /stats
`, stats)
	return b.String()
}

// startHAProxy runs haproxy in the foreground with n slots, its log (one line
// per connection, with the replica it went to) in dir.
func startHAProxy(dir string, n int, log io.Writer) (*haproxy, error) {
	bin, err := exec.LookPath("haproxy")
	if err != nil {
		return nil, fmt.Errorf("the faults tier needs HAProxy (Debian package haproxy; `make test-faults` installs it with apt-get): %w", err)
	}
	h := &haproxy{done: make(chan error, 1)}
	ports := make([]int, 2+2*n)
	for i := range ports {
		if ports[i], err = harness.FreePort(); err != nil {
			return nil, err
		}
	}
	h.front, h.stats = ports[0], ports[1]
	for i := range n {
		h.slots = append(h.slots, slot{name: fmt.Sprintf("guard%d", i), webhookPort: ports[2+2*i], probePort: ports[3+2*i]})
	}
	cfg := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(cfg, []byte(haproxyConfig(h.front, h.stats, h.slots)), 0o600); err != nil {
		return nil, err
	}
	check := exec.Command(bin, "-c", "-f", cfg)
	if out, err := check.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("haproxy refuses its configuration: %w\n%s", err, out)
	}
	h.cmd = exec.Command(bin, "-db", "-f", cfg)
	h.cmd.Stdout, h.cmd.Stderr = log, log
	h.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := h.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting haproxy: %w", err)
	}
	go func() { h.done <- h.cmd.Wait() }()
	return h, nil
}

func (h *haproxy) url() string { return fmt.Sprintf("https://127.0.0.1:%d", h.front) }

func (h *haproxy) stop() {
	if h == nil || h.cmd == nil || h.cmd.Process == nil {
		return
	}
	_ = h.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-h.done:
	case <-time.After(10 * time.Second):
		_ = h.cmd.Process.Kill()
		<-h.done
	}
}

// serverState is what HAProxy's statistics say of one replica slot.
type serverState struct {
	Status   string // UP, DOWN, …
	Sessions int    // connections it was given, in all (stot)
	Current  int    // connections open now (scur)
}

// servers reads HAProxy's statistics page (CSV).
func (h *haproxy) servers(ctx context.Context) (map[string]serverState, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/stats;csv", h.stats), nil)
	if err != nil {
		return nil, err
	}
	hc := &http.Client{Timeout: 2 * time.Second}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	return parseStats(string(b), "guards")
}

// parseStats picks the servers of backend out of HAProxy's CSV statistics.
func parseStats(body, backend string) (map[string]serverState, error) {
	body = strings.TrimPrefix(body, "# ")
	rows, err := csv.NewReader(strings.NewReader(body)).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("reading HAProxy's statistics: %w", err)
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("HAProxy's statistics are empty")
	}
	col := map[string]int{}
	for i, name := range rows[0] {
		col[name] = i
	}
	for _, need := range []string{"pxname", "svname", "status", "stot", "scur"} {
		if _, ok := col[need]; !ok {
			return nil, fmt.Errorf("HAProxy's statistics have no %s column", need)
		}
	}
	out := map[string]serverState{}
	for _, r := range rows[1:] {
		if len(r) < len(rows[0]) || r[col["pxname"]] != backend || r[col["svname"]] == "BACKEND" {
			continue
		}
		var s serverState
		s.Status = r[col["status"]]
		if _, err := fmt.Sscan(r[col["stot"]], &s.Sessions); err != nil {
			return nil, fmt.Errorf("stot of %s: %w", r[col["svname"]], err)
		}
		if _, err := fmt.Sscan(r[col["scur"]], &s.Current); err != nil {
			return nil, fmt.Errorf("scur of %s: %w", r[col["svname"]], err)
		}
		out[r[col["svname"]]] = s
	}
	return out, nil
}

// waitStatus waits until HAProxy gives server the status want (UP or DOWN).
func (h *haproxy) waitStatus(ctx context.Context, server, want string, timeout time.Duration) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		st, err := h.servers(ctx)
		if err != nil {
			last = err.Error()
			return false, nil
		}
		last = st[server].Status
		return strings.HasPrefix(last, want), nil
	})
	if err != nil {
		return fmt.Errorf("HAProxy did not see %s %s (last: %s): %w", server, want, last, err)
	}
	return nil
}

// connectionEnds counts, per replica slot, how HAProxy's connections to it
// ended, from its TCP log: the two-letter termination state, "--" for a
// normal close, "SD" for one the server cut in the middle of an exchange
// (what a killed replica does to a request in flight), "CD" for one the
// client (kube-apiserver) closed.
func connectionEnds(log, frontend string) map[string]map[string]int {
	out := map[string]map[string]int{}
	for _, line := range strings.Split(log, "\n") {
		// client [date] frontend backend/server Tw/Tc/Tt bytes state …
		f := strings.Fields(line)
		if len(f) < 7 || f[2] != frontend {
			continue
		}
		_, server, ok := strings.Cut(f[3], "/")
		if !ok {
			continue
		}
		if out[server] == nil {
			out[server] = map[string]int{}
		}
		out[server][f[6]]++
	}
	return out
}
