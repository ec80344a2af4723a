package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/deployguard/deployguard/test/harness"
	guardwebhook "github.com/deployguard/deployguard/webhook"
	"github.com/deployguard/deployguard/webhook/exception"
)

// junkRequests is how many requests with strings of their own the flood
// sends; junkBytes, how long each junk operation is. A guard that kept a
// series per operation would keep at least junkRequests*junkBytes.
const (
	junkRequests = 1000
	junkBytes    = 32 << 10
)

// Any pod can reach the webhook port when no client certificate is asked
// for (the chart's default: no --client-ca-file, no NetworkPolicy). A second
// replica of the suite's guard, started so, takes a flood of admission
// reviews that no API server sends, each with junk of its own (operations,
// kinds, bodies over the limit, YAML), on every path it serves. It keeps
// nothing of them: no series carries a string the flood chose, the number
// of series and the size of a scrape stay where they were but for the fixed
// set, and the heap in use after a GC grows by far less than the junk sent.
func TestJunkOnTheWebhookPortKeepsNothing(t *testing.T) {
	ctx := context.Background()
	work, logFile := tier.TestWorkDir(t)
	pprof, err := harness.FreePort()
	require.NoError(t, err)
	// A follower of the suite's guard (same lease, same certificate Secret):
	// it serves the webhooks and never reconciles.
	g, err := harness.StartGuard(harness.GuardOptions{
		Binary: tier.Guard, Kubeconfig: local.GuardKubeconfig, WorkDir: filepath.Join(work, "guard"), Config: guardConfig,
		Env: harness.DeployedRuntimeEnv(), Output: logFile,
		ExtraArgs: []string{"--pprof-bind-address", fmt.Sprintf("127.0.0.1:%d", pprof)},
	})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, g.Stop()) })
	require.NoError(t, g.WaitReady(ctx, time.Minute))
	pprofAddr := fmt.Sprintf("127.0.0.1:%d", pprof)

	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		TLSClientConfig:     &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}, //nolint:gosec // the caller is the attacker here
		MaxIdleConnsPerHost: 8,
	}}
	paths := []string{guardwebhook.ValidatePath, guardwebhook.MutatePath, guardwebhook.VerdictPath, guardwebhook.BudgetPath, exception.WebhookPath}
	// One of each first, so that the series of the fixed set a junk request
	// is counted under exist before the reading the flood is compared with.
	for i, path := range paths {
		code, _ := post(t, hc, g.URL+path, junkReview(i, 16))
		require.Equal(t, http.StatusOK, code, path)
	}
	seriesBefore, scrapeBefore := scrape(t, g)
	heapBefore := heapInUse(t, pprofAddr)

	var (
		mu     sync.Mutex
		status = map[int]int{}
		wg     sync.WaitGroup
		next   = make(chan int)
	)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				path := paths[i%len(paths)]
				var body []byte
				switch {
				case i%250 == 0: // over the 7 MiB limit
					body = append(junkReview(i, 16), bytes.Repeat([]byte(" "), guardwebhook.MaxReviewBytes)...)
				case i%50 == 1: // YAML, which controller-runtime's Webhook would decode
					body = append([]byte(fmt.Sprintf("junk%d: [", i)), bytes.Repeat([]byte("1, "), junkBytes/3)...)
				default:
					body = junkReview(i, junkBytes)
				}
				code, _ := post(t, hc, g.URL+path, body)
				if i%250 == 0 && code == -1 {
					// The answer to a body over the limit may come before
					// the client has written it all, and the connection
					// be closed under the write.
					code = http.StatusRequestEntityTooLarge
				}
				mu.Lock()
				status[code]++
				mu.Unlock()
			}
		}()
	}
	for i := range junkRequests {
		next <- i
	}
	close(next)
	wg.Wait()
	heapAfter := heapInUse(t, pprofAddr)
	t.Logf("heap in use after a GC: %.1f MiB before %d junk requests (%d KiB of junk each), %.1f MiB after",
		float64(heapBefore)/(1<<20), junkRequests, junkBytes>>10, float64(heapAfter)/(1<<20))
	assert.GreaterOrEqual(t, status[http.StatusOK], junkRequests-junkRequests/250, "answered with an AdmissionReview: %v", status)
	assert.Equal(t, junkRequests, status[http.StatusOK]+status[http.StatusRequestEntityTooLarge], "every request is answered: %v", status)

	seriesAfter, scrapeAfter := scrape(t, g)
	t.Logf("/metrics: %d series, %d bytes before; %d series, %d bytes after", len(seriesBefore), scrapeBefore, len(seriesAfter), scrapeAfter)
	var junk, added []string
	for s := range seriesAfter {
		if strings.Contains(strings.ToLower(s), "junk") {
			junk = append(junk, s[:min(len(s), 200)])
		}
		if !seriesBefore[s] {
			added = append(added, s[:min(len(s), 200)])
		}
	}
	assert.Zero(t, len(junk), "no series carries what the requests chose, the first: %v", junk[:min(len(junk), 3)])
	// What may appear meanwhile: a bucket of a latency histogram first
	// reached, a Go runtime series; never one per request.
	assert.Less(t, len(added), 50, "series added by %d junk requests, the first: %v", junkRequests, added[:min(len(added), 5)])
	assert.Less(t, scrapeAfter, scrapeBefore+64<<10, "a scrape of /metrics does not grow with the junk")
	assert.Less(t, heapAfter, heapBefore+8<<20, "the heap keeps nothing of the %d MiB of junk", junkRequests*junkBytes>>20)
}

// junkReview is an AdmissionReview of a Deployment that no API server sends:
// an operation of n bytes and a kind of its own, both made of i.
func junkReview(i, n int) []byte {
	op := fmt.Sprintf("JUNK-%d-", i)
	op += strings.Repeat("o", max(0, n-len(op)))
	return fmt.Appendf(nil, `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"junk-%d","kind":{"group":"apps","version":"v1","kind":"JunkKind%d"},"resource":{"group":"apps","version":"v1","resource":"deployments"},"operation":%q,"namespace":"junk-%d","name":"junk-%d","userInfo":{"username":"junk-%d"},"object":{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"junk"}}}}`,
		i, i, op, i, i, i)
}

// post sends body as JSON and returns the status and the answer's start.
func post(t *testing.T, hc *http.Client, url string, body []byte) (int, string) {
	t.Helper()
	resp, err := hc.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		return -1, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, string(b)
}

// scrape reads the guard's /metrics as Prometheus does and returns its
// series (name and labels) and its size.
func scrape(t *testing.T, g *harness.Guard) (map[string]bool, int) {
	t.Helper()
	code, body, err := g.Scrape()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)
	series := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), len(body)+1)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if i := strings.LastIndexByte(line, ' '); i > 0 {
			series[line[:i]] = true
		}
	}
	require.NoError(t, sc.Err())
	return series, len(body)
}

// heapInUse is the guard's heap in use right after a GC: the heap profile
// with gc=1 runs one before it reads the runtime's statistics.
func heapInUse(t *testing.T, pprofAddr string) uint64 {
	t.Helper()
	hc := &http.Client{Timeout: 30 * time.Second}
	resp, err := hc.Get("http://" + pprofAddr + "/debug/pprof/heap?gc=1&debug=1")
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "# HeapInuse = "); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			require.NoError(t, err)
			return n
		}
	}
	require.FailNow(t, "no HeapInuse in the heap profile")
	return 0
}

// With the API server presenting its client certificate (the suite's
// cluster runs so, and the guard has --client-ca-file), every path of the
// webhook port, the PolicyException webhook's and one that serves nothing
// included, refuses a client without that certificate before any admission
// work, and answers one with it.
func TestEveryWebhookPathRequiresTheAPIServersCertificate(t *testing.T) {
	dir := filepath.Join(local.Opts.WorkDir, "client-auth")
	apiServer, err := tls.LoadX509KeyPair(filepath.Join(dir, "webhook-client.crt"), filepath.Join(dir, "webhook-client.key"))
	require.NoError(t, err, "the suite's kube-apiserver presents a client certificate to webhooks")
	paths := map[string]int{ // the answer to the API server's certificate
		guardwebhook.ValidatePath: http.StatusOK, guardwebhook.MutatePath: http.StatusOK, guardwebhook.VerdictPath: http.StatusOK,
		guardwebhook.BudgetPath: http.StatusOK, exception.WebhookPath: http.StatusOK, "/no-such-webhook": http.StatusNotFound,
	}
	tests := []struct {
		name  string
		certs []tls.Certificate
		want  func(path string) int
	}{
		{name: "no certificate", want: func(string) int { return http.StatusForbidden }},
		{name: "the API server's certificate", certs: []tls.Certificate{apiServer}, want: func(path string) int { return paths[path] }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
				InsecureSkipVerify: true, MinVersion: tls.VersionTLS12, Certificates: tt.certs, //nolint:gosec // the guard's own certificate on loopback
			}}}
			for path := range paths {
				code, answer := post(t, hc, local.Guard.URL+path, junkReview(0, 16))
				assert.Equal(t, tt.want(path), code, "%s: %s", path, answer)
			}
		})
	}
}
