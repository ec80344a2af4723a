package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/deployguard/deployguard/test/image"
)

// PrometheusOptions describe a real Prometheus (built by `make node-tools`)
// that scrapes the test app's pods of a real node.
type PrometheusOptions struct {
	// NodeTools is the folder of the node's binaries, Prometheus among them.
	NodeTools string
	// Kubeconfig is what its Kubernetes discovery lists pods with.
	Kubeconfig string
	// Dir holds its config, its data and its log (prometheus.log).
	Dir string
	// Host is the address it listens on: NodeIP, where pods (the guard's)
	// reach it as they reach the API server.
	Host string
	// Namespaces whose pods are scraped; none: every namespace.
	Namespaces []string
	// ScrapeInterval defaults to 2s: a check's rate over 30s then has
	// samples a few seconds after a pod is Ready.
	ScrapeInterval time.Duration
}

// Prometheus is a running Prometheus server.
type Prometheus struct {
	// URL is its address, as the guard's checks.prometheus.url names it.
	URL string
	// Log is its output.
	Log  string
	proc *Process
}

// StartPrometheus runs Prometheus with PrometheusConfig and returns once it
// answers /-/ready, or with the end of its log when it exits or ctx ends
// first.
func StartPrometheus(ctx context.Context, o PrometheusOptions) (*Prometheus, error) {
	bin := filepath.Join(o.NodeTools, "prometheus")
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("prometheus is missing in %s: run `make node-tools` (test/tools/build-node.sh builds it)", o.NodeTools)
	}
	if o.ScrapeInterval == 0 {
		o.ScrapeInterval = 2 * time.Second
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, err
	}
	cfg := filepath.Join(o.Dir, "prometheus.yml")
	if err := os.WriteFile(cfg, []byte(PrometheusConfig(o.Kubeconfig, o.Namespaces, o.ScrapeInterval)), 0o644); err != nil {
		return nil, err
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	p := &Prometheus{URL: fmt.Sprintf("http://%s:%d", o.Host, port), Log: filepath.Join(o.Dir, "prometheus.log")}
	out, err := os.Create(p.Log)
	if err != nil {
		return nil, err
	}
	p.proc, err = startProcess(bin, []string{"--config.file=" + cfg, "--storage.tsdb.path=" + filepath.Join(o.Dir, "data"),
		fmt.Sprintf("--web.listen-address=%s:%d", o.Host, port), "--storage.tsdb.retention.time=1h", "--log.level=info"}, os.Environ(), out)
	out.Close() // the process has its own descriptor
	if err != nil {
		return nil, fmt.Errorf("starting prometheus: %w", err)
	}
	if err := p.waitReady(ctx); err != nil {
		_ = p.Stop()
		return nil, err
	}
	return p, nil
}

func (p *Prometheus) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		if p.proc.Exited() {
			return fmt.Errorf("prometheus exited\n--- end of its log ---\n%s", TailFile(p.Log, 2000))
		}
		if resp, err := http.Get(p.URL + "/-/ready"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("prometheus not ready within a minute\n--- end of its log ---\n%s", TailFile(p.Log, 2000))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Stop ends Prometheus (SIGTERM, SIGKILL after 10s) and waits for it.
// Stopping it again returns at once.
func (p *Prometheus) Stop() error { return p.proc.Stop() }

// Scalar runs an instant query and returns its one sample's value.
func (p *Prometheus) Scalar(ctx context.Context, query string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.URL+"/api/v1/query?query="+url.QueryEscape(query), nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var body struct {
		Status string `json:"status"`
		Data   struct {
			Result []struct {
				Value [2]any `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return 0, fmt.Errorf("%s: %w", resp.Status, err)
	}
	if body.Status != "success" || len(body.Data.Result) != 1 {
		return 0, fmt.Errorf("%s: status %q, %d samples", resp.Status, body.Status, len(body.Data.Result))
	}
	v, ok := body.Data.Result[0].Value[1].(string)
	if !ok {
		return 0, fmt.Errorf("a sample value of %T", body.Data.Result[0].Value[1])
	}
	return strconv.ParseFloat(v, 64)
}

// QueriesServed is how many instant queries Prometheus answered, from its
// own metrics.
func (p *Prometheus) QueriesServed() (float64, error) {
	resp, err := http.Get(p.URL + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return 0, err
	}
	f, ok := fams["prometheus_http_requests_total"]
	if !ok {
		return 0, errors.New("no prometheus_http_requests_total")
	}
	var n float64
	for _, m := range f.GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "handler" && l.GetValue() == "/api/v1/query" {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n, nil
}

// PrometheusConfig scrapes the test app's pods (its container "app", on its
// port) found by Prometheus's Kubernetes discovery, in namespaces (none:
// every one), with the labels a check selects a revision by: namespace, pod
// and pod_template_hash (the ReplicaSet's label), as the metric checks'
// docs (reconciler/analysis/README.md) tell a platform to relabel.
func PrometheusConfig(kubeconfig string, namespaces []string, scrapeInterval time.Duration) string {
	selected := ""
	if len(namespaces) > 0 {
		selected = fmt.Sprintf("\n    namespaces: {names: [%s]}", strings.Join(namespaces, ", "))
	}
	return fmt.Sprintf(`global:
  scrape_interval: %[1]s
  scrape_timeout: 1s
scrape_configs:
- job_name: testapp
  kubernetes_sd_configs:
  - role: pod
    kubeconfig_file: %[2]s%[3]s
  relabel_configs:
  - {source_labels: [__meta_kubernetes_pod_container_name], regex: app, action: keep}
  - {source_labels: [__meta_kubernetes_pod_ip], regex: '(.+)', target_label: __address__, replacement: '${1}:%[4]d'}
  - {source_labels: [__meta_kubernetes_namespace], target_label: namespace}
  - {source_labels: [__meta_kubernetes_pod_name], target_label: pod}
  - {source_labels: [__meta_kubernetes_pod_label_pod_template_hash], target_label: pod_template_hash}
`, model.Duration(scrapeInterval), kubeconfig, selected, image.AppPort)
}
