package certs

import (
	"context"
	"crypto/x509"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	cmapi "github.com/cert-manager/cert-manager/pkg/apis/certmanager/v1"
)

const testNS = "deployguard-system"

var secretKey = types.NamespacedName{Namespace: testNS, Name: "deployguard-webhook-tls"}

func testScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(cmapi.AddToScheme(s))
	return s
}

func webhookConfigurations(url string) []client.Object {
	cc := admissionregistrationv1.WebhookClientConfig{URL: &url}
	return []client.Object{
		&admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "deployguard-mutating"},
			Webhooks: []admissionregistrationv1.MutatingWebhook{{Name: "default.deployments.deployguard.io", ClientConfig: cc}}},
		&admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "deployguard-validating"},
			Webhooks: []admissionregistrationv1.ValidatingWebhook{{Name: "validate.deployments.deployguard.io", ClientConfig: cc}}},
	}
}

func newFakeClient(objs ...client.Object) client.WithWatch {
	return fake.NewClientBuilder().WithScheme(testScheme()).WithObjects(objs...).Build()
}

func replica(c client.Client, clk *clocktesting.FakeClock, dir string) *SelfManaged {
	return &SelfManaged{
		Client: c, Namespace: testNS, SecretName: secretKey.Name,
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		CertDir: dir, MutatingName: "deployguard-mutating", ValidatingName: "deployguard-validating",
		CALife: time.Minute, LeafLife: 9 * time.Second, SyncEvery: 250 * time.Millisecond,
		Clock: clk,
	}
}

// served is the serving certificate a replica's webhook server would load.
func served(t *testing.T, dir string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, KeyServingCert))
	require.NoError(t, err)
	c, err := ParseCertificate(b)
	require.NoError(t, err)
	return c
}

func injected(t *testing.T, c client.Client) [][]byte {
	t.Helper()
	m := &admissionregistrationv1.MutatingWebhookConfiguration{}
	require.NoError(t, c.Get(context.Background(), client.ObjectKey{Name: "deployguard-mutating"}, m))
	v := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	require.NoError(t, c.Get(context.Background(), client.ObjectKey{Name: "deployguard-validating"}, v))
	return [][]byte{m.Webhooks[0].ClientConfig.CABundle, v.Webhooks[0].ClientConfig.CABundle}
}

func secret(t *testing.T, c client.Client) *corev1.Secret {
	t.Helper()
	s := &corev1.Secret{}
	require.NoError(t, c.Get(context.Background(), secretKey, s))
	return s
}

// assertTrusted: what the replica serves is what the API server trusts now.
func assertTrusted(t *testing.T, c client.Client, dir string, now time.Time) {
	t.Helper()
	leaf := served(t, dir)
	for _, bundle := range injected(t, c) {
		cas, err := ParseBundle(bundle)
		require.NoError(t, err)
		require.NoError(t, verifyLeaf(leaf, cas, []string{"localhost", "127.0.0.1"}, now))
	}
}

func TestSelfManagedBootstrap(t *testing.T) {
	ctx := context.Background()
	c := newFakeClient(webhookConfigurations("https://127.0.0.1:9443/validate")...)
	clk := clocktesting.NewFakeClock(t0)
	dir := t.TempDir()
	require.NoError(t, replica(c, clk, dir).Bootstrap(ctx))

	sec := secret(t, c)
	assert.Equal(t, corev1.SecretTypeTLS, sec.Type)
	assert.NotContains(t, sec.Data, KeyNextCert, "no CA waits to take over yet")
	assert.Equal(t, fingerprint(sec.Data[KeyCABundle]), sec.Annotations[AnnotationBundleSHA256], "the injection is recorded")
	for _, b := range injected(t, c) {
		assert.Equal(t, sec.Data[KeyCABundle], b)
	}
	assert.Equal(t, sec.Data[KeyServingCert], must(os.ReadFile(filepath.Join(dir, KeyServingCert))))
	link, err := os.Readlink(filepath.Join(dir, KeyServingCert))
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(dataDir, KeyServingCert), link, "files are reached through ..data, like a Secret volume")
	assertTrusted(t, c, dir, clk.Now())
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// A second replica adopts the first one's certificate; nothing is rewritten.
func TestSelfManagedReplicasShareTheSecret(t *testing.T) {
	ctx := context.Background()
	c := newFakeClient(webhookConfigurations("https://127.0.0.1:9443/validate")...)
	clk := clocktesting.NewFakeClock(t0)
	a, b := replica(c, clk, t.TempDir()), replica(c, clk, t.TempDir())
	require.NoError(t, a.Sync(ctx))
	rv := secret(t, c).ResourceVersion
	require.NoError(t, b.Sync(ctx))
	assert.Equal(t, rv, secret(t, c).ResourceVersion)
	assert.Equal(t, served(t, a.CertDir).Raw, served(t, b.CertDir).Raw)
}

// Two replicas that decide a rotation from the same Secret: the one that
// writes second gets a conflict and serves the winner's certificate after its
// next sync.
func TestSelfManagedLostRaceTakesTheWinnersCertificate(t *testing.T) {
	ctx := context.Background()
	base := newFakeClient(webhookConfigurations("https://127.0.0.1:9443/validate")...)
	clk := clocktesting.NewFakeClock(t0)
	a := replica(base, clk, t.TempDir())
	require.NoError(t, a.Sync(ctx))
	stale := secret(t, base)

	// b reads the Secret as it was before a's rotation.
	staleClient := interceptor.NewClient(base, interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if s, ok := obj.(*corev1.Secret); ok && key == secretKey {
				stale.DeepCopyInto(s)
				return nil
			}
			return c.Get(ctx, key, obj, opts...)
		},
	})
	b := replica(staleClient, clk, t.TempDir())

	clk.Step(7 * time.Second) // past two thirds of the 9s serving certificate
	require.NoError(t, a.Sync(ctx))
	won := secret(t, base)
	require.NotEqual(t, stale.Data[KeyServingCert], won.Data[KeyServingCert], "a rotated")

	err := b.Sync(ctx)
	require.Error(t, err)
	assert.True(t, apierrors.IsConflict(err), err)
	assert.Equal(t, won.Data, secret(t, base).Data, "the loser wrote nothing")

	b.Client = base
	require.NoError(t, b.Sync(ctx))
	assert.Equal(t, won.Data[KeyServingCert], must(os.ReadFile(filepath.Join(b.CertDir, KeyServingCert))))
	assertTrusted(t, base, b.CertDir, clk.Now())
}

// A new CA is trusted first and signs only after the propagation delay, and
// only while the live configurations hold it: a replica that injected an
// older bundle (it read the Secret before the new CA) delays the takeover.
func TestSelfManagedNextCAWaitsUntilTheAPIServerTrustsIt(t *testing.T) {
	ctx := context.Background()
	c := newFakeClient(webhookConfigurations("https://127.0.0.1:9443/validate")...)
	clk := clocktesting.NewFakeClock(t0)
	r := replica(c, clk, t.TempDir())
	r.CALife, r.LeafLife = 30*time.Second, 30*time.Second // the CA is due first
	require.NoError(t, r.Sync(ctx))
	firstCA := secret(t, c).Data[KeySigningCert]

	clk.Step(20 * time.Second) // two thirds of the CA's 31s life
	require.NoError(t, r.Sync(ctx))
	sec := secret(t, c)
	require.Contains(t, sec.Data, KeyNextCert, "a next CA is issued")
	assert.Equal(t, firstCA, sec.Data[KeySigningCert], "the old CA still signs")
	assert.True(t, bundleHolds(sec.Data[KeyCABundle], mustParse(KeyPair{CertPEM: sec.Data[KeyNextCert]})), "the next CA is trusted")
	oldBundle := composeBundle(clk.Now(), nil, mustParse(KeyPair{CertPEM: firstCA}))

	// A stale replica puts the old bundle back.
	for _, obj := range webhookConfigurations("https://127.0.0.1:9443/validate") {
		require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(obj), obj))
		for _, b := range caBundles(obj) {
			*b = oldBundle
		}
		require.NoError(t, c.Update(ctx, obj))
	}
	clk.Step(r.PropagationDelay + time.Second)
	require.NoError(t, r.Sync(ctx))
	sec = secret(t, c)
	assert.Equal(t, firstCA, sec.Data[KeySigningCert], "not trusted by the live configurations: the next CA must wait")
	for _, b := range injected(t, c) {
		assert.Equal(t, sec.Data[KeyCABundle], b, "the bundle is injected again")
	}
	assert.Equal(t, clk.Now().UTC().Format(time.RFC3339Nano), sec.Annotations[AnnotationBundleInjectedAt], "the delay starts again")

	clk.Step(r.PropagationDelay - time.Millisecond)
	require.NoError(t, r.Sync(ctx))
	assert.Equal(t, firstCA, secret(t, c).Data[KeySigningCert], "still within the propagation delay")

	clk.Step(time.Millisecond)
	require.NoError(t, r.Sync(ctx))
	sec = secret(t, c)
	assert.NotContains(t, sec.Data, KeyNextCert)
	assert.NotEqual(t, firstCA, sec.Data[KeySigningCert], "the next CA took over")
	assert.NoError(t, served(t, r.CertDir).CheckSignatureFrom(mustParse(KeyPair{CertPEM: sec.Data[KeySigningCert]})), "the serving certificate was re-signed by it")
	assert.True(t, bundleHolds(sec.Data[KeyCABundle], mustParse(KeyPair{CertPEM: firstCA})), "the old CA stays trusted until it expires")
	assertTrusted(t, c, r.CertDir, clk.Now())
}

// Many rotations with two replicas syncing in random order, one of them
// lagging: at every moment, what each replica serves is trusted by the API
// server, both with the bundles injected now and with those of a second ago
// (an API server sees a configuration change after a while).
func TestSelfManagedRotationsKeepEveryReplicaTrusted(t *testing.T) {
	ctx := context.Background()
	c := newFakeClient(webhookConfigurations("https://127.0.0.1:9443/validate")...)
	clk := clocktesting.NewFakeClock(t0)
	a, b := replica(c, clk, t.TempDir()), replica(c, clk, t.TempDir())
	require.NoError(t, a.Bootstrap(ctx))
	require.NoError(t, b.Sync(ctx))
	rng := rand.New(rand.NewPCG(1, 2))

	leaves, cas := map[string]bool{}, map[string]bool{}
	maxBundle := 0
	type snapshot struct {
		at      time.Time
		bundles [][]byte
	}
	history := []snapshot{{clk.Now(), injected(t, c)}}
	const apiServerLag = time.Second // less than the 2s propagation delay
	// 300s of 250ms steps: five CA lives, about fifty serving lives.
	for step := range 1200 {
		clk.Step(a.SyncEvery)
		replicas := []*SelfManaged{a}
		if step%3 == 0 { // b syncs three times less often
			replicas = append(replicas, b)
		}
		rng.Shuffle(len(replicas), func(i, j int) { replicas[i], replicas[j] = replicas[j], replicas[i] })
		for _, r := range replicas {
			if err := r.Sync(ctx); err != nil {
				require.True(t, apierrors.IsConflict(err), "only a lost race may fail a sync: %v", err)
			}
		}
		history = append(history, snapshot{clk.Now(), injected(t, c)})
		for len(history) > 1 && !history[1].at.After(clk.Now().Add(-apiServerLag)) {
			history = history[1:]
		}
		for _, r := range []*SelfManaged{a, b} {
			assertTrusted(t, c, r.CertDir, clk.Now())
			for _, bundle := range history[0].bundles {
				require.NoError(t, Verify(must(os.ReadFile(filepath.Join(r.CertDir, KeyServingCert))), bundle, nil, clk.Now()),
					"an API server that has not seen the last second's injections must trust it too")
			}
			leaf := served(t, r.CertDir)
			leaves[leaf.SerialNumber.String()] = true
			cas[string(leaf.AuthorityKeyId)] = true
		}
		maxBundle = max(maxBundle, len(must(ParseBundle(injected(t, c)[0]))))
	}
	t.Logf("%d serving certificates from %d CAs; at most %d CAs in the bundle", len(leaves), len(cas), maxBundle)
	assert.GreaterOrEqual(t, len(leaves), 40)
	assert.GreaterOrEqual(t, len(cas), 5)
	assert.LessOrEqual(t, maxBundle, 3, "old CAs leave the bundle when they expire")
}

func TestSelfManagedValidate(t *testing.T) {
	tests := []struct {
		name     string
		mutate   func(*SelfManaged)
		contains string
	}{
		{name: "defaults", mutate: func(s *SelfManaged) { s.CALife, s.LeafLife, s.SyncEvery = 0, 0, 0 }},
		{name: "test lifetimes", mutate: func(*SelfManaged) {}},
		{name: "sync slower than the serving certificate allows", mutate: func(s *SelfManaged) { s.SyncEvery = 2 * time.Second },
			contains: "sync period (2s) must be at most a sixth of the serving certificate's validity (9s)"},
		{name: "CA too short for the propagation delay", mutate: func(s *SelfManaged) { s.CALife = 5 * time.Second },
			contains: "CA validity (5s) must be at least three times the propagation delay (2s)"},
		{name: "no folder", mutate: func(s *SelfManaged) { s.CertDir = "" }, contains: "certificate folder"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := replica(nil, clocktesting.NewFakeClock(t0), "/tmp/x")
			tt.mutate(s)
			err := s.Validate()
			if tt.contains == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.contains)
		})
	}
}

// An entry an upgrade adds has no caBundle: the readiness check kicks the
// injector, which injects it at once instead of at its next period.
func TestSelfManagedInjectsANewEntryWhenKicked(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := newFakeClient(webhookConfigurations("https://127.0.0.1:9443/validate")...)
	clk := clocktesting.NewFakeClock(t0)
	dir := t.TempDir()
	sm := replica(c, clk, dir)
	sm.SyncEvery = time.Hour // never, in this test: the fake clock does not move
	sm.LeafLife, sm.CALife = 7*time.Hour, 30*time.Hour
	require.NoError(t, sm.Bootstrap(ctx))
	go func() { _ = sm.Start(ctx) }()

	v := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	require.NoError(t, c.Get(ctx, client.ObjectKey{Name: "deployguard-validating"}, v))
	v.Webhooks = append(v.Webhooks, admissionregistrationv1.ValidatingWebhook{Name: "update.deployments.deployguard.io",
		ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: v.Webhooks[0].ClientConfig.URL}})
	require.NoError(t, c.Update(ctx, v))

	check := &ServingCheck{
		Configurations: c, Client: c, MutatingName: "deployguard-mutating", ValidatingName: "deployguard-validating",
		Served:        func(context.Context) (*x509.Certificate, error) { return served(t, dir), nil },
		Clock:         clk,
		Log:           logr.Discard(),
		MissingBundle: sm.Kick,
	}
	require.ErrorContains(t, check.Check(&http.Request{}), "update.deployments.deployguard.io of ValidatingWebhookConfiguration deployguard-validating has no caBundle")
	require.Eventually(t, func() bool { return check.Check(&http.Request{}) == nil }, 10*time.Second, 20*time.Millisecond,
		"the new entry injected on the kick")
	require.NoError(t, c.Get(ctx, client.ObjectKey{Name: "deployguard-validating"}, v))
	assert.Equal(t, secret(t, c).Data[KeyCABundle], v.Webhooks[1].ClientConfig.CABundle)
}
