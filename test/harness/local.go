package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// LocalOptions describe a local cluster with the guard running against it.
type LocalOptions struct {
	Tools   string
	Guard   string // the deployguard binary
	Name    string // cluster name
	WorkDir string
	Nodes   int
	// GuardConfig is the guard's config file content; empty for defaults.
	GuardConfig string
	// GuardArgs are extra `deployguard serve` flags.
	GuardArgs []string
	// Log receives the cluster's and the guard's output.
	Log io.Writer
	// ClusterArgs are extra `kwokctl create cluster` flags.
	ClusterArgs []string
	// WebhookManifests, when set, replaces config/webhook/manifests.yaml.
	WebhookManifests string
	// CRDs are kustomize folders of CRDs applied, and waited for, before the
	// guard starts (config/crd/policyreport for the audit's reports).
	CRDs []string
	// WithoutNativePolicies leaves config/native out: the guard's webhook
	// then evaluates their rules itself.
	WithoutNativePolicies bool
	// ClientAuth runs kube-apiserver with an admission configuration that
	// presents a client certificate to webhooks, and the guard requiring it
	// (--client-ca-file): no other client reaches its admission code.
	ClientAuth bool
}

// Local is a running local cluster with the guard serving its webhooks.
type Local struct {
	Opts            LocalOptions
	Cluster         *Cluster
	Guard           *Guard
	Client          client.Client // admin
	Scheme          *runtime.Scheme
	GuardKubeconfig string
}

// StartLocal brings up the cluster, gives the guard its service account, installs
// the deployed webhook configurations pointing at the guard on loopback, starts
// the guard (which issues its own certificate and injects its CA), and returns
// once the API server calls the guard successfully.
func StartLocal(ctx context.Context, o LocalOptions) (l *Local, err error) {
	if o.Nodes == 0 {
		o.Nodes = 2
	}
	l = &Local{Opts: o, Scheme: runtime.NewScheme()}
	utilruntime.Must(clientgoscheme.AddToScheme(l.Scheme))
	defer func() {
		if err != nil {
			l.Stop()
		}
	}()
	start := time.Now()
	if o.ClientAuth {
		a, err := writeClientAuth(filepath.Join(o.WorkDir, "client-auth"))
		if err != nil {
			return l, fmt.Errorf("writing the webhook client certificate: %w", err)
		}
		o.ClusterArgs = append(slices.Clone(o.ClusterArgs), "--config", a.kwokctlConfig)
		o.GuardArgs = append(slices.Clone(o.GuardArgs), a.guardArgs()...)
		l.Opts = o
	}
	if l.Cluster, err = StartClusterWith(ctx, o.Tools, o.Name, filepath.Join(o.WorkDir, "cluster"), o.Nodes, o.Log, o.ClusterArgs...); err != nil {
		return l, err
	}
	cfg, err := l.Cluster.RESTConfig()
	if err != nil {
		return l, err
	}
	if l.Client, err = client.New(cfg, client.Options{Scheme: l.Scheme}); err != nil {
		return l, err
	}
	l.GuardKubeconfig = filepath.Join(o.WorkDir, "guard.kubeconfig")
	if err = l.Cluster.GuardKubeconfig(ctx, l.Client, l.GuardKubeconfig); err != nil {
		return l, fmt.Errorf("giving the guard its service account: %w", err)
	}
	for _, dir := range o.CRDs {
		if _, err = l.Cluster.Kubectl(ctx, l.Cluster.Kubeconfig, "apply", "-k", dir); err != nil {
			return l, fmt.Errorf("applying the CRDs of %s: %w", dir, err)
		}
		if _, err = l.Cluster.Kubectl(ctx, l.Cluster.Kubeconfig, "wait", "--for=condition=Established", "crd", "-l", "app.kubernetes.io/part-of=deployguard", "--timeout=1m"); err != nil {
			return l, fmt.Errorf("waiting for the CRDs of %s: %w", dir, err)
		}
	}
	port, err := FreePort()
	if err != nil {
		return l, err
	}
	manifests := o.WebhookManifests
	if manifests == "" {
		manifests = WebhookManifests()
	}
	if err = InstallWebhooksFrom(ctx, l.Client, manifests, fmt.Sprintf("https://127.0.0.1:%d", port), nil); err != nil {
		return l, err
	}
	if !o.WithoutNativePolicies {
		// As deployed: kustomize's params, which the guard rewrites from its
		// config file when it starts.
		if _, err = l.Cluster.Kubectl(ctx, l.Cluster.Kubeconfig, "apply", "-k", NativeDir()); err != nil {
			return l, fmt.Errorf("applying config/native: %w", err)
		}
	}
	if err = l.StartGuard(ctx, port); err != nil {
		return l, err
	}
	if !o.WithoutNativePolicies {
		if err = WaitForNativePolicies(ctx, l.Client, "default", time.Minute); err != nil {
			return l, err
		}
	}
	fmt.Fprintf(logOr(o.Log), "local cluster %q with the guard ready in %s\n", o.Name, time.Since(start).Round(100*time.Millisecond))
	return l, nil
}

// StartGuard starts (or restarts) the guard on port and waits until the API
// server reaches it.
func (l *Local) StartGuard(ctx context.Context, port int) error {
	g, err := StartGuard(GuardOptions{
		Binary: l.Opts.Guard, Kubeconfig: l.GuardKubeconfig, WorkDir: filepath.Join(l.Opts.WorkDir, "guard"),
		Config: l.Opts.GuardConfig, WebhookPort: port, ExtraArgs: l.Opts.GuardArgs, Output: l.Opts.Log,
		Env: DeployedRuntimeEnv(),
	})
	if err != nil {
		return err
	}
	l.Guard = g
	if err := g.WaitReady(ctx, time.Minute); err != nil {
		return err
	}
	return WaitForWebhooks(ctx, l.Client, "default", time.Minute)
}

// RestartGuard kills the guard at once, as a crash would, and starts a new one
// on the same port.
func (l *Local) RestartGuard(ctx context.Context) error {
	if l.Guard == nil {
		return errors.New("no guard to restart")
	}
	port := l.Guard.Opts.WebhookPort
	l.Guard.Kill()
	return l.StartGuard(ctx, port)
}

// Stop ends the guard and deletes the cluster.
func (l *Local) Stop() {
	if l.Guard != nil {
		if err := l.Guard.Stop(); err != nil {
			fmt.Fprintf(logOr(l.Opts.Log), "stopping the guard: %v\n", err)
		}
	}
	if l.Cluster != nil {
		if err := l.Cluster.Stop(); err != nil {
			fmt.Fprintf(logOr(l.Opts.Log), "deleting the cluster: %v\n", err)
		}
	}
}

func logOr(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}
