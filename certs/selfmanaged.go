package certs

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Keys of the self-managed Secret. ca.crt is the trust bundle (the current CA
// and any older one still in use); the signing pair is the current CA alone.
const (
	KeyCABundle      = "ca.crt"
	KeySigningCert   = "ca-signing.crt"
	KeySigningKey    = "ca-signing.key"
	KeyServingCert   = corev1.TLSCertKey
	KeyServingKey    = corev1.TLSPrivateKeyKey
	defaultCALife    = 365 * 24 * time.Hour
	defaultLeafLife  = 30 * 24 * time.Hour
	defaultSyncEvery = time.Minute
)

// SelfManaged issues the guard's own CA and serving certificate, keeps them in a
// Secret that every replica shares (optimistic concurrency decides who writes),
// writes the serving pair to CertDir for the webhook server, and injects the CA
// bundle into the guard's webhook configurations.
type SelfManaged struct {
	// Client must read from the API server directly: the Secret and webhook
	// configurations are not in the manager's cache.
	Client         client.Client
	Namespace      string
	SecretName     string
	DNSNames       []string
	IPAddresses    []net.IP
	CertDir        string
	MutatingName   string
	ValidatingName string

	// CALife and LeafLife default to a year and 30 days; tests shorten them.
	CALife, LeafLife time.Duration
	// SyncEvery is how often the Secret, files and bundles are checked.
	SyncEvery time.Duration
	Clock     clock.WithTicker
}

func (s *SelfManaged) defaults() {
	if s.CALife == 0 {
		s.CALife = defaultCALife
	}
	if s.LeafLife == 0 {
		s.LeafLife = defaultLeafLife
	}
	if s.SyncEvery == 0 {
		s.SyncEvery = defaultSyncEvery
	}
	if s.Clock == nil {
		s.Clock = clock.RealClock{}
	}
}

// Bootstrap makes sure a serving certificate is on disk before the webhook
// server starts, retrying for a short while (another replica may be writing).
func (s *SelfManaged) Bootstrap(ctx context.Context) error {
	s.defaults()
	var last error
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		last = s.Sync(ctx)
		return last == nil, nil
	})
	if err != nil && last != nil {
		return last
	}
	return err
}

// Start keeps the certificate fresh until ctx ends; it runs on every replica.
func (s *SelfManaged) Start(ctx context.Context) error {
	s.defaults()
	log := ctrl.LoggerFrom(ctx).WithName("certs")
	t := s.Clock.NewTicker(s.SyncEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
			if err := s.Sync(ctx); err != nil {
				// The current certificate stays in use; the next tick retries.
				log.Error(err, "keeping the self-managed certificate fresh failed")
			}
		}
	}
}

// NeedLeaderElection: every replica serves webhooks and needs the files.
func (s *SelfManaged) NeedLeaderElection() bool { return false }

// Sync makes one step towards a fresh certificate: read the Secret, rotate what
// is due, write the Secret (losing a race to another replica is fine: its result
// is used), write the files and inject the bundle.
func (s *SelfManaged) Sync(ctx context.Context) error {
	s.defaults()
	now := s.Clock.Now()
	sec := &corev1.Secret{}
	err := s.Client.Get(ctx, types.NamespacedName{Namespace: s.Namespace, Name: s.SecretName}, sec)
	exists := err == nil
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("reading Secret %s/%s: %w", s.Namespace, s.SecretName, err)
	}
	data, changed, err := s.next(sec.Data, now)
	if err != nil {
		return err
	}
	if changed {
		if exists {
			sec.Data = data
			err = s.Client.Update(ctx, sec) // carries resourceVersion: a lost race is a conflict
		} else {
			sec = &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Namespace: s.Namespace, Name: s.SecretName,
					Labels: map[string]string{"app.kubernetes.io/name": "deployguard", "app.kubernetes.io/component": "webhook-tls"}},
				Type: corev1.SecretTypeTLS,
				Data: data,
			}
			err = s.Client.Create(ctx, sec)
		}
		if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("another replica updated Secret %s/%s first; retrying with its certificate: %w", s.Namespace, s.SecretName, err)
		}
		if err != nil {
			return fmt.Errorf("writing Secret %s/%s: %w", s.Namespace, s.SecretName, err)
		}
	}
	if err := writeFiles(s.CertDir, data[KeyServingCert], data[KeyServingKey]); err != nil {
		return err
	}
	return s.inject(ctx, data[KeyCABundle])
}

// next decides the Secret's next content. A new CA first only joins the bundle;
// the serving certificate is re-signed by it on a later step, once the bundle
// holding it has been injected, so that no client ever sees a certificate it
// does not trust yet.
func (s *SelfManaged) next(cur map[string][]byte, now time.Time) (map[string][]byte, bool, error) {
	data := map[string][]byte{}
	for k, v := range cur {
		data[k] = v
	}
	signing := KeyPair{CertPEM: data[KeySigningCert], KeyPEM: data[KeySigningKey]}
	if _, _, err := signing.parse(); err != nil || needsRenewal(signing.CertPEM, nil, nil, now) {
		ca, err := NewCA(now, s.CALife)
		if err != nil {
			return nil, false, err
		}
		data[KeySigningCert], data[KeySigningKey] = ca.CertPEM, ca.KeyPEM
		data[KeyCABundle] = bundleWith(ca.CertPEM, cur[KeyCABundle], now)
		if len(cur[KeyServingCert]) > 0 && Verify(cur[KeyServingCert], data[KeyCABundle], nil, now) == nil {
			return data, true, nil // serving certificate rotates on the next step
		}
		signing = ca
	}
	if Verify(data[KeyServingCert], data[KeySigningCert], nil, now) != nil ||
		needsRenewal(data[KeyServingCert], s.DNSNames, s.IPAddresses, now) {
		leaf, err := NewServing(signing, s.DNSNames, s.IPAddresses, now, s.LeafLife)
		if err != nil {
			return nil, false, err
		}
		data[KeyServingCert], data[KeyServingKey] = leaf.CertPEM, leaf.KeyPEM
		// Older CAs stay trusted until they expire: a replica that has not yet
		// reloaded may still serve a certificate they signed.
		data[KeyCABundle] = bundleWith(signing.CertPEM, cur[KeyCABundle], now)
	}
	changed := false
	for _, k := range []string{KeyCABundle, KeySigningCert, KeySigningKey, KeyServingCert, KeyServingKey} {
		if !bytes.Equal(cur[k], data[k]) {
			changed = true
		}
	}
	return data, changed, nil
}

// writeFiles replaces tls.crt and tls.key atomically (rename), so the webhook
// server's file watcher never reads half a certificate.
func writeFiles(dir string, cert, key []byte) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	for name, b := range map[string][]byte{KeyServingKey: key, KeyServingCert: cert} {
		p := filepath.Join(dir, name)
		if cur, err := os.ReadFile(p); err == nil && bytes.Equal(cur, b) {
			continue
		}
		tmp, err := os.CreateTemp(dir, "."+name+"-*")
		if err != nil {
			return fmt.Errorf("writing %s: %w", p, err)
		}
		if _, err := tmp.Write(b); err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
			return fmt.Errorf("writing %s: %w", p, err)
		}
		if err := tmp.Close(); err != nil {
			os.Remove(tmp.Name())
			return fmt.Errorf("writing %s: %w", p, err)
		}
		if err := os.Rename(tmp.Name(), p); err != nil {
			return fmt.Errorf("writing %s: %w", p, err)
		}
	}
	return nil
}

// inject writes the CA bundle into every webhook of the guard's two
// configurations. A configuration that does not exist yet is not an error: it
// gets the bundle on a later sync.
func (s *SelfManaged) inject(ctx context.Context, bundle []byte) error {
	if s.MutatingName != "" {
		m := &admissionregistrationv1.MutatingWebhookConfiguration{}
		err := injectInto(ctx, s.Client, s.MutatingName, m, bundle, func() [][]byte {
			out := make([][]byte, len(m.Webhooks))
			for i := range m.Webhooks {
				out[i] = m.Webhooks[i].ClientConfig.CABundle
				m.Webhooks[i].ClientConfig.CABundle = bundle
			}
			return out
		})
		if err != nil {
			return err
		}
	}
	if s.ValidatingName != "" {
		v := &admissionregistrationv1.ValidatingWebhookConfiguration{}
		return injectInto(ctx, s.Client, s.ValidatingName, v, bundle, func() [][]byte {
			out := make([][]byte, len(v.Webhooks))
			for i := range v.Webhooks {
				out[i] = v.Webhooks[i].ClientConfig.CABundle
				v.Webhooks[i].ClientConfig.CABundle = bundle
			}
			return out
		})
	}
	return nil
}

// injectInto reads the named configuration into obj, lets set swap the bundle
// into every webhook (it returns the previous bundles), and patches obj under an
// optimistic lock when anything changed.
func injectInto(ctx context.Context, c client.Client, name string, obj client.Object, bundle []byte, set func() [][]byte) error {
	kind := fmt.Sprintf("%T", obj)
	if err := c.Get(ctx, types.NamespacedName{Name: name}, obj); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("reading %s %s: %w", kind, name, err)
	}
	before := obj.DeepCopyObject().(client.Object)
	changed := false
	for _, prev := range set() {
		if !bytes.Equal(prev, bundle) {
			changed = true
		}
	}
	if !changed {
		return nil
	}
	if err := c.Patch(ctx, obj, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("injecting the CA bundle into %s %s: %w", kind, name, err)
	}
	return nil
}
