package serve

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	cmapi "github.com/cert-manager/cert-manager/pkg/apis/certmanager/v1"

	"github.com/deployguard/deployguard/certs"
	"github.com/deployguard/deployguard/cmd/deployguard/cli"
	"github.com/deployguard/deployguard/cmd/deployguard/config"
	"github.com/deployguard/deployguard/cmd/deployguard/health"
	"github.com/deployguard/deployguard/cmd/deployguard/leader"
	"github.com/deployguard/deployguard/policy"
	"github.com/deployguard/deployguard/reconciler"
	"github.com/deployguard/deployguard/reconciler/analysis/checks"
	"github.com/deployguard/deployguard/reconciler/analysis/prom"
	"github.com/deployguard/deployguard/reconciler/vocab"
	guardwebhook "github.com/deployguard/deployguard/webhook"
	"github.com/deployguard/deployguard/webhook/checkadmission"
	"github.com/deployguard/deployguard/webhook/exception"
	"github.com/deployguard/deployguard/webhook/native/floor"
	"github.com/deployguard/deployguard/webhook/review"
	"github.com/deployguard/deployguard/webhook/routing"
)

// serveFlags are the process-level settings; the guard's policy knobs live in
// the config file.
type serveFlags struct {
	configFile     string
	kubeconfig     string
	kubeAPIQPS     float64
	kubeAPIBurst   int
	namespace      string
	serviceAccount string
	policyDir      string

	webhookHost string
	webhookPort int
	http2       bool
	certDir     string
	clientCA    string
	clientNames string

	certMode       string
	certSecret     string
	dnsNames       string
	ipAddresses    string
	ips            []net.IP
	mutatingName   string
	validatingName string

	caValidity        time.Duration
	certValidity      time.Duration
	certSyncPeriod    time.Duration
	certCheckPeriod   time.Duration
	nativeCheckPeriod time.Duration

	metricsAddr    string
	metricsSecure  bool
	probeAddr      string
	pprofAddr      string
	leaderElect    bool
	leaderElection string
	shutdownDelay  time.Duration

	configSnapshots string
	snapshots       reconciler.SnapshotOptions
}

// NewCommand is `deployguard serve`. Its flags are Go flags, as
// controller-runtime's logging options (zap) bind them, given to cobra
// through pflag.
func NewCommand(s cli.Streams) *cobra.Command {
	fs := flag.NewFlagSet("deployguard serve", flag.ContinueOnError)
	f, zo := bindServeFlags(fs)
	cmd := cli.NewCommand(s, &cobra.Command{
		Use:   "serve [flags]",
		Short: "run the admission webhooks and the rollout reconciler",
		Long: `Runs the guard in a cluster: the mutating and validating admission webhooks
for apps/v1 Deployments, with the platform team's Rego policies, and the
rollout reconciler (known-good revisions, fail-fast, automatic rollback at
the progress deadline, finalizer-ordered cleanup). The chart and
config/default run it; the flags below are what they set.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := f.complete(args); err != nil {
				fmt.Fprintf(s.ErrOut, "deployguard serve: %v\n", err)
				return cli.Exit(cli.ExitUsage)
			}
			return cli.Exit(serve(f, zo, s.ErrOut))
		},
	})
	cmd.Flags().AddGoFlagSet(fs)
	cli.CompleteWords(cmd, "cert-mode", "files", "self-managed")
	return cmd
}

// bindServeFlags defines serve's flags on fs.
func bindServeFlags(fs *flag.FlagSet) (*serveFlags, *zap.Options) {
	f := &serveFlags{}
	fs.StringVar(&f.configFile, "config", "", "path of the guard's config file (GuardConfig YAML); defaults apply when empty")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "path of a kubeconfig; in-cluster configuration or $KUBECONFIG when empty")
	fs.Float64Var(&f.kubeAPIQPS, "kube-api-qps", 50, "requests per second each of the guard's API server clients may send (client-side rate limit; applied with or without --kubeconfig). Above client-go's 5 and controller-runtime's 20, which throttle the reconciler silently at thousands of Deployments; the API server's priority and fairness protects it from a busy guard")
	fs.IntVar(&f.kubeAPIBurst, "kube-api-burst", 100, "requests each of the guard's API server clients may send at once above --kube-api-qps")
	fs.StringVar(&f.namespace, "namespace", envOr("POD_NAMESPACE", "deployguard-system"), "the guard's own namespace (policy ConfigMaps, certificate Secret, leader election)")
	fs.StringVar(&f.serviceAccount, "service-account", envOr("SERVICE_ACCOUNT", "deployguard"), "the guard's service account name: only it may remove the guard's finalizers")
	fs.StringVar(&f.policyDir, "policy-dir", "", "a directory of Rego policies (*.rego) to load besides the built-in library")
	fs.StringVar(&f.webhookHost, "webhook-host", "", "address the webhook server listens on (all when empty)")
	fs.IntVar(&f.webhookPort, "webhook-port", 9443, "port of the webhook server")
	fs.BoolVar(&f.http2, "enable-http2", false, "serve webhooks over HTTP/2 too (off: the HTTP/2 Rapid Reset advisories)")
	fs.StringVar(&f.certDir, "cert-dir", "/tmp/k8s-webhook-server/serving-certs", "directory holding tls.crt and tls.key; reloaded when they change")
	fs.StringVar(&f.clientCA, "client-ca-file", "", "PEM CA bundle: when set, the webhooks answer only clients presenting a certificate it verifies (the API server's, from its admission configuration's kubeconfig); others get 403 before any admission work")
	fs.StringVar(&f.clientNames, "client-names", "", "with --client-ca-file: comma-separated names (subject common name or DNS name) one of which the client certificate must carry; any verified certificate when empty")
	fs.StringVar(&f.certMode, "cert-mode", "files", "where the serving certificate comes from: files (mounted, e.g. by cert-manager) or self-managed (the guard issues its own CA and certificate)")
	fs.StringVar(&f.certSecret, "cert-secret", "deployguard-webhook-tls", "self-managed: the Secret in --namespace that holds the CA and serving certificate")
	fs.StringVar(&f.dnsNames, "cert-dns-names", "deployguard-webhook.deployguard-system.svc", "self-managed: comma-separated DNS names of the serving certificate")
	fs.StringVar(&f.ipAddresses, "cert-ip-addresses", "", "self-managed: comma-separated IP addresses of the serving certificate")
	fs.StringVar(&f.mutatingName, "mutating-webhook-configuration", "deployguard-mutating", "the guard's MutatingWebhookConfiguration: /readyz checks its caBundle trusts the served certificate; self-managed: the CA bundle is injected into it")
	fs.StringVar(&f.validatingName, "validating-webhook-configuration", "deployguard-validating", "the guard's ValidatingWebhookConfiguration: /readyz checks its caBundle trusts the served certificate; self-managed: the CA bundle is injected into it")
	fs.DurationVar(&f.caValidity, "self-managed-ca-validity", 365*24*time.Hour, "self-managed: validity of the CA (renewed at two thirds); shortened only by tests")
	fs.DurationVar(&f.certValidity, "self-managed-cert-validity", 30*24*time.Hour, "self-managed: validity of the serving certificate (renewed at two thirds); shortened only by tests")
	fs.DurationVar(&f.certSyncPeriod, "self-managed-sync-period", time.Minute, "self-managed: how often every replica checks the certificate Secret, its files and the injected CA bundle")
	fs.DurationVar(&f.nativeCheckPeriod, "native-check-period", 30*time.Second, "how often every replica checks that the API server still enforces the native policies (config/native) as it would; until a check finds them gone, nobody refuses what they refuse")
	fs.DurationVar(&f.certCheckPeriod, "cert-check-period", time.Minute, "how often the served certificate's expiry is read (metric deployguard_serving_certificate_expiry_seconds, warning event)")
	fs.StringVar(&f.metricsAddr, "metrics-bind-address", ":8080", "address of the metrics endpoint (0 to disable)")
	fs.BoolVar(&f.metricsSecure, "metrics-secure", true, "serve /metrics over HTTPS (the --cert-dir certificate) to clients the API server authenticates (TokenReview) and authorizes for GET /metrics (SubjectAccessReview; config/rbac/metrics_reader_role.yaml); false serves it in plain HTTP to anyone who reaches the port")
	fs.StringVar(&f.probeAddr, "health-probe-bind-address", ":8081", "address of /healthz and /readyz")
	fs.StringVar(&f.pprofAddr, "pprof-bind-address", "", "address of Go's /debug/pprof profiles, for finding where the guard's CPU and memory go (off when empty)")
	fs.BoolVar(&f.leaderElect, "leader-elect", true, "elect a leader for the reconciler, so that several replicas can serve the webhooks")
	fs.StringVar(&f.leaderElection, "leader-election-id", "deployguard.deployguard.io", "name of the leader election lease")
	fs.DurationVar(&f.shutdownDelay, "shutdown-delay", 5*time.Second, "on SIGTERM, how long /readyz fails while the webhooks still serve, before in-flight requests are drained and the process exits: time for the Service's endpoints to drop the replica")
	fs.StringVar(&f.configSnapshots, "config-snapshots", "configmaps", "which config a known-good revision's snapshots keep, for a rollback to bring back: configmaps, configmaps,secrets, or none. Secrets need the RBAC of config/rbac/snapshot_secrets_role.yaml (the chart's configSnapshots.secrets)")
	zo := &zap.Options{}
	zo.BindFlags(fs)
	return f, zo
}

// complete checks the flags together, once parsed.
func (f *serveFlags) complete(args []string) error {
	if len(args) > 0 {
		return fmt.Errorf("unexpected arguments: %s", strings.Join(args, " "))
	}
	if f.certMode != "files" && f.certMode != "self-managed" {
		return fmt.Errorf("--cert-mode must be files or self-managed, not %q", f.certMode)
	}
	if f.kubeAPIQPS <= 0 || f.kubeAPIBurst <= 0 {
		return fmt.Errorf("--kube-api-qps and --kube-api-burst must be positive, not %g and %d", f.kubeAPIQPS, f.kubeAPIBurst)
	}
	if f.nativeCheckPeriod <= 0 {
		return fmt.Errorf("--native-check-period must be positive, not %s", f.nativeCheckPeriod)
	}
	f.snapshots = reconciler.DefaultSnapshotOptions()
	f.snapshots.ConfigMaps = false
	for _, k := range vocab.SplitList(f.configSnapshots) {
		switch k {
		case "configmaps":
			f.snapshots.ConfigMaps = true
		case "secrets":
			f.snapshots.Secrets = true
		case "none":
		default:
			return fmt.Errorf("--config-snapshots: %q is none of configmaps, secrets, none", k)
		}
	}
	for _, x := range vocab.SplitList(f.ipAddresses) {
		ip := net.ParseIP(x)
		if ip == nil {
			return fmt.Errorf("--cert-ip-addresses: %q is not an IP address", x)
		}
		f.ips = append(f.ips, ip)
	}
	return nil
}

func serve(f *serveFlags, zo *zap.Options, stderr io.Writer) int {
	// The config file is read before anything touches the cluster: a bad file
	// must stop the process at once, with the field and the line.
	cfg, err := config.Load(f.configFile)
	if err != nil {
		fmt.Fprintf(stderr, "deployguard serve: %v\n", err)
		return 1
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(zo), zap.WriteTo(stderr)))
	log := ctrl.Log.WithName("setup")
	_, gomemlimitSet := os.LookupEnv("GOMEMLIMIT")
	switch limit, ok, err := softMemoryLimit(os.Getenv(memoryLimitEnv), gomemlimitSet); {
	case err != nil:
		log.Error(err, "Memory limit not applied")
	case ok:
		debug.SetMemoryLimit(limit)
		log.Info("Soft memory limit set to 90% of the container's", "bytes", limit)
	}

	stop := &gracefulStop{}
	ctx := stop.after(ctrl.SetupSignalHandler(), f.shutdownDelay, log)
	if err := runServer(ctx, f, cfg, stop); err != nil {
		log.Error(err, "deployguard stopped")
		return 1
	}
	return 0
}

// runServer wires the guard in named steps, then runs it until ctx ends.
func runServer(ctx context.Context, f *serveFlags, cfg config.Config, stop *gracefulStop) error {
	restCfg, err := restConfig(f)
	if err != nil {
		return err
	}
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(cmapi.AddToScheme(scheme)) // read on the cert-manager path, never cached
	utilruntime.Must(exception.AddToScheme(scheme))
	utilruntime.Must(checks.AddToScheme(scheme))
	// The cache is told where PolicyExceptions live only when their API is
	// served: naming a kind the API server does not know fails the manager.
	exceptionsNS := ""
	if exception.Served(restCfg) {
		exceptionsNS = cfg.ExceptionsNamespace(f.namespace)
	}
	mgr, err := newManager(f, restCfg, scheme, exceptionsNS)
	if err != nil {
		return err
	}
	pr := &health.Probes{}
	opts := cfg.WebhookOptions(fmt.Sprintf("system:serviceaccount:%s:%s", f.namespace, f.serviceAccount))
	adm, err := setupWebhooks(ctx, mgr, pr, f, cfg, opts, stop)
	if err != nil {
		return err
	}
	terms, ignored, err := setupReconcilers(ctx, mgr, f, cfg, restCfg, scheme, review.RollbackJudge{Reviewer: adm.reviewer, Loaded: adm.policiesLoaded})
	if err != nil {
		return err
	}
	eng, budgets, exceptions := adm.engine, adm.budgets, adm.exceptions
	if err := setupExceptionExpiry(terms, cfg, exceptions); err != nil {
		return err
	}
	// The routing of the guard's own webhook configurations, by what it
	// enforces: one replica writes, anew in each term.
	terms.Setup = append(terms.Setup, func(_ context.Context, lm ctrl.Manager) error {
		rw := uncached(lm)
		if err := lm.Add(&routing.Validating{Client: rw, Options: routing.ValidatingOptions{
			Name: f.validatingName, Review: opts, Policies: eng, Loaded: adm.policiesLoaded,
		}}); err != nil {
			return err
		}
		return lm.Add(&routing.Mutating{Client: rw, Options: routing.MutatingOptions{
			Name: f.mutatingName, Namespace: f.namespace, Review: opts, ChangesEvery: cfg.ChangesEveryDeployment(),
			SelectorRepairInstalled: floor.SelectorRepairInstalled,
		}})
	})
	if cfg.Audit.Enabled {
		if err := setupAudit(mgr, pr, terms, cfg, opts, eng, budgets, exceptions, ignored); err != nil {
			return err
		}
	}
	if err := mgr.Add(terms); err != nil {
		return err
	}
	if err := setupCerts(ctx, mgr, pr, f, restCfg, scheme); err != nil {
		return err
	}
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		if cfg.ChangesEveryDeployment() && mgr.GetCache().WaitForCacheSync(ctx) {
			routing.CheckMutatingScope(ctx, mgr.GetClient(), f.mutatingName, ctrl.Log.WithName("setup"))
		}
		return nil
	})); err != nil {
		return err
	}
	if err := setupProbes(mgr, pr, f, stop); err != nil {
		return err
	}
	ctrl.Log.WithName("setup").Info("starting deployguard", "version", cli.Version, "namespace", f.namespace, "certMode", f.certMode,
		"webhookPort", f.webhookPort, "leaderElection", f.leaderElect, "kubeAPIQPS", f.kubeAPIQPS, "kubeAPIBurst", f.kubeAPIBurst)
	return mgr.Start(ctx)
}

// restConfig is the configuration every client of the guard is built from,
// with the client-side rate limit of --kube-api-qps and --kube-api-burst:
// loaded as it is, a kubeconfig would leave client-go's 5 requests a second
// and the in-cluster configuration controller-runtime's 20.
func restConfig(f *serveFlags) (*rest.Config, error) {
	c, err := cli.RestConfig(f.kubeconfig)
	if err != nil {
		return nil, err
	}
	c.QPS, c.Burst = float32(f.kubeAPIQPS), f.kubeAPIBurst
	return c, nil
}

// newManager is the manager every part runs in: the webhook server, the
// metrics, and one cache of the stripped Deployments and ReplicaSets.
func newManager(f *serveFlags, restCfg *rest.Config, scheme *runtime.Scheme, exceptions string) (ctrl.Manager, error) {
	tlsOpts := []func(*tls.Config){func(c *tls.Config) {
		c.MinVersion = tls.VersionTLS12
		if !f.http2 {
			c.NextProtos = []string{"http/1.1"}
		}
	}}
	if f.clientCA != "" {
		pem, err := os.ReadFile(f.clientCA)
		if err != nil {
			return nil, fmt.Errorf("reading --client-ca-file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--client-ca-file %s holds no PEM certificate", f.clientCA)
		}
		// Verified if given; guardwebhook.RequireClient refuses the
		// requests of clients that gave none.
		tlsOpts = append(tlsOpts, func(c *tls.Config) {
			c.ClientCAs, c.ClientAuth = pool, tls.VerifyClientCertIfGiven
		})
	}
	webhooks := ctrlwebhook.NewServer(ctrlwebhook.Options{
		Host: f.webhookHost, Port: f.webhookPort, CertDir: f.certDir, TLSOpts: tlsOpts,
	})
	if f.clientCA != "" {
		// On the server, not on each handler: every path registered on it,
		// the PolicyException webhook's and the not-found answer included,
		// is behind the check.
		webhooks = guardwebhook.RequireClientOn(webhooks, vocab.SplitList(f.clientNames))
	}
	mgr, err := ctrl.NewManager(restCfg, ctrl.Options{
		Scheme:  scheme,
		Metrics: metricsOptions(f),
		// Probes are served by health.Probes, which says why a check fails.
		HealthProbeBindAddress: "0",
		PprofBindAddress:       f.pprofAddr,
		// Leader election is per term, in leader.Terms: losing the lease must
		// not stop the webhooks.
		LeaderElection: false,
		Cache:          cacheOptions(f.namespace, exceptions),
		WebhookServer:  webhooks,
	})
	if err != nil {
		return nil, fmt.Errorf("creating the manager: %w", err)
	}
	return mgr, nil
}

// metricsOptions serve /metrics as kubebuilder scaffolds it: over TLS, to
// callers the API server authenticates and authorizes for GET /metrics
// (metricsAuthFilter: controller-runtime's filter, but 401 for a bad token).
// The certificate is the webhook's (--cert-dir, reloaded when it changes), so
// that Prometheus verifies it with the CA it can already read
// (deployguard-webhook-tls's ca.crt) instead of skipping verification of a
// self-signed one while it sends its token.
func metricsOptions(f *serveFlags) metricsserver.Options {
	if !f.metricsSecure {
		return metricsserver.Options{BindAddress: f.metricsAddr}
	}
	return metricsserver.Options{
		BindAddress:    f.metricsAddr,
		SecureServing:  true,
		FilterProvider: metricsAuthFilter,
		CertDir:        f.certDir,
		TLSOpts: []func(*tls.Config){func(c *tls.Config) {
			c.MinVersion = tls.VersionTLS12
			// HTTP/2 off, as on the webhook port (the Rapid Reset advisories).
			c.NextProtos = []string{"http/1.1"}
		}},
	}
}

// admissionParts are what the webhooks built that other parts share.
type admissionParts struct {
	// reviewer is the validating webhook's: the reconciler judges what a
	// rollback would restore with it.
	reviewer       *review.Reviewer
	engine         *policy.Engine
	policiesLoaded func() bool
	budgets        *review.BudgetIndex
	exceptions     *exception.Index
}

// setupWebhooks wires admission: the policies (with their hot reload), the
// overlap and budget indexes (the budget index holds the overlap one) and
// their readiness, and both webhooks, registered through the
// graceful stop's connection closing.
func setupWebhooks(ctx context.Context, mgr ctrl.Manager, pr *health.Probes, f *serveFlags, cfg config.Config, opts *review.Options, stop *gracefulStop) (*admissionParts, error) {
	wm, err := guardwebhook.NewMetrics(metrics.Registry)
	if err != nil {
		return nil, fmt.Errorf("registering admission metrics: %w", err)
	}
	eng, loaded, err := setupPolicies(ctx, mgr, pr, metrics.Registry, cfg, f.policyDir, f.namespace)
	if err != nil {
		return nil, err
	}
	exceptions, err := setupExceptions(ctx, mgr, cfg, f.namespace, eng, stop)
	if err != nil {
		return nil, err
	}
	checkadmission.Register(mgr.GetWebhookServer(), func(h http.Handler) http.Handler { return stop.CloseConnections(guardwebhook.WithBodyTimeout(0, h)) })
	// The overlap and drain checks' indexes, fed by the Deployment informer
	// the reconciler uses too: one watch, and no list of the namespace per
	// request.
	overlaps, budgets, err := review.Indexes(ctx, mgr.GetCache())
	if err != nil {
		return nil, err
	}
	if err := guardwebhook.RegisterUnjudgedBudgets(metrics.Registry, budgets); err != nil {
		return nil, err
	}
	if err := pr.AddReadyzCheck("deployments-indexed", func(*http.Request) error {
		if !overlaps.Synced() || !budgets.Synced() {
			return review.ErrIndexNotSynced
		}
		return nil
	}); err != nil {
		return nil, err
	}
	// The native floor: its params, and who evaluates its refusals.
	nf, err := floor.Setup(ctx, mgr.GetAPIReader(), mgr.GetClient(), floor.Options{
		Namespace: f.namespace, Review: opts, Every: f.nativeCheckPeriod, Metrics: metrics.Registry,
	})
	if err != nil {
		return nil, err
	}
	if nf != nil {
		if err := mgr.Add(nf); err != nil {
			return nil, err
		}
	}
	reviewer := &review.Reviewer{
		Options:         opts,
		Overlaps:        overlaps,
		Budgets:         budgets,
		Policies:        review.RegoPolicies{Engine: eng},
		NamespaceLabels: guardwebhook.CacheNamespaceLabels(mgr.GetClient()),
	}
	if exceptions != nil {
		reviewer.Exceptions = exceptions
	}
	// Every replica serves the verdicts, leader or not.
	hooks := &guardwebhook.Hooks{Reviewer: reviewer, ServeVerdicts: true}
	// Registered through CloseConnections: once stopping, every answer
	// closes its connection, so the API server never writes a request on a
	// kept-alive connection the draining server is about to close.
	// (The client certificate check, when configured, is the server's:
	// newManager.)
	hooks.SetupWithManager(mgr, wm, stop.CloseConnections)
	// Any other path is not found, once its body has come or its time is
	// up: Go's server reads a refused request's body on, to reuse the
	// connection, and would wait for a stalled one for ever.
	mgr.GetWebhookServer().Register("/", guardwebhook.WithBodyTimeout(0, http.NotFoundHandler()))
	return &admissionParts{reviewer: reviewer, engine: eng, policiesLoaded: loaded, budgets: budgets, exceptions: exceptions}, nil
}

// setupReconcilers wires the rollout reconciler into the leader's terms: it
// runs only on the replica that holds the lease, over the process's cache. It
// returns the terms and the namespaces the reconciler ignores.
func setupReconcilers(ctx context.Context, mgr ctrl.Manager, f *serveFlags, cfg config.Config, restCfg *rest.Config, scheme *runtime.Scheme, judge reconciler.RollbackJudge) (*leader.Terms, []string, error) {
	rm, err := reconciler.NewMetrics(metrics.Registry)
	if err != nil {
		return nil, nil, fmt.Errorf("registering reconciler metrics: %w", err)
	}
	// Read from the process's cache on every replica, leader or not.
	if err := metrics.Registry.Register(&reconciler.ScaleUpCollector{Reader: mgr.GetClient()}); err != nil {
		return nil, nil, fmt.Errorf("registering the scale-up metric: %w", err)
	}
	ropts := reconciler.DefaultOptions()
	ropts.AutoRollback = cfg.Rollback.AutoRollback
	ropts.IgnoredNamespaces = []string{"kube-system", "kube-node-lease", "kube-public", f.namespace}
	ropts.CleanupFinalizers = cfg.CleanupFinalizers()
	ropts.FailFast = cfg.FailFastOptions()
	ropts.DrainTimeout = cfg.Cleanup.DrainTimeout.Duration
	ropts.RecordRetention = cfg.Cleanup.RecordRetention.Duration
	ropts.RecordBudget = cfg.RecordBudget()
	ropts.RecordNamespace = f.namespace
	ropts.Snapshots = f.snapshots
	if err := reconciler.IndexFields(ctx, mgr.GetFieldIndexer()); err != nil {
		return nil, nil, err
	}
	metricChecks, err := setupMetricChecks(cfg, restCfg)
	if err != nil {
		return nil, nil, err
	}
	terms := &leader.Terms{
		RestConfig: restCfg, Scheme: scheme, Cache: mgr.GetCache(),
		Elect: f.leaderElect, ID: f.leaderElection, Namespace: f.namespace, Pause: time.Second,
	}
	terms.Setup = append(terms.Setup, func(ctx context.Context, lm ctrl.Manager) error {
		ropts := ropts
		// Uncached: one read (and a create the first time) per term.
		direct, err := client.New(restCfg, client.Options{Scheme: scheme})
		if err != nil {
			return fmt.Errorf("building a client: %w", err)
		}
		since, err := reconciler.LedgerSince(ctx, direct, f.namespace, time.Now())
		if err != nil {
			return err
		}
		ropts.LegacyCutoff = since
		rollouts := &reconciler.DeploymentReconciler{
			Client:       lm.GetClient(),
			Recorder:     lm.GetEventRecorder("deployguard"),
			Metrics:      rm,
			Installed:    webhookInstalled(lm.GetClient(), f.mutatingName),
			Judge:        judge,
			Checks:       metricChecks,
			Options:      ropts,
			CacheIndexed: true,
		}
		if err := rollouts.SetupWithManager(ctx, lm); err != nil {
			return fmt.Errorf("setting up the rollout reconciler: %w", err)
		}
		return nil
	})
	return terms, ropts.IgnoredNamespaces, nil
}

// setupMetricChecks returns what the reconciler measures new revisions
// with, or nil when metric checks are off: no Prometheus URL configured, or
// the checks' CRDs not installed (said in the log: a platform team that
// configured a URL expects checks to run).
func setupMetricChecks(cfg config.Config, restCfg *rest.Config) (*reconciler.MetricChecks, error) {
	p := cfg.Checks.Prometheus
	log := ctrl.Log.WithName("setup")
	if p.URL == "" {
		return nil, nil
	}
	if !checks.Served(restCfg) {
		log.Info("Metric checks are off: the API server does not serve ClusterDeploymentChecks and DeploymentChecks (install their CRDs, config/crd/checks)",
			"reason", "ChecksNotServed")
		return nil, nil
	}
	client, err := prom.New(prom.Config{
		URL: p.URL, CAFile: p.CAFile, InsecureSkipVerify: p.InsecureSkipVerify, BearerTokenFile: p.BearerTokenFile,
		Timeout: p.Timeout.Duration, QPS: p.QPS, Burst: p.Burst,
	})
	if err != nil {
		return nil, fmt.Errorf("config checks.prometheus: %w", err)
	}
	log.Info("Metric checks measure new revisions", "prometheus", client.URL(), "qps", p.QPS, "bakeWindow", cfg.Checks.BakeWindow.String())
	return &reconciler.MetricChecks{Prometheus: client, Library: &checks.Library{}, BakeWindow: cfg.Checks.BakeWindow.Duration}, nil
}

// setupProbes adds the liveness and readiness checks every part shares and
// serves them (health.Probes says which check fails, and why).
func setupProbes(mgr ctrl.Manager, pr *health.Probes, f *serveFlags, stop *gracefulStop) error {
	if err := pr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if err := pr.AddReadyzCheck("webhook", mgr.GetWebhookServer().StartedChecker()); err != nil {
		return err
	}
	if err := pr.AddReadyzCheck("not-stopping", stop.Check); err != nil {
		return err
	}
	if f.probeAddr == "" || f.probeAddr == "0" {
		return nil
	}
	srv, err := pr.Server(f.probeAddr)
	if err != nil {
		return err
	}
	return mgr.Add(srv)
}

// setupCerts wires where the serving certificate comes from (--cert-mode), the
// readiness check that it is the one the API server trusts for the guard's
// webhooks, and its expiry metric and warning.
func setupCerts(ctx context.Context, mgr ctrl.Manager, pr *health.Probes, f *serveFlags, restCfg *rest.Config, scheme *runtime.Scheme) error {
	// The Secret and cert-manager's Certificate are read directly, never
	// cached; so are the webhook configurations the self-managed mode writes.
	direct, err := client.New(restCfg, client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("creating a client: %w", err)
	}
	var missingBundle func()
	if f.certMode == "self-managed" {
		sm := &certs.SelfManaged{
			Client:         direct,
			Namespace:      f.namespace,
			SecretName:     f.certSecret,
			DNSNames:       vocab.SplitList(f.dnsNames),
			IPAddresses:    f.ips,
			CertDir:        f.certDir,
			MutatingName:   f.mutatingName,
			ValidatingName: f.validatingName,
			CALife:         f.caValidity,
			LeafLife:       f.certValidity,
			SyncEvery:      f.certSyncPeriod,
		}
		// The certificate must be on disk before the webhook server starts.
		if err := sm.Bootstrap(ctx); err != nil {
			return fmt.Errorf("issuing the self-managed serving certificate: %w", err)
		}
		if err := mgr.Add(sm); err != nil {
			return err
		}
		missingBundle = sm.Kick
	}
	host := f.webhookHost
	if host == "" {
		host = "127.0.0.1"
	}
	served := certs.DialServed(net.JoinHostPort(host, strconv.Itoa(f.webhookPort)), "")
	check := &certs.ServingCheck{
		Configurations: mgr.GetClient(), Client: direct, Served: served,
		MutatingName: f.mutatingName, ValidatingName: f.validatingName, Log: ctrl.Log.WithName("certs"),
		MissingBundle: missingBundle,
	}
	if err := pr.AddReadyzCheck("serving-certificate", check.Check); err != nil {
		return err
	}
	cm, err := certs.NewMetrics(metrics.Registry)
	if err != nil {
		return err
	}
	return mgr.Add(&certs.ExpiryMonitor{
		Served: served, Metrics: cm, Recorder: mgr.GetEventRecorder("deployguard"),
		PodName: os.Getenv("POD_NAME"), PodNamespace: f.namespace, PodUID: os.Getenv("POD_UID"),
		ValidatingName: f.validatingName, Every: f.certCheckPeriod,
	})
}

// cacheOptions keep in memory only what the guard reads: Deployments and
// ReplicaSets without their pod templates (reconciler.CacheOptions),
// PodDisruptionBudgets without their metadata and status
// (review.StripBudgetForCache), nothing with managedFields, and ConfigMaps
// of the guard's own namespace only (they are policies; the cluster's are
// never cached). Pods are never cached.
func cacheOptions(namespace, exceptions string) cache.Options {
	byObject := reconciler.CacheOptions()
	// Without the restore records (reconciler's record step): nothing reads
	// them from the cache, and each is as large as its Deployment.
	noRecords := labels.NewSelector()
	if req, err := labels.NewRequirement(vocab.LabelRecord, selection.DoesNotExist, nil); err == nil {
		noRecords = noRecords.Add(*req)
	}
	byObject[&corev1.ConfigMap{}] = cache.ByObject{Namespaces: map[string]cache.Config{namespace: {LabelSelector: noRecords}}}
	// Of a PodDisruptionBudget, what the budget index reads.
	byObject[&policyv1.PodDisruptionBudget{}] = cache.ByObject{Transform: review.StripBudgetForCache}
	// Exceptions are honoured in one namespace: the guard watches no other.
	if exceptions != "" {
		byObject[&exception.PolicyException{}] = cache.ByObject{Namespaces: map[string]cache.Config{exceptions: {}}}
	}
	return cache.Options{ByObject: byObject, DefaultTransform: cache.TransformStripManagedFields()}
}

// uncached reads from the API server and writes through lm: routing never
// starts a write from a stale copy.
func uncached(lm ctrl.Manager) routing.ReadWriter {
	return struct {
		client.Reader
		client.Writer
	}{lm.GetAPIReader(), lm.GetClient()}
}

// webhookInstalled reports whether the guard's mutating webhook configuration
// exists, from the manager's cache (the readiness check reads it too).
func webhookInstalled(r client.Reader, name string) func(context.Context) (bool, error) {
	return func(ctx context.Context) (bool, error) {
		err := r.Get(ctx, client.ObjectKey{Name: name}, &admissionregistrationv1.MutatingWebhookConfiguration{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil, err
	}
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
