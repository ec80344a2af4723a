package cli

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/webhook/exception"
)

// Cluster is the cluster a command talks to, found as kubectl finds it:
// kubectl's own flags (--kubeconfig, --context, -n/--namespace, --as,
// --as-group, --server, --token, --request-timeout, …) through cli-runtime,
// the library kubectl and its plugins share, then $KUBECONFIG,
// ~/.kube/config, or the in-cluster configuration.
type Cluster struct {
	flags *genericclioptions.ConfigFlags
}

// NewCluster is a Cluster to give a verb with NewClusterCommand: made before
// the verb's command, so that the command's completions and RunE can use it.
func NewCluster() *Cluster {
	return &Cluster{flags: genericclioptions.NewConfigFlags(true)}
}

// NewClusterCommand is NewCommand for a verb that talks to cluster: cmd gets
// kubectl's flags for reaching it.
func NewClusterCommand(s Streams, cluster *Cluster, cmd *cobra.Command) *cobra.Command {
	cluster.addFlags(NewCommand(s, cmd))
	return cmd
}

// addFlags gives cmd kubectl's flags for reaching c, and completes the
// namespaces and contexts they name.
func (c *Cluster) addFlags(cmd *cobra.Command) {
	f := c.flags
	f.AddFlags(cmd.Flags())
	_ = cmd.RegisterFlagCompletionFunc("namespace", func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return c.names(&corev1.NamespaceList{}, ""), cobra.ShellCompDirectiveNoFileComp
	})
	_ = cmd.RegisterFlagCompletionFunc("context", func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		raw, err := f.ToRawKubeConfigLoader().RawConfig()
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return slices.Sorted(maps.Keys(raw.Contexts)), cobra.ShellCompDirectiveNoFileComp
	})
}

// CompleteDeployment completes a command's one Deployment argument: the
// names in the namespace of -n or the context, and NAMESPACE/NAME once a
// slash is typed (prefix "deployment/" for rollout's TYPE/NAME form is
// kept as typed).
func (c *Cluster) CompleteDeployment(_ *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	ns, name, slash := strings.Cut(toComplete, "/")
	prefix := ns + "/"
	if !slash {
		prefix, name = "", ns
		var err error
		if ns, _, err = c.Namespace(); err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
	}
	var out []string
	for _, n := range c.names(&appsv1.DeploymentList{}, ns) {
		if strings.HasPrefix(n, name) {
			out = append(out, prefix+n)
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

// names lists the names of list's objects in ns (all when empty), for a
// completion: nothing when the cluster cannot be read, as kubectl does.
func (c *Cluster) names(list client.ObjectList, ns string) []string {
	cl, err := c.Client()
	if err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := cl.List(ctx, list, client.InNamespace(ns)); err != nil {
		return nil
	}
	items, err := meta.ExtractList(list)
	if err != nil {
		return nil
	}
	out := make([]string, 0, len(items))
	for _, o := range items {
		if m, err := meta.Accessor(o); err == nil {
			out = append(out, m.GetName())
		}
	}
	return out
}

// Namespace is the namespace given with -n, else the kubeconfig context's,
// else "default"; given reports whether -n was.
func (c *Cluster) Namespace() (ns string, given bool, err error) {
	ns, given, err = c.flags.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return "", false, fmt.Errorf("reading the namespace of the kubeconfig context: %w", err)
	}
	return ns, given, nil
}

// RestConfig is the client configuration, with the guard's user agent and,
// unless --request-timeout says otherwise, a 30-second bound on each request.
func (c *Cluster) RestConfig() (*rest.Config, error) {
	cfg, err := c.flags.ToRESTConfig()
	if err != nil {
		return nil, fmt.Errorf("loading the cluster configuration: %w", err)
	}
	cfg.UserAgent = "deployguard/" + Version
	if cfg.Timeout == 0 {
		cfg.Timeout = 30 * time.Second
	}
	// No client-side rate limit (client-go's default is 5 requests/s):
	// uninstall patches every guarded Deployment and must finish within its
	// timeout; the API server's priority and fairness bounds the guard's
	// commands as it bounds kubectl.
	if cfg.QPS == 0 {
		cfg.QPS = -1
	}
	return cfg, nil
}

// Do runs a verb's work with a client of the cluster and a context bounded
// by timeout. An error is told on stderr in the verb's name ("deployguard
// status: …") and ends the verb with ExitFailed.
func (c *Cluster) Do(cmd *cobra.Command, timeout time.Duration, work func(context.Context, client.Client) error) error {
	cl, err := c.Client()
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		err = work(ctx, cl)
	}
	if err != nil {
		fmt.Fprintf(cmd.ErrOrStderr(), "%s: %v\n", cmd.CommandPath(), err)
		return Exit(ExitFailed)
	}
	return nil
}

// Client is a client of the cluster that knows the guard's own kinds.
func (c *Cluster) Client() (client.Client, error) {
	cfg, err := c.RestConfig()
	if err != nil {
		return nil, err
	}
	return newClient(cfg)
}

func newClient(cfg *rest.Config) (client.Client, error) {
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(exception.AddToScheme(scheme))
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("creating a client: %w", err)
	}
	return c, nil
}
