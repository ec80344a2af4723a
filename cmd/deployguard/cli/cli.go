// Package cli holds what the deployguard commands share: the cluster client
// and its namespace as kubectl finds them, flag and argument helpers, and the
// policy engine built from the config file, so that serve, check and test
// apply the same policies.
package cli

import (
	"context"
	"fmt"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/cmd/deployguard/config"
	"github.com/deployguard/deployguard/policy"
)

// Exit codes the commands share: 0 passed, 1 failed (refused, denied, a
// rollout that failed), 2 the command line was wrong.
const (
	ExitOK     = 0
	ExitFailed = 1
	ExitUsage  = 2
)

// Version is the build's version, which main sets from its -ldflags value;
// clients send it in their user agent.
var Version = "dev"

// Timeout bounds the cluster subcommands (restore, uninstall).
const Timeout = 5 * time.Minute

// NewClient is a client from kubeconfig (or the in-cluster configuration or
// $KUBECONFIG when empty), for serve and check, which are not kubectl-style
// cluster commands (Cluster is).
func NewClient(kubeconfig string) (client.Client, error) {
	cfg, err := RestConfig(kubeconfig)
	if err != nil {
		return nil, err
	}
	return newClient(cfg)
}

// RestConfig is NewClient's configuration. Its client-side rate limit is
// the loader's: client-go's 5 requests a second from a kubeconfig (QPS left
// 0), controller-runtime's 20 in a cluster; serve sets its own
// (--kube-api-qps).
func RestConfig(kubeconfig string) (*rest.Config, error) {
	var (
		c   *rest.Config
		err error
	)
	if kubeconfig != "" {
		c, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		c, err = ctrl.GetConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("loading the cluster configuration: %w", err)
	}
	c.UserAgent = "deployguard/" + Version
	c.Timeout = 30 * time.Second
	return c, nil
}

// NewPolicyEngine builds the engine from the config file and loads the
// built-in library (less what the file switches off) and the policy directory.
// serve and check share it, so that both apply the same policies.
func NewPolicyEngine(ctx context.Context, cfg config.Config, dir string) (*policy.Engine, []policy.Source, error) {
	opts, err := cfg.PolicyOptions()
	if err != nil {
		return nil, nil, err
	}
	eng, err := policy.New(opts)
	if err != nil {
		return nil, nil, err
	}
	base := policy.Builtins()
	if dir != "" {
		fromDir, err := policy.FromDir(dir)
		if err != nil {
			return nil, nil, fmt.Errorf("reading policies from %s: %w", dir, err)
		}
		base = append(base, fromDir...)
	}
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := eng.Load(lctx, base); err != nil {
		return nil, nil, fmt.Errorf("loading policies: %w", err)
	}
	return eng, base, nil
}
