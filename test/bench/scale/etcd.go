package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/client-go/rest"

	"github.com/deployguard/deployguard/test/bench/load"
)

// etcdDBBytes is the size of etcd's database as kube-apiserver reports it
// (apiserver_storage_size_bytes): what etcd's backend quota
// (--quota-backend-bytes, 8 GiB in kwok's clusters) bounds.
func etcdDBBytes(ctx context.Context, cfg *rest.Config) (int64, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(cfg.Host, "/")+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("kube-apiserver's /metrics: HTTP %d", resp.StatusCode)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return 0, err
	}
	m := load.Metrics(families)
	if n := m.Sum("apiserver_storage_size_bytes", nil); n > 0 {
		return int64(n), nil
	}
	// Its name before Kubernetes 1.28, deprecated since.
	return int64(m.Sum("etcd_db_total_size_in_bytes", nil)), nil
}
