// Command certmanager runs cert-manager's own controllers, built from its Go
// module, against a local control plane, so that deployguard's cert-manager
// install path is tested against the real thing: the certificates controllers
// (trigger, key manager, request manager, issuing, readiness, revision
// manager), the CertificateRequest approver, the self-signed and CA issuers,
// and cainjector's webhook-configuration injectors.
//
// It is not cert-manager's binary: cert-manager's cmd/ packages are separate
// modules with their own flags and configuration files, and its webhook (which
// validates and defaults cert-manager's resources) is not run; the CRDs' own
// schemas validate the objects instead. Leader election is off: one process.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	cmapi "github.com/cert-manager/cert-manager/pkg/apis/certmanager/v1"
	controllerpkg "github.com/cert-manager/cert-manager/pkg/controller"
	"github.com/cert-manager/cert-manager/pkg/controller/cainjector"
	"github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/approver"
	crca "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/ca"
	crselfsigned "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/selfsigned"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/issuing"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/keymanager"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/readiness"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/requestmanager"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/revisionmanager"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/trigger"
	"github.com/cert-manager/cert-manager/pkg/controller/issuers"
	// The issuer kinds the issuers controller can set up (they register
	// themselves with cert-manager's issuer factory).
	_ "github.com/cert-manager/cert-manager/pkg/issuer/ca"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/selfsigned"
)

// controllers are the names, in cert-manager's controller registry, of the
// controllers an Issuer → Certificate → Secret chain with self-signed and CA
// issuers needs; the packages above register them when imported.
var controllers = []string{
	trigger.ControllerName,
	keymanager.ControllerName,
	requestmanager.ControllerName,
	issuing.ControllerName,
	readiness.ControllerName,
	revisionmanager.ControllerName,
	approver.ControllerName,
	crselfsigned.CRControllerName,
	crca.CRControllerName,
	issuers.ControllerName,
}

func main() {
	// Not flag.CommandLine: controller-runtime registers --kubeconfig there.
	fs := flag.NewFlagSet("certmanager", flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig of the cluster (admin)")
	workers := fs.Int("workers", 2, "workers per controller")
	klog.InitFlags(fs)
	_ = fs.Parse(os.Args[1:])
	ctrl.SetLogger(klog.NewKlogr())

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *kubeconfig, *workers); err != nil {
		fmt.Fprintln(os.Stderr, "certmanager:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, kubeconfig string, workers int) error {
	g, ctx := errgroup.WithContext(ctx)
	if err := startControllers(ctx, g, kubeconfig, workers); err != nil {
		return err
	}
	if err := startCAInjector(ctx, g, kubeconfig); err != nil {
		return err
	}
	klog.Info("cert-manager controllers and cainjector started", "controllers", controllers)
	return g.Wait()
}

// startControllers builds the controllers from cert-manager's registry on one
// shared ContextFactory, then starts the shared informers they registered.
func startControllers(ctx context.Context, g *errgroup.Group, kubeconfig string, workers int) error {
	factory, err := controllerpkg.NewContextFactory(ctx, controllerpkg.ContextOptions{
		Kubeconfig:         kubeconfig,
		KubernetesAPIQPS:   50,
		KubernetesAPIBurst: 100,
		IssuerOptions:      controllerpkg.IssuerOptions{ClusterResourceNamespace: "cert-manager"},
		CertificateOptions: controllerpkg.CertificateOptions{
			// A failed issuance is retried after seconds, not cert-manager's
			// default hour: a test cannot wait that long.
			CertificateRequestMinimumBackoffDuration: 2 * time.Second,
			CertificateRequestMaximumBackoffDuration: 30 * time.Second,
		},
	})
	if err != nil {
		return fmt.Errorf("building cert-manager's controller context: %w", err)
	}
	known := controllerpkg.Known()
	for _, name := range controllers {
		newController, ok := known[name]
		if !ok {
			names := make([]string, 0, len(known))
			for n := range known {
				names = append(names, n)
			}
			sort.Strings(names)
			return fmt.Errorf("controller %q is not registered (known: %v)", name, names)
		}
		c, err := newController(factory)
		if err != nil {
			return fmt.Errorf("creating controller %s: %w", name, err)
		}
		g.Go(func() error { return c.Run(workers, ctx) })
	}
	// Every Context built by the factory shares its informer factories: start
	// them once all controllers have registered their informers.
	shared, err := factory.Build()
	if err != nil {
		return err
	}
	shared.KubeSharedInformerFactory.Start(ctx.Done())
	shared.SharedInformerFactory.Start(ctx.Done())
	return nil
}

// startCAInjector runs cainjector's reconcilers for Mutating and Validating
// webhook configurations on a controller-runtime manager, as cainjector does.
func startCAInjector(ctx context.Context, g *errgroup.Group, kubeconfig string) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	cfg.UserAgent = "cert-manager-cainjector"
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(cmapi.AddToScheme(scheme))
	utilruntime.Must(admissionregistrationv1.AddToScheme(scheme))
	utilruntime.Must(apiextensionsv1.AddToScheme(scheme))
	utilruntime.Must(apiregistrationv1.AddToScheme(scheme))
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		// cainjector watches only Secrets' metadata and reads their data
		// directly, as cert-manager's cainjector is configured.
		Client: client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{&corev1.Secret{}}}},
	})
	if err != nil {
		return fmt.Errorf("creating cainjector's manager: %w", err)
	}
	err = cainjector.RegisterAllInjectors(ctx, mgr, cainjector.SetupOptions{
		EnableCertificatesDataSource: true,
		EnabledReconcilersFor: map[string]bool{
			cainjector.MutatingWebhookConfigurationName:   true,
			cainjector.ValidatingWebhookConfigurationName: true,
		},
	})
	if err != nil {
		return fmt.Errorf("registering cainjector's injectors: %w", err)
	}
	g.Go(func() error { return mgr.Start(ctx) })
	return nil
}
