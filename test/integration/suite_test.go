// Package integration runs the guard's webhooks through a real kube-apiserver
// (envtest: kube-apiserver and etcd built by `make tools`), registered from the
// same config/webhook manifests that are deployed.
package integration

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zapcore"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/deployguard/deployguard/cmd/deployguard/config"
	"github.com/deployguard/deployguard/policy"
	"github.com/deployguard/deployguard/reconciler"
	"github.com/deployguard/deployguard/reconciler/analysis/checks"
	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/test/harness"
	guardwebhook "github.com/deployguard/deployguard/webhook"
	"github.com/deployguard/deployguard/webhook/checkadmission"
	"github.com/deployguard/deployguard/webhook/exception"
	"github.com/deployguard/deployguard/webhook/review"
)

const (
	guardUser             = "system:serviceaccount:deployguard-system:deployguard"
	breakGlassGroup       = "platform-admins"
	policyErrorAnnotation = "deployguard.io/policy-error"
)

var (
	scheme  = runtime.NewScheme()
	cfg     *rest.Config
	k8s     client.Client
	testEnv *envtest.Environment
	// engine is the guard's policy engine, which the audit test shares.
	engine *policy.Engine
	// exceptions is the guard's index of PolicyExceptions, which the audit
	// test shares as serve shares it.
	exceptions *exception.Index
)

func TestMain(m *testing.M) {
	os.Exit(harness.RunTier(m, harness.TierOptions{
		Name:  "integration",
		Tools: []string{"kube-apiserver", "etcd"},
		// The tests that run the binary (parity, `check`) find it themselves.
		WithoutGuard: true,
		Logger: func(io.Writer) logr.Logger {
			return zap.New(zap.WriteTo(os.Stderr), zap.Level(zapcore.Level(zapLevel())))
		},
		Setup: setup,
	}))
}

// setup starts the API server (envtest) with the deployed webhook
// configurations and the guard's handlers behind them, as serve wires them.
func setup(ctx context.Context, tier *harness.Tier) error {
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(exception.AddToScheme(scheme))
	utilruntime.Must(checks.AddToScheme(scheme))

	testEnv = &envtest.Environment{
		BinaryAssetsDirectory: tier.Tools,
		WebhookInstallOptions: envtest.WebhookInstallOptions{
			Paths: []string{filepath.Join(harness.RepoRoot(), "config", "webhook")},
		},
		// Only the PolicyReport CRD: the audit test proves that the guard keeps
		// working when the configured report kind (openreports.io) is absent.
		CRDInstallOptions: envtest.CRDInstallOptions{
			Paths: []string{filepath.Join(harness.RepoRoot(), "config", "crd", "policyreport", "wgpolicyk8s.io_policyreports.yaml"),
				filepath.Join(harness.RepoRoot(), "config", "crd", "exceptions"),
				filepath.Join(harness.RepoRoot(), "config", "crd", "checks")},
			ErrorIfPathMissing: true,
		},
	}
	var err error
	if cfg, err = testEnv.Start(); err != nil {
		return fmt.Errorf("starting the API server: %w", err)
	}
	tier.Cleanup(func() {
		if err := testEnv.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stopping the API server:", err)
		}
	})
	if k8s, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		return err
	}
	stop, err := startGuard(ctx)
	if err != nil {
		return fmt.Errorf("starting the guard's webhooks: %w", err)
	}
	tier.Cleanup(stop)
	if err := setupNamespaces(ctx); err != nil {
		return err
	}
	// The rules that need only the object are the API server's, as deployed.
	if err := harness.InstallNativePolicies(ctx, k8s, guardConfig().WebhookOptions(guardUser).NativeSettings()); err != nil {
		return fmt.Errorf("installing the native policies: %w", err)
	}
	return harness.WaitForWebhooks(ctx, k8s, "default", 30*time.Second)
}

func zapLevel() int8 {
	if os.Getenv("DEPLOYGUARD_TEST_VERBOSE") != "" {
		return -2
	}
	return 2 // errors only: the tests assert on what users see
}

// Exemptions of the suite's guard: the parity test's, kept out of every
// other test's way.
const (
	exemptNamespace = "parity-exempt"
	exemptUser      = "parity-exempt-user"
	exemptGroup     = "parity-exempt-group"
)

// guardConfigYAML is the suite's guard configuration: the defaults, plus who
// may break glass and who is exempt, the settings a platform team would add.
// `deployguard check --config` reads the same file.
const guardConfigYAML = `finalizers:
  breakGlassGroups: [` + breakGlassGroup + `]
exemptions:
  namespaces: [` + exemptNamespace + `]
  usernames: [` + exemptUser + `]
  groups: [` + exemptGroup + `]
`

func guardConfig() config.Config {
	c, err := config.Parse([]byte(guardConfigYAML))
	if err != nil {
		panic(err)
	}
	return c
}

// suiteBodyTimeout is how long the suite's guard waits for a request's body.
const suiteBodyTimeout = 2 * time.Second

// startGuard serves the guard's real handlers on envtest's webhook address.
func startGuard(ctx context.Context) (func(), error) {
	o := &testEnv.WebhookInstallOptions
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme: scheme,
		WebhookServer: ctrlwebhook.NewServer(ctrlwebhook.Options{
			Host: o.LocalServingHost, Port: o.LocalServingPort, CertDir: o.LocalServingCertDir,
			TLSOpts: []func(*tls.Config){func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }},
		}),
		Metrics: metricsserver.Options{BindAddress: "0"},
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			&corev1.ConfigMap{}:          {Namespaces: map[string]cache.Config{harness.GuardNamespace: {}}},
			&appsv1.Deployment{}:         {Transform: reconciler.StripForCache},
			&exception.PolicyException{}: {Namespaces: map[string]cache.Config{harness.GuardNamespace: {}}},
		}},
	})
	if err != nil {
		return nil, err
	}
	m, err := guardwebhook.NewMetrics(nil)
	if err != nil {
		return nil, err
	}
	// The guard as `serve` builds it from the default configuration: the same
	// options, the built-in policies, and hot reload from ConfigMaps.
	cfg := guardConfig()
	popts, err := cfg.PolicyOptions()
	if err != nil {
		return nil, err
	}
	engine, err = policy.New(popts)
	if err != nil {
		return nil, err
	}
	if err := engine.Load(ctx, policy.Builtins()); err != nil {
		return nil, err
	}
	src := &policy.ConfigMapSource{
		Engine: engine, Base: policy.Builtins(), Namespace: harness.GuardNamespace,
		LabelKey: vocab.LabelPolicy, ErrorAnnotation: policyErrorAnnotation,
	}
	if err := src.SetupWithManager(mgr); err != nil {
		return nil, err
	}
	overlaps, budgets, err := review.Indexes(ctx, mgr.GetCache())
	if err != nil {
		return nil, err
	}
	exceptions, err = exception.SetupWithManager(ctx, mgr, cfg.ExceptionsNamespace(harness.GuardNamespace),
		func() exception.Limits {
			return cfg.ExceptionLimits(harness.GuardNamespace, config.PolicyNames(engine))
		}, nil)
	if err != nil {
		return nil, err
	}
	// The metric checks' webhook, as serve registers it.
	checkadmission.Register(mgr.GetWebhookServer(), nil)
	(&guardwebhook.Hooks{
		Reviewer: &review.Reviewer{
			Options:         cfg.WebhookOptions(guardUser),
			Overlaps:        overlaps,
			Budgets:         budgets,
			Policies:        review.RegoPolicies{Engine: engine},
			NamespaceLabels: guardwebhook.CacheNamespaceLabels(mgr.GetClient()),
			Exceptions:      exceptions,
		},
		ServeVerdicts: true,
		// Shorter than serve's, so that TestStalledClientsDoNotStopAdmission
		// waits two seconds for it, not ten.
		BodyTimeout: suiteBodyTimeout,
	}).SetupWithManager(mgr, m, nil)

	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := mgr.Start(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "manager:", err)
		}
	}()
	addr := net.JoinHostPort(o.LocalServingHost, strconv.Itoa(o.LocalServingPort))
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", addr, &tls.Config{InsecureSkipVerify: true})
		if err != nil {
			return false, nil
		}
		conn.Close()
		return true, nil
	})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("webhook server not listening on %s: %w", addr, err)
	}
	return func() { cancel(); wg.Wait() }, nil
}

// setupNamespaces creates the guard's namespace and gives the guard's service
// account the rights the tests impersonate it with.
func setupNamespaces(ctx context.Context) error {
	for _, obj := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: harness.GuardNamespace}},
		&rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "deployguard-test"},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "cluster-admin"},
			Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "deployguard", Namespace: harness.GuardNamespace}},
		},
	} {
		if err := k8s.Create(ctx, obj); err != nil {
			return fmt.Errorf("creating %s: %w", obj.GetName(), err)
		}
	}
	return nil
}

// warningRecorder collects the warnings the API server relays to the client.
type warningRecorder struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warningRecorder) HandleWarningHeader(code int, agent, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, text)
}

// reset forgets the warnings so far, before a request whose own are wanted.
func (w *warningRecorder) reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = nil
}

func (w *warningRecorder) all() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.msgs...)
}

// clientAs returns a client that records warnings and optionally impersonates.
func clientAs(t *testing.T, user string) (client.Client, *warningRecorder) {
	t.Helper()
	c := rest.CopyConfig(cfg)
	w := &warningRecorder{}
	c.WarningHandler = w
	if user != "" {
		c.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: []string{"system:authenticated"}}
	}
	cl, err := client.New(c, client.Options{Scheme: scheme})
	require.NoError(t, err)
	return cl, w
}

// clientAsGroups returns a client that impersonates user in groups.
func clientAsGroups(t *testing.T, user string, groups ...string) (client.Client, *warningRecorder) {
	t.Helper()
	c := rest.CopyConfig(cfg)
	w := &warningRecorder{}
	c.WarningHandler = w
	c.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: append([]string{"system:authenticated"}, groups...)}
	cl, err := client.New(c, client.Options{Scheme: scheme})
	require.NoError(t, err)
	return cl, w
}

// kubectl runs the cluster's own kubectl against the test API server as its
// admin, with obj as JSON on stdin, and returns its combined output.
func kubectl(t *testing.T, obj any, args ...string) (string, error) {
	t.Helper()
	tools, err := harness.ToolsDir("kubectl")
	require.NoError(t, err)
	path := adminKubeconfig(t)
	in, err := json.Marshal(obj)
	require.NoError(t, err)
	cmd := exec.Command(filepath.Join(tools, "kubectl"), append([]string{"--kubeconfig", path}, args...)...)
	cmd.Stdin = bytes.NewReader(in)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// adminKubeconfig writes a kubeconfig of the test API server's admin, for
// the commands that run as a cluster's users run them.
func adminKubeconfig(t *testing.T) string {
	t.Helper()
	user, err := testEnv.ControlPlane.AddUser(envtest.User{Name: "kubectl-admin", Groups: []string{"system:masters"}}, nil)
	require.NoError(t, err)
	kubeconfig, err := user.KubeConfig()
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, os.WriteFile(path, kubeconfig, 0o600))
	return path
}

// kept keeps a test's namespace after it: envtest runs no namespace
// controller, so a deleted namespace would stay Terminating, with its
// Deployments, for the rest of the tier, and refuse the reports each test's
// audit writes for every namespace.
var kept = harness.KeepNamespace()

// appImage is the image of the tests' Deployments (harness.Deployment).
const appImage = "nginx:1.27.3"

func ptr[T any](v T) *T { return &v }

// Deadlines for conditions the tests wait on.
const (
	waitShort = 10 * time.Second
	tick      = 50 * time.Millisecond
)
