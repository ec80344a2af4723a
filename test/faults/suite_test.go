// Package faults proves on a full local cluster (real kube-apiserver,
// kube-controller-manager, kube-scheduler, kwok nodes) that guard replicas
// behind a load balancer can be killed and upgraded under admission load: HAProxy
// plays the Service, health-checking each replica's /readyz, and the webhook
// configurations point at it. Needs haproxy on PATH (`make test-faults`
// installs Debian's package).
package faults

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/test/harness"
)

// tier has the control plane, the guard binary and the tier's work folder:
// each test starts a cluster of its own in a folder of its own.
var tier *harness.Tier

func TestMain(m *testing.M) {
	os.Exit(harness.RunTier(m, harness.TierOptions{
		Name: "faults",
		// The API server relays the mutating webhook's warning (selector
		// defaulted) with nine requests in ten: the load's client drops them.
		Logger: func(io.Writer) logr.Logger { return logr.Discard() },
		Setup: func(_ context.Context, tr *harness.Tier) error {
			tier = tr
			return nil
		},
	}))
}

// env is a test's own cluster, an admin client, the guard's kubeconfig, and
// HAProxy with slots in front of the webhooks as deployed; all of it goes
// when the test ends.
type env struct {
	cluster    *harness.Cluster
	admin      client.Client
	kubeconfig string
	lb         *haproxy
}

// startEnv starts env in dir. adminConfig, when set, adjusts the admin
// client's configuration.
func startEnv(ctx context.Context, t *testing.T, dir string, log io.Writer, name string, slots int, adminConfig func(*rest.Config) *rest.Config) env {
	t.Helper()
	cluster, err := harness.StartClusterWith(ctx, tier.Tools, fmt.Sprintf("dg-%s-%d", name, os.Getpid()), filepath.Join(dir, "cluster"), 1, log)
	require.NoError(t, err)
	t.Cleanup(func() {
		if err := cluster.Stop(); err != nil {
			t.Logf("deleting the cluster: %v", err)
		}
	})
	cfg, err := cluster.RESTConfig()
	require.NoError(t, err)
	if adminConfig != nil {
		cfg = adminConfig(cfg)
	}
	admin, err := client.New(cfg, client.Options{Scheme: scheme()})
	require.NoError(t, err)
	kubeconfig := filepath.Join(dir, "guard.kubeconfig")
	require.NoError(t, cluster.GuardKubeconfig(ctx, admin, kubeconfig))
	hlog, err := os.Create(filepath.Join(dir, "haproxy.log"))
	require.NoError(t, err)
	t.Cleanup(func() { hlog.Close() })
	lb, err := startHAProxy(dir, slots, hlog)
	require.NoError(t, err)
	t.Cleanup(lb.stop)
	// The deployed webhooks, pointed at the load balancer; the replicas
	// (self-managed mode, one shared Secret) inject the CA they all serve under.
	require.NoError(t, harness.InstallWebhooksFrom(ctx, admin, harness.WebhookManifests(), lb.url(), nil))
	return env{cluster: cluster, admin: admin, kubeconfig: kubeconfig, lb: lb}
}
