package tls

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/certs"
	"github.com/deployguard/deployguard/test/harness"
	guardwebhook "github.com/deployguard/deployguard/webhook"
	"github.com/deployguard/deployguard/webhook/exception"
)

// Short lifetimes: the serving certificate (9s) is renewed about every 6s and
// the CA (30s) about every 20s; every replica syncs every 250ms. The 3 s left
// of a certificate's life at renewal hold on a machine busy with more than
// this test (at 6 s, 2 s did not).
var selfManagedArgs = []string{
	"--self-managed-ca-validity=30s",
	"--self-managed-cert-validity=9s",
	"--self-managed-sync-period=250ms",
	"--cert-check-period=250ms",
}

const (
	loadRate     = 120 // admission requests per second asked for
	minLoadRate  = 100 // and at least achieved
	minRotations = 10
	// Self-managed rotations come from the certificate's life (9s, renewed
	// at two thirds): about 8 in the 50 s of load.
	minSelfManagedRotations = 6
)

func TestSelfManaged(t *testing.T) {
	dir, log := tier.TestWorkDir(t)
	ctx := context.Background()
	startCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	l, err := harness.StartLocal(startCtx, harness.LocalOptions{
		Tools: tier.Tools, Guard: tier.Guard, Name: fmt.Sprintf("dg-tls-sm-%d", os.Getpid()), WorkDir: dir,
		Nodes: 1, GuardArgs: selfManagedArgs, Log: log,
	})
	require.NoError(t, err)
	defer l.Stop()
	cfg, err := l.Cluster.RESTConfig()
	require.NoError(t, err)
	admin, err := client.New(harness.LoadConfig(cfg), client.Options{Scheme: scheme()})
	require.NoError(t, err)
	addr := strings.TrimPrefix(l.Guard.URL, "https://")

	t.Run("rotation under load fails no request", func(t *testing.T) {
		ns := harness.NewNamespace(t, admin)
		// A second replica shares the Secret; the API server calls the first.
		bLog, err := os.Create(filepath.Join(dir, "replica-b.log"))
		require.NoError(t, err)
		defer bLog.Close()
		b, err := harness.StartGuard(harness.GuardOptions{
			Binary: tier.Guard, Kubeconfig: l.GuardKubeconfig, WorkDir: filepath.Join(dir, "replica-b"),
			ExtraArgs: selfManagedArgs, Output: bLog,
		})
		require.NoError(t, err)
		defer b.Stop()
		require.NoError(t, b.WaitReady(ctx, time.Minute))
		watcher, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme()})
		require.NoError(t, err)

		runCtx, stop := context.WithTimeout(ctx, 50*time.Second)
		defer stop()
		writes, err := secretWrites(runCtx, watcher, harness.GuardNamespace, "deployguard-webhook-tls")
		require.NoError(t, err)
		seen := observe(runCtx, certs.DialServed(addr, "localhost"), admin)
		conns, err := apiServerConnections(runCtx, l.Guard.Opts.WebhookPort)
		require.NoError(t, err)
		trust := checkTrust(runCtx, admin, certs.DialServed(addr, "localhost"), certs.DialServed(strings.TrimPrefix(b.URL, "https://"), "localhost"))
		stats := runLoad(runCtx, admin, ns, loadRate)
		lost := len(logLines(t, bLog.Name(), "another replica updated Secret")) + len(logLines(t, log.Name(), "another replica updated Secret"))
		t.Logf("self-managed, 2 replicas: %d Secret writes, %d lost races (conflicts); %d checks of what each replica serves against the injected bundle, %d untrusted",
			writes.Load(), lost, trust.checks, len(trust.untrusted))
		assert.Empty(t, trust.untrusted, "every replica always serves a certificate the API server trusts")
		assert.LessOrEqual(t, writes.Load(), int64(4*(seen.servingRotations()+4)), "replicas do not fight over the Secret")

		t.Logf("self-managed: %s", stats)
		t.Logf("self-managed: %d serving certificate rotations observed at the guard (%d certificates, %d of them handshaked by kube-apiserver over %d new connections), signed by %d CAs in turn; CAs injected: %v",
			seen.servingRotations(), len(seen.leaves), exercised(seen, conns), len(conns.first), len(seen.signingCAs()), seen.injectedCAs())
		assert.Zero(t, stats.Failed.Load(), "failed requests: %v", stats.Failures())
		assert.GreaterOrEqual(t, stats.Rate(), float64(minLoadRate), "admission requests per second")
		assert.GreaterOrEqual(t, seen.servingRotations(), minSelfManagedRotations)
		assert.GreaterOrEqual(t, exercised(seen, conns), minSelfManagedRotations+1, "the API server verified the rotated certificates itself")
		assert.GreaterOrEqual(t, len(seen.signingCAs()), 2, "the CA rotated at least once under load")
		assert.Empty(t, seen.bundleErrors)
		assert.False(t, l.Guard.Exited(), "the guard is still running")
	})

	t.Run("a stalled request body is cut off on every path", func(t *testing.T) {
		// Whoever reaches the port can send a request's headers and stall:
		// on the webhooks' paths and any other, the guard ends the request
		// once its body timeout (10 s) has passed, and closes the
		// connection. The read deadline only stops the test from hanging.
		paths := map[string]string{
			guardwebhook.ValidatePath: "i/o timeout",
			exception.WebhookPath:     "i/o timeout",
			"/no-such-webhook":        "404",
			guardwebhook.BudgetPath:   "i/o timeout",
			guardwebhook.MutatePath:   "i/o timeout",
		}
		conns := map[string]*tls.Conn{}
		for path := range paths {
			conn, err := harness.StallRequest(addr, path)
			require.NoError(t, err)
			defer conn.Close()
			conns[path] = conn
		}
		stalled := time.Now()
		for path, conn := range conns {
			rest, err := harness.ReadUntilClosed(conn, stalled.Add(guardwebhook.DefaultBodyTimeout+30*time.Second))
			require.NoError(t, err, "%s", path)
			assert.Contains(t, rest, paths[path], "%s", path)
		}
		t.Logf("every stalled request ended, the last %s after it stalled", time.Since(stalled).Round(100*time.Millisecond))
	})

	t.Run("expiry metric follows the served certificate", func(t *testing.T) {
		served := certs.DialServed(addr, "localhost")
		var last string
		ok := assert.Eventually(t, func() bool {
			leaf, err := served(ctx)
			if err != nil {
				return false
			}
			v, err := metric(l.Guard, "deployguard_serving_certificate_expiry_seconds")
			last = fmt.Sprintf("metric %v (%v), served certificate expires %d", v, err, leaf.NotAfter.Unix())
			return err == nil && v == float64(leaf.NotAfter.Unix())
		}, 5*time.Second, 50*time.Millisecond)
		if !ok {
			t.Log(last)
		}
	})

	t.Run("TLS 1.2 at least, 1.3 preferred, HTTP/2 off", func(t *testing.T) {
		dial := func(c *tls.Config) (*tls.Conn, error) {
			c.InsecureSkipVerify = true //nolint:gosec // only the protocol is looked at
			return tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, c)
		}
		conn, err := dial(&tls.Config{NextProtos: []string{"h2", "http/1.1"}})
		require.NoError(t, err)
		st := conn.ConnectionState()
		conn.Close()
		assert.Equal(t, uint16(tls.VersionTLS13), st.Version, "TLS 1.3 when the client can")
		assert.Equal(t, "http/1.1", st.NegotiatedProtocol, "HTTP/2 is not offered")

		conn, err = dial(&tls.Config{MaxVersion: tls.VersionTLS12})
		require.NoError(t, err, "TLS 1.2 clients are served")
		conn.Close()

		_, err = dial(&tls.Config{MaxVersion: tls.VersionTLS11})
		assert.Error(t, err, "TLS 1.1 is refused")
		_, err = dial(&tls.Config{NextProtos: []string{"h2"}})
		assert.Error(t, err, "a client that speaks only HTTP/2 is refused")
	})

	// The rest runs a guard with files the test writes, which nothing
	// re-injects or rotates behind its back.
	require.NoError(t, l.Guard.Stop())
	port, err := harness.FreePort()
	require.NoError(t, err)
	guardDir := filepath.Join(dir, "files-guard")
	ca, err := certs.NewCA(time.Now(), time.Hour)
	require.NoError(t, err)
	// Three quarters through its life: renewal was due, nothing renewed it.
	leaf, err := certs.NewServing(ca, []string{"localhost"}, []net.IP{net.ParseIP("127.0.0.1")}, time.Now().Add(-90*time.Second), 120*time.Second)
	require.NoError(t, err)
	_, err = certs.WriteAtomic(harness.GuardCertDir(guardDir), map[string][]byte{"tls.crt": leaf.CertPEM, "tls.key": leaf.KeyPEM})
	require.NoError(t, err)
	require.NoError(t, harness.InstallWebhooks(ctx, admin, fmt.Sprintf("https://127.0.0.1:%d", port), ca.CertPEM))
	guardLog, err := os.Create(filepath.Join(dir, "files-guard.log"))
	require.NoError(t, err)
	defer guardLog.Close()
	// The self-managed guards before this one may have reported their own
	// certificates in the same words.
	filesStarted := metav1.NewMicroTime(time.Now())
	g, err := harness.StartGuard(harness.GuardOptions{
		Binary: tier.Guard, Kubeconfig: l.GuardKubeconfig, WorkDir: guardDir, WebhookPort: port,
		ExtraArgs: []string{"--cert-mode=files", "--cert-check-period=250ms"}, Output: guardLog,
	})
	require.NoError(t, err)
	defer g.Stop()
	require.NoError(t, g.WaitReady(ctx, time.Minute))
	require.NoError(t, harness.WaitForWebhooks(ctx, admin, "default", time.Minute))

	t.Run("readyz fails while the CA bundle does not trust the served certificate", func(t *testing.T) {
		wrong, err := certs.NewCA(time.Now(), time.Hour)
		require.NoError(t, err)
		setBundle(ctx, t, admin, wrong.CertPEM)
		require.Eventually(t, func() bool { return readyzStatus(g) == 500 }, 10*time.Second, 50*time.Millisecond)
		logged := logLines(t, guardLog.Name(), "not what the API server trusts")
		require.NotEmpty(t, logged, "the mismatch is logged")
		assert.Contains(t, logged[0], "does not chain to the CA bundle")
		assert.Contains(t, logged[0], "webhook create.deployments.deployguard.io of ValidatingWebhookConfiguration deployguard-validating")

		setBundle(ctx, t, admin, ca.CertPEM)
		require.Eventually(t, func() bool { return readyzStatus(g) == 200 }, 10*time.Second, 50*time.Millisecond)
		assert.NotEmpty(t, logLines(t, guardLog.Name(), "matches the CA bundle"), "the recovery is logged")
	})

	t.Run("a certificate not rotated in time is reported", func(t *testing.T) {
		require.Eventually(t, func() bool {
			var list eventsv1.EventList
			if err := admin.List(ctx, &list, client.InNamespace("default")); err != nil {
				return false
			}
			for _, e := range list.Items {
				if e.Reason == certs.ReasonServingCertificateExpiring && e.Regarding.Kind == "ValidatingWebhookConfiguration" &&
					e.Regarding.Name == "deployguard-validating" && e.Type == "Warning" && strings.Contains(e.Note, "has not been rotated") &&
					!e.EventTime.Before(&filesStarted) {
					return true
				}
			}
			return false
		}, 15*time.Second, 50*time.Millisecond)
		require.Eventually(t, func() bool { return len(logLines(t, guardLog.Name(), "was not rotated in time")) > 0 },
			10*time.Second, 50*time.Millisecond, "the guard logs it too")
	})
}

// metric reads one unlabelled gauge from the guard's metrics endpoint.
func metric(g *harness.Guard, name string) (float64, error) {
	code, body, err := g.Get(g.Metrics, "/metrics")
	if err != nil {
		return 0, err
	}
	if code != 200 {
		return 0, fmt.Errorf("metrics: status %d", code)
	}
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, fmt.Errorf("no %s in the metrics", name)
}

// logLines returns the lines of a log file that contain s.
func logLines(t *testing.T, path, s string) []string {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if strings.Contains(sc.Text(), s) {
			out = append(out, sc.Text())
		}
	}
	return out
}
