package tls

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cmapi "github.com/cert-manager/cert-manager/pkg/apis/certmanager/v1"
	cmmeta "github.com/cert-manager/cert-manager/pkg/apis/meta/v1"

	"github.com/deployguard/deployguard/certs"
	"github.com/deployguard/deployguard/test/harness"
)

var (
	servingCertificate = types.NamespacedName{Namespace: harness.GuardNamespace, Name: "deployguard-webhook-tls"}
	caCertificate      = types.NamespacedName{Namespace: harness.GuardNamespace, Name: "deployguard-ca"}
)

// kubeletLag is how long after a Secret changes the guard's files follow: the
// kubelet updates Secret volumes on its own schedule, while cainjector
// injects at once.
const kubeletLag = time.Second

// The cert-manager install path against cert-manager's own controllers and
// cainjector (built from its Go module by test/tools/certmanager): the objects
// of config/certmanager issue the guard's certificate, cainjector injects the
// CA into both webhook configurations (their inject-ca-from annotation, as
// config/default sets it), and the guard serves the Secret from files.
func TestCertManager(t *testing.T) {
	dir, log := tier.TestWorkDir(t)
	ctx := context.Background()
	start := time.Now()
	cmBin, err := harness.BuildCertManager(ctx, log)
	require.NoError(t, err)
	t.Logf("cert-manager's controllers built (or found up to date) in %s", time.Since(start).Round(time.Second))

	cluster, err := harness.StartCluster(ctx, tier.Tools, fmt.Sprintf("dg-tls-cm-%d", os.Getpid()), filepath.Join(dir, "cluster"), 1, log)
	require.NoError(t, err)
	defer cluster.Stop()
	cfg, err := cluster.RESTConfig()
	require.NoError(t, err)
	admin, err := client.New(harness.LoadConfig(cfg), client.Options{Scheme: scheme()})
	require.NoError(t, err)
	guardKubeconfig := filepath.Join(dir, "guard.kubeconfig")
	require.NoError(t, cluster.GuardKubeconfig(ctx, admin, guardKubeconfig))

	require.NoError(t, cluster.InstallCertManagerCRDs(ctx))
	cmLog, err := os.Create(filepath.Join(dir, "cert-manager.log"))
	require.NoError(t, err)
	defer cmLog.Close()
	cm, err := harness.StartCertManager(cmBin, cluster.Kubeconfig, cmLog)
	require.NoError(t, err)
	defer cm.Stop()
	_, err = cluster.Kubectl(ctx, cluster.Kubeconfig, "apply", "-k", filepath.Join(harness.RepoRoot(), "test", "tls", "testdata", "certmanager"))
	require.NoError(t, err)
	waitReady(ctx, t, cm, admin, servingCertificate, 2*time.Minute)

	guardDir := filepath.Join(dir, "guard")
	volCtx, stopVolume := context.WithCancel(ctx)
	defer stopVolume()
	volume := mountSecret(volCtx, admin, servingCertificate, harness.GuardCertDir(guardDir), kubeletLag)
	require.Eventually(t, func() bool { return volume.updates.Load() > 0 }, 30*time.Second, 50*time.Millisecond, "the Secret reaches the guard's folder")

	port, err := harness.FreePort()
	require.NoError(t, err)
	require.NoError(t, harness.InstallWebhooks(ctx, admin, fmt.Sprintf("https://127.0.0.1:%d", port), nil))
	annotateInjectCAFrom(ctx, t, admin, servingCertificate.String())
	require.Eventually(t, func() bool {
		b, err := injectedBundle(ctx, admin)
		return err == nil && bytes.Equal(b, secretData(ctx, t, admin, servingCertificate.Name)[cmmeta.TLSCAKey])
	}, 30*time.Second, 50*time.Millisecond, "cainjector injects the Secret's ca.crt")

	guardLog, err := os.Create(filepath.Join(dir, "guard.log"))
	require.NoError(t, err)
	defer guardLog.Close()
	g, err := harness.StartGuard(harness.GuardOptions{
		Binary: tier.Guard, Kubeconfig: guardKubeconfig, WorkDir: guardDir, WebhookPort: port, Output: guardLog,
		ExtraArgs: []string{"--cert-mode=files", "--cert-check-period=250ms"},
	})
	require.NoError(t, err)
	defer g.Stop()
	require.NoError(t, g.WaitReady(ctx, time.Minute), "/readyz: the served certificate chains to the injected CA")
	require.NoError(t, harness.WaitForWebhooks(ctx, admin, "default", time.Minute))
	served := certs.DialServed(fmt.Sprintf("127.0.0.1:%d", port), "localhost")

	t.Run("the API server calls the guard with cert-manager's certificate", func(t *testing.T) {
		ns := harness.NewNamespace(t, admin)
		leaf, err := served(ctx)
		require.NoError(t, err)
		issued, err := certs.ParseCertificate(secretData(ctx, t, admin, servingCertificate.Name)[corev1.TLSCertKey])
		require.NoError(t, err)
		assert.True(t, leaf.Equal(issued), "the guard serves the Secret cert-manager issued")

		d := goodDeployment(ns, 0)
		require.NoError(t, admin.Create(ctx, d))
		assert.Equal(t, d.Spec.Template.Labels, d.Spec.Selector.MatchLabels, "defaulted by the mutating webhook")
		err = admin.Create(ctx, badDeployment(ns, 1))
		require.Error(t, err)
		assert.Contains(t, err.Error(), refusedBecause, "refused by the validating webhook")
	})

	t.Run("renewals under load fail no request", func(t *testing.T) {
		ns := harness.NewNamespace(t, admin)
		runCtx, stop := context.WithTimeout(ctx, 45*time.Second)
		defer stop()
		seen := observe(runCtx, served, admin)
		conns, err := apiServerConnections(runCtx, port)
		require.NoError(t, err)
		renewed := make(chan []string, 1)
		go func() {
			var did []string
			for i := 0; runCtx.Err() == nil; i++ {
				key := servingCertificate
				if i == 6 {
					key = caCertificate // the CA once, keeping its key (rotationPolicy Never)
				}
				if err := renew(runCtx, admin, key); err != nil {
					if runCtx.Err() == nil {
						did = append(did, "error: "+err.Error())
					}
					break
				}
				did = append(did, key.Name)
				sleep(runCtx, 500*time.Millisecond)
			}
			renewed <- did
		}()
		stats := runLoad(runCtx, admin, ns, loadRate)
		did := <-renewed

		t.Logf("cert-manager: %s", stats)
		t.Logf("cert-manager: %d renewals through cert-manager (%d of the CA), %d Secret volume updates, %d serving certificate rotations observed at the guard (%d certificates, %d of them handshaked by kube-apiserver over %d new connections); CAs injected (cainjector merges a renewed CA into the bundle): %v",
			len(did), count(did, caCertificate.Name), volume.updates.Load(), seen.servingRotations(), len(seen.leaves), exercised(seen, conns), len(conns.first), seen.injectedCAs())
		assert.Zero(t, stats.Failed.Load(), "failed requests: %v", stats.Failures())
		assert.GreaterOrEqual(t, stats.Rate(), float64(minLoadRate), "admission requests per second")
		assert.Equal(t, 0, count(did, "error: "), "renewals: %v", did)
		assert.Equal(t, 1, count(did, caCertificate.Name), "the CA was renewed once")
		assert.GreaterOrEqual(t, seen.servingRotations(), minRotations)
		assert.GreaterOrEqual(t, exercised(seen, conns), minRotations+1, "the API server verified the rotated certificates itself")
		assert.GreaterOrEqual(t, len(seen.injectedCAs()), 2, "a renewed CA was injected")
		assert.Empty(t, seen.bundleErrors)
	})

	t.Run("readyz follows the injected bundle and says what cert-manager holds", func(t *testing.T) {
		require.Eventually(t, func() bool {
			leaf, err := served(ctx)
			issued, _ := certs.ParseCertificate(secretData(ctx, t, admin, servingCertificate.Name)[corev1.TLSCertKey])
			return err == nil && leaf.Equal(issued)
		}, 10*time.Second, 50*time.Millisecond, "the last renewal reached the guard")
		require.NoError(t, cm.Stop(), "without cainjector nothing repairs the bundle")
		good, err := injectedBundle(ctx, admin)
		require.NoError(t, err)
		wrong, err := certs.NewCA(time.Now(), time.Hour)
		require.NoError(t, err)
		setBundle(ctx, t, admin, wrong.CertPEM)
		require.Eventually(t, func() bool { return readyzStatus(g) == 500 }, 10*time.Second, 50*time.Millisecond)
		logged := logLines(t, guardLog.Name(), "not what the API server trusts")
		require.NotEmpty(t, logged)
		for _, s := range []string{
			"does not chain to the CA bundle",
			"cert-manager Certificate deployguard-system/deployguard-webhook-tls is Ready",
			"the guard serves its Secret's certificate",
			"cainjector injects its ca.crt",
		} {
			assert.Contains(t, logged[len(logged)-1], s)
		}
		setBundle(ctx, t, admin, good)
		require.Eventually(t, func() bool { return readyzStatus(g) == 200 }, 10*time.Second, 50*time.Millisecond)
	})
}

func count(ss []string, prefix string) int {
	n := 0
	for _, s := range ss {
		if strings.HasPrefix(s, prefix) {
			n++
		}
	}
	return n
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// waitReady waits until cert-manager marks the Certificate Ready.
func waitReady(ctx context.Context, t *testing.T, cm *harness.Process, c client.Client, key types.NamespacedName, timeout time.Duration) {
	t.Helper()
	var why string
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		if cm.Exited() {
			return false, errors.New("cert-manager's controllers exited")
		}
		crt := &cmapi.Certificate{}
		if err := c.Get(ctx, key, crt); err != nil {
			why = err.Error()
			return false, nil
		}
		ready, reason := certs.CertificateReady(crt)
		why = reason
		return ready, nil
	})
	require.NoError(t, err, "Certificate %s not Ready: %s", key, why)
}

// renew is `cmctl renew`: it sets the Certificate's Issuing condition (reason
// ManuallyTriggered) and waits until cert-manager has issued the next
// revision and the Certificate is Ready again.
func renew(ctx context.Context, c client.Client, key types.NamespacedName) error {
	crt := &cmapi.Certificate{}
	rev := 0
	// cert-manager writes the Certificate's status too (a renewal of its own
	// may be finishing): on a conflict, read it again and trigger again, as
	// cmctl does.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := c.Get(ctx, key, crt); err != nil {
			return err
		}
		rev = 0
		if crt.Status.Revision != nil {
			rev = *crt.Status.Revision
		}
		now := metav1.Now()
		var conds []cmapi.CertificateCondition
		for _, cond := range crt.Status.Conditions {
			if cond.Type != cmapi.CertificateConditionIssuing {
				conds = append(conds, cond)
			}
		}
		crt.Status.Conditions = append(conds, cmapi.CertificateCondition{
			Type: cmapi.CertificateConditionIssuing, Status: cmmeta.ConditionTrue, Reason: "ManuallyTriggered",
			Message: "Certificate re-issuance manually triggered", LastTransitionTime: &now, ObservedGeneration: crt.Generation,
		})
		return c.Status().Update(ctx, crt)
	})
	if err != nil {
		return fmt.Errorf("triggering the renewal of %s: %w", key, err)
	}
	return wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, key, crt); err != nil {
			return false, nil
		}
		ready, _ := certs.CertificateReady(crt)
		return ready && crt.Status.Revision != nil && *crt.Status.Revision > rev, nil
	})
}

func secretData(ctx context.Context, t *testing.T, c client.Client, name string) map[string][]byte {
	t.Helper()
	s := &corev1.Secret{}
	require.NoError(t, c.Get(ctx, types.NamespacedName{Namespace: harness.GuardNamespace, Name: name}, s))
	return s.Data
}

// annotateInjectCAFrom sets cainjector's annotation on both webhook
// configurations, as config/default does.
func annotateInjectCAFrom(ctx context.Context, t *testing.T, c client.Client, from string) {
	t.Helper()
	for _, obj := range []client.Object{
		&admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "deployguard-mutating"}},
		&admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "deployguard-validating"}},
	} {
		require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(obj), obj))
		before := obj.DeepCopyObject().(client.Object)
		obj.SetAnnotations(map[string]string{certs.AnnotationInjectCAFrom: from})
		require.NoError(t, c.Patch(ctx, obj, client.MergeFrom(before)))
	}
}

// secretVolume plays the kubelet's part for a guard that runs as a local
// process: it copies a Secret's tls.crt and tls.key into a folder the way the
// kubelet updates a Secret volume (one atomic ..data swap), lag after it sees
// a change.
type secretVolume struct {
	updates atomic.Int64
}

func mountSecret(ctx context.Context, c client.Reader, key types.NamespacedName, dir string, lag time.Duration) *secretVolume {
	v := &secretVolume{}
	go func() {
		var last []byte
		for ctx.Err() == nil {
			s := &corev1.Secret{}
			if err := c.Get(ctx, key, s); err == nil && len(s.Data[corev1.TLSCertKey]) > 0 && !bytes.Equal(s.Data[corev1.TLSCertKey], last) {
				if last != nil {
					sleep(ctx, lag)
				}
				files := map[string][]byte{corev1.TLSCertKey: s.Data[corev1.TLSCertKey], corev1.TLSPrivateKeyKey: s.Data[corev1.TLSPrivateKeyKey]}
				if _, err := certs.WriteAtomic(dir, files); err == nil {
					last = s.Data[corev1.TLSCertKey]
					v.updates.Add(1)
				}
			}
			sleep(ctx, 100*time.Millisecond)
		}
	}()
	return v
}
