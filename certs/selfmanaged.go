package certs

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"sync"
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

// Keys of the self-managed Secret. ca.crt is the trust bundle injected into
// the webhook configurations (the signing CA, a CA waiting to take over, and
// older CAs until they expire); the signing pair signs serving certificates;
// the next pair is a new CA that is trusted already but signs only once the
// API server has had its bundle for a while.
const (
	KeyCABundle    = "ca.crt"
	KeySigningCert = "ca-signing.crt"
	KeySigningKey  = "ca-signing.key"
	KeyNextCert    = "ca-next.crt"
	KeyNextKey     = "ca-next.key"
	KeyServingCert = corev1.TLSCertKey
	KeyServingKey  = corev1.TLSPrivateKeyKey

	// AnnotationBundleSHA256 and AnnotationBundleInjectedAt record which CA
	// bundle (by fingerprint) was last injected into the webhook
	// configurations, and when: a new CA signs only once its bundle has been
	// there for the propagation delay.
	AnnotationBundleSHA256     = "deployguard.io/ca-bundle-sha256"
	AnnotationBundleInjectedAt = "deployguard.io/ca-bundle-injected-at"

	defaultCALife    = 365 * 24 * time.Hour
	defaultLeafLife  = 30 * 24 * time.Hour
	defaultSyncEvery = time.Minute
)

// SelfManaged issues the guard's own CA and serving certificate, keeps them in a
// Secret that every replica shares, writes the serving pair to CertDir for the
// webhook server, and injects the CA bundle into the guard's webhook
// configurations.
//
// Replicas never fight: each one reads the Secret, decides the next step from
// it alone, and writes it back with the resourceVersion it read; the loser of a
// race gets a conflict and takes the winner's result on its next sync.
//
// No request fails across a rotation:
//   - a new serving certificate is signed by a CA the API server already
//     trusts;
//   - a new CA first only joins the injected bundle (as "next"); it starts
//     signing once that bundle has been in both webhook configurations for
//     PropagationDelay, checked on the live objects;
//   - an older CA stays in the bundle until it expires, so a replica that has
//     not reloaded yet still serves a trusted certificate (it never outlives
//     its CA);
//   - the webhook server reloads the files, which are swapped all at once.
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
	// SyncEvery is how often every replica checks the Secret, its files and
	// the injected bundles (default a minute).
	SyncEvery time.Duration
	// PropagationDelay is how long a new CA has been in the injected bundle
	// before it signs (default twice SyncEvery, at least 2s). One sync is
	// bounded to half of it, so a replica that read an older Secret cannot
	// undo an injection after the new CA took over.
	PropagationDelay time.Duration
	Clock            clock.WithTicker

	kickOnce sync.Once
	kicked   chan struct{}
}

// Kick asks Start for a sync now rather than at the next period (a webhook
// entry without a CA bundle, added by an upgrade). It never blocks; kicks
// before a sync are one.
func (s *SelfManaged) Kick() {
	select {
	case s.kicks() <- struct{}{}:
	default:
	}
}

func (s *SelfManaged) kicks() chan struct{} {
	s.kickOnce.Do(func() { s.kicked = make(chan struct{}, 1) })
	return s.kicked
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
	if s.PropagationDelay == 0 {
		s.PropagationDelay = max(2*s.SyncEvery, 2*time.Second)
	}
	if s.Clock == nil {
		s.Clock = clock.RealClock{}
	}
}

// Validate says whether the lifetimes leave room for a rotation: every
// replica must pick up a serving certificate within the third of its
// predecessor's life that is left at renewal, and a new CA must take over
// before the old one expires.
func (s *SelfManaged) Validate() error {
	s.defaults()
	var errs []error
	if s.SyncEvery*6 > s.LeafLife {
		errs = append(errs, fmt.Errorf("the sync period (%s) must be at most a sixth of the serving certificate's validity (%s)", s.SyncEvery, s.LeafLife))
	}
	if 3*(s.PropagationDelay+2*s.SyncEvery) > s.CALife {
		errs = append(errs, fmt.Errorf("the CA validity (%s) must be at least three times the propagation delay (%s) plus two sync periods", s.CALife, s.PropagationDelay))
	}
	if s.CertDir == "" || s.Namespace == "" || s.SecretName == "" {
		errs = append(errs, errors.New("the certificate folder, namespace and Secret name must be set"))
	}
	return errors.Join(errs...)
}

// Bootstrap makes sure a serving certificate is on disk before the webhook
// server starts, retrying for a short while (another replica may be writing).
func (s *SelfManaged) Bootstrap(ctx context.Context) error {
	if err := s.Validate(); err != nil {
		return err
	}
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
		case <-s.kicks():
		}
		if err := s.Sync(ctx); err != nil {
			// The current certificate stays in use; the next tick retries.
			log.Info("keeping the self-managed certificate fresh failed; retrying", "reason", err.Error())
		}
	}
}

// NeedLeaderElection: every replica serves webhooks and needs the files.
func (s *SelfManaged) NeedLeaderElection() bool { return false }

// secretState is the content of the self-managed Secret.
type secretState struct {
	bundle       []byte
	signing      KeyPair
	next         KeyPair
	serving      KeyPair
	injectedHash string
	injectedAt   time.Time
}

func stateOf(sec *corev1.Secret) secretState {
	st := secretState{
		bundle:       sec.Data[KeyCABundle],
		signing:      KeyPair{CertPEM: sec.Data[KeySigningCert], KeyPEM: sec.Data[KeySigningKey]},
		next:         KeyPair{CertPEM: sec.Data[KeyNextCert], KeyPEM: sec.Data[KeyNextKey]},
		serving:      KeyPair{CertPEM: sec.Data[KeyServingCert], KeyPEM: sec.Data[KeyServingKey]},
		injectedHash: sec.Annotations[AnnotationBundleSHA256],
	}
	if t, err := time.Parse(time.RFC3339Nano, sec.Annotations[AnnotationBundleInjectedAt]); err == nil {
		st.injectedAt = t
	}
	return st
}

func (st secretState) data() map[string][]byte {
	d := map[string][]byte{
		KeyCABundle:    st.bundle,
		KeySigningCert: st.signing.CertPEM,
		KeySigningKey:  st.signing.KeyPEM,
		KeyServingCert: st.serving.CertPEM,
		KeyServingKey:  st.serving.KeyPEM,
	}
	if len(st.next.CertPEM) > 0 {
		d[KeyNextCert], d[KeyNextKey] = st.next.CertPEM, st.next.KeyPEM
	}
	return d
}

func sameData(a, b map[string][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || !bytes.Equal(v, w) {
			return false
		}
	}
	return true
}

// action is one step plan took, for the log.
type action struct {
	msg, reason, detail string
}

// plan decides the Secret's next content from its current content at now.
// trusted reports whether every webhook configuration's caBundle holds a CA
// at this moment.
func (s *SelfManaged) plan(cur secretState, trusted func(*x509.Certificate) bool, now time.Time) (secretState, []action, error) {
	next := cur
	var did []action

	signingCert, _, err := cur.signing.parse()
	caReason, caMsg, caDue := caRenewal.evaluate(renewalInput{Cert: signingCert, Now: now})
	if err != nil {
		signingCert, caReason, caMsg, caDue = nil, ReasonMissing, "there is no readable signing CA", true
	}
	nextCert, _, nextErr := cur.next.parse()
	switch {
	case caDue && caReason != ReasonRenewalDue:
		// Nothing signed by an expired CA works any more, and a missing one
		// means a new (or emptied) Secret: there is no trust to preserve, the
		// new CA signs at once.
		ca, err := NewCA(now, s.CALife)
		if err != nil {
			return cur, nil, err
		}
		next.signing, next.next = ca, KeyPair{}
		signingCert, nextCert = mustParse(ca), nil
		did = append(did, action{"issued a new signing CA", caReason, caMsg})
	case nextErr == nil:
		// A CA waits to take over: it does once the bundle holding it has
		// been injected for the propagation delay and is there now.
		injected := cur.injectedHash == fingerprint(cur.bundle) && !cur.injectedAt.IsZero()
		if injected && !now.Before(cur.injectedAt.Add(s.PropagationDelay)) && trusted(nextCert) {
			next.signing, next.next = cur.next, KeyPair{}
			signingCert, nextCert = nextCert, nil
			did = append(did, action{"the next CA takes over signing", ReasonRenewalDue,
				fmt.Sprintf("its bundle was injected at %s", cur.injectedAt.UTC().Format(time.RFC3339Nano))})
		}
	case caDue:
		ca, err := NewCA(now, s.CALife)
		if err != nil {
			return cur, nil, err
		}
		next.next = ca
		nextCert = mustParse(ca)
		did = append(did, action{"issued the next CA; it signs once the API server trusts it", caReason, caMsg})
	}
	if nextCert == nil {
		next.next = KeyPair{}
	}

	leaf := servingCert(cur.serving)
	reason, msg, due := servingRenewal.evaluate(renewalInput{Cert: leaf, DNSNames: s.DNSNames, IPs: s.IPAddresses, Now: now})
	if !due && leaf.CheckSignatureFrom(signingCert) != nil {
		reason, msg, due = ReasonNotSignedByCA, fmt.Sprintf("it was signed by %q, the signing CA is %s", leaf.Issuer.CommonName, Describe(signingCert)), true
	}
	if due {
		kp, err := NewServing(next.signing, s.DNSNames, s.IPAddresses, now, s.LeafLife)
		if err != nil {
			return cur, nil, err
		}
		next.serving = kp
		did = append(did, action{"issued a new serving certificate", reason, msg})
	}
	next.bundle = composeBundle(now, cur.bundle, signingCert, nextCert)
	return next, did, nil
}

// servingCert is the serving certificate when it is readable and matches its
// key, nil otherwise.
func servingCert(kp KeyPair) *x509.Certificate {
	if _, err := tls.X509KeyPair(kp.CertPEM, kp.KeyPEM); err != nil {
		return nil
	}
	c, err := ParseCertificate(kp.CertPEM)
	if err != nil {
		return nil
	}
	return c
}

func mustParse(kp KeyPair) *x509.Certificate {
	c, err := ParseCertificate(kp.CertPEM)
	if err != nil {
		panic(fmt.Sprintf("a certificate just issued does not parse: %v", err))
	}
	return c
}

// Sync makes one step towards a fresh certificate: read the Secret and the
// webhook configurations, rotate what is due, write the Secret (losing a race
// to another replica is fine: its result is used on the next sync), write the
// files, inject the bundle, and record the injection.
func (s *SelfManaged) Sync(ctx context.Context) error {
	s.defaults()
	ctx, cancel := context.WithTimeout(ctx, s.PropagationDelay/2)
	defer cancel()
	log := ctrl.LoggerFrom(ctx).WithName("certs")
	now := s.Clock.Now()
	key := types.NamespacedName{Namespace: s.Namespace, Name: s.SecretName}

	sec := &corev1.Secret{}
	err := s.Client.Get(ctx, key, sec)
	exists := err == nil
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("reading Secret %s: %w", key, err)
	}
	hooks, err := s.configurations(ctx)
	if err != nil {
		return err
	}
	cur := stateOf(sec)
	next, did, err := s.plan(cur, hooks.trust, now)
	if err != nil {
		return err
	}
	if data := next.data(); !sameData(sec.Data, data) {
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
			return fmt.Errorf("another replica updated Secret %s first; its certificate is used on the next sync: %w", key, err)
		}
		if err != nil {
			return fmt.Errorf("writing Secret %s: %w", key, err)
		}
		for _, a := range did {
			log.Info(a.msg, "reason", a.reason, "detail", a.detail, "secret", key.String())
		}
	}
	if _, err := WriteAtomic(s.CertDir, map[string][]byte{KeyServingCert: next.serving.CertPEM, KeyServingKey: next.serving.KeyPEM}); err != nil {
		return err
	}
	patched, err := hooks.inject(ctx, s.Client, next.bundle)
	if err != nil {
		return err
	}
	hash := fingerprint(next.bundle)
	if !patched && sec.Annotations[AnnotationBundleSHA256] == hash {
		return nil
	}
	// Record when this bundle reached the configurations; a lost race only
	// delays the next CA's takeover.
	if sec.Annotations == nil {
		sec.Annotations = map[string]string{}
	}
	sec.Annotations[AnnotationBundleSHA256] = hash
	sec.Annotations[AnnotationBundleInjectedAt] = s.Clock.Now().UTC().Format(time.RFC3339Nano)
	if err := s.Client.Update(ctx, sec); err != nil && !apierrors.IsConflict(err) {
		return fmt.Errorf("recording the injection in Secret %s: %w", key, err)
	}
	return nil
}

// configurations are the guard's webhook configurations that exist; a missing
// one gets the bundle on a later sync, once it is created.
type configurations []client.Object

func (s *SelfManaged) configurations(ctx context.Context) (configurations, error) {
	var out configurations
	for _, obj := range []client.Object{
		named(&admissionregistrationv1.MutatingWebhookConfiguration{}, s.MutatingName),
		named(&admissionregistrationv1.ValidatingWebhookConfiguration{}, s.ValidatingName),
	} {
		if obj.GetName() == "" {
			continue
		}
		if err := s.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return nil, fmt.Errorf("reading %s %s: %w", kindOf(obj), obj.GetName(), err)
		}
		out = append(out, obj)
	}
	return out, nil
}

func named(obj client.Object, name string) client.Object {
	obj.SetName(name)
	return obj
}

// trust reports whether every webhook of every configuration trusts ca.
func (cs configurations) trust(ca *x509.Certificate) bool {
	for _, obj := range cs {
		for _, b := range caBundles(obj) {
			if !bundleHolds(*b, ca) {
				return false
			}
		}
	}
	return true
}

// inject writes bundle into every webhook of the configurations, patching
// under an optimistic lock those where anything changed; it reports whether it
// patched any.
func (cs configurations) inject(ctx context.Context, c client.Client, bundle []byte) (bool, error) {
	patched := false
	for _, obj := range cs {
		before := obj.DeepCopyObject().(client.Object)
		changed := false
		for _, b := range caBundles(obj) {
			if !bytes.Equal(*b, bundle) {
				*b = bundle
				changed = true
			}
		}
		if !changed {
			continue
		}
		if err := c.Patch(ctx, obj, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
			return patched, fmt.Errorf("injecting the CA bundle into %s %s: %w", kindOf(obj), obj.GetName(), err)
		}
		patched = true
	}
	return patched, nil
}

// caBundles points at the caBundle of every webhook of a configuration.
func caBundles(obj client.Object) []*[]byte {
	var out []*[]byte
	switch o := obj.(type) {
	case *admissionregistrationv1.MutatingWebhookConfiguration:
		for i := range o.Webhooks {
			out = append(out, &o.Webhooks[i].ClientConfig.CABundle)
		}
	case *admissionregistrationv1.ValidatingWebhookConfiguration:
		for i := range o.Webhooks {
			out = append(out, &o.Webhooks[i].ClientConfig.CABundle)
		}
	}
	return out
}

func kindOf(obj client.Object) string {
	switch obj.(type) {
	case *admissionregistrationv1.MutatingWebhookConfiguration:
		return "MutatingWebhookConfiguration"
	case *admissionregistrationv1.ValidatingWebhookConfiguration:
		return "ValidatingWebhookConfiguration"
	}
	return fmt.Sprintf("%T", obj)
}
