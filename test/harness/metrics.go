package harness

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// MetricsScraper is the ServiceAccount (in GuardNamespace) that the tiers
// scrape the guard's /metrics as, bound to config/rbac's
// deployguard-metrics-reader as a Prometheus would be; and the name of its
// user in the guard's kubeconfig (GuardKubeconfig), where the scrapes find
// its token.
const MetricsScraper = "deployguard-metrics-scraper"

// addMetricsScraper creates the scraper's ServiceAccount and binding and adds
// a user holding a token for it to cfg.
func (c *Cluster) addMetricsScraper(ctx context.Context, cl client.Client, cfg *clientcmdapi.Config) error {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: MetricsScraper, Namespace: GuardNamespace}}
	if err := cl.Create(ctx, sa); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating the metrics scraper's service account: %w", err)
	}
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: MetricsScraper},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "deployguard-metrics-reader"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: MetricsScraper, Namespace: GuardNamespace}},
	}
	if err := cl.Create(ctx, crb); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("binding the metrics scraper to deployguard-metrics-reader: %w", err)
	}
	token, err := c.Kubectl(ctx, c.Kubeconfig, "create", "token", MetricsScraper, "-n", GuardNamespace, "--duration", "24h")
	if err != nil {
		return err
	}
	cfg.AuthInfos[MetricsScraper] = &clientcmdapi.AuthInfo{Token: strings.TrimSpace(token)}
	return nil
}

// MetricsScraperToken is the scraper's token in a kubeconfig that
// GuardKubeconfig wrote.
func MetricsScraperToken(kubeconfig string) (string, error) {
	cfg, err := clientcmd.LoadFromFile(kubeconfig)
	if err != nil {
		return "", err
	}
	u, ok := cfg.AuthInfos[MetricsScraper]
	if !ok || u.Token == "" {
		return "", fmt.Errorf("%s holds no %s user: not written by GuardKubeconfig", kubeconfig, MetricsScraper)
	}
	return u.Token, nil
}

// MetricsSecure reports whether the guard serves /metrics behind
// authentication, as by default (not started with --metrics-secure=false).
func (g *Guard) MetricsSecure() bool {
	return !slices.Contains(g.Opts.ExtraArgs, "--metrics-secure=false")
}

// MetricsURL is the address of the guard's /metrics.
func (g *Guard) MetricsURL() string {
	if g.MetricsSecure() {
		return "https://" + g.Metrics + "/metrics"
	}
	return "http://" + g.Metrics + "/metrics"
}

// GetMetrics fetches the guard's /metrics with token as a bearer token (none
// when empty). The certificate is the guard's own on loopback, not verified.
func (g *Guard) GetMetrics(token string) (int, string, error) {
	req, err := http.NewRequest(http.MethodGet, g.MetricsURL(), nil)
	if err != nil {
		return 0, "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// Scrape reads the guard's /metrics as Prometheus does: with the metrics
// scraper's token when the endpoint asks for one.
func (g *Guard) Scrape() (int, string, error) {
	if !g.MetricsSecure() {
		return g.GetMetrics("")
	}
	token, err := MetricsScraperToken(g.Opts.Kubeconfig)
	if err != nil {
		return 0, "", errors.Join(errors.New("scraping /metrics needs the metrics scraper's token"), err)
	}
	return g.GetMetrics(token)
}
