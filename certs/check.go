package certs

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ServedCertificate returns the certificate the webhook server presents now.
type ServedCertificate func(ctx context.Context) (*x509.Certificate, error)

// DialServed returns the leaf certificate a TLS handshake with addr presents,
// asking for serverName: exactly what the API server receives.
func DialServed(addr, serverName string) ServedCertificate {
	return func(ctx context.Context) (*x509.Certificate, error) {
		d := &tls.Dialer{
			NetDialer: &net.Dialer{Timeout: 5 * time.Second},
			// The chain is checked against the injected CA bundles by the
			// caller; the handshake only fetches what the server presents.
			Config: &tls.Config{InsecureSkipVerify: true, ServerName: serverName, MinVersion: tls.VersionTLS12}, //nolint:gosec // verified by the caller
		}
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("the webhook server at %s does not answer a TLS handshake: %w", addr, err)
		}
		defer conn.Close()
		peer := conn.(*tls.Conn).ConnectionState().PeerCertificates
		if len(peer) == 0 {
			return nil, fmt.Errorf("the webhook server at %s presents no certificate", addr)
		}
		return peer[0], nil
	}
}

// ServingCheck is a readiness check: the certificate the webhook server
// serves must be valid now, chain to the caBundle of every webhook of the
// guard's configurations (what the API server trusts when it calls them), and
// name the host the API server dials. A mismatch is logged once, saying what
// differs, and when the guard's certificate comes from cert-manager (the
// configuration carries cert-manager.io/inject-ca-from) what cert-manager's
// Certificate and Secret hold.
type ServingCheck struct {
	// Configurations reads the webhook configurations; the manager's cached
	// client, so that a probe costs no API call but a local TLS handshake.
	Configurations client.Reader
	// Client reads cert-manager's Certificate and its Secret when a mismatch
	// is explained; uncached.
	Client         client.Reader
	Served         ServedCertificate
	MutatingName   string
	ValidatingName string
	Clock          clock.PassiveClock
	Log            logr.Logger
	// MissingBundle, when set, is called when a webhook has no caBundle at
	// all, as an entry added by an upgrade has until it is injected: the
	// self-managed injector (SelfManaged.Kick) then injects at once rather
	// than at its next period, while every replica reads as not ready.
	MissingBundle func()

	mu   sync.Mutex
	last string
}

// Check implements a controller-runtime healthz.Checker.
func (c *ServingCheck) Check(req *http.Request) error {
	ctx, cancel := context.WithTimeout(req.Context(), 5*time.Second)
	defer cancel()
	err := c.check(ctx)
	c.report(err)
	return err
}

func (c *ServingCheck) report(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	switch {
	case msg == c.last:
	case err != nil:
		c.Log.Error(err, "the served certificate is not what the API server trusts for the guard's webhooks: not ready")
	default:
		c.Log.Info("the served certificate matches the CA bundle the API server holds for the guard's webhooks")
	}
	c.last = msg
}

// target is one webhook as the API server calls it.
type target struct {
	kind, config, webhook string
	caBundle              []byte
	host                  string
	injectFrom            string
}

func (c *ServingCheck) check(ctx context.Context) error {
	leaf, err := c.Served(ctx)
	if err != nil {
		return err
	}
	targets, err := c.targets(ctx)
	if err != nil {
		return err
	}
	if c.MissingBundle != nil && slices.ContainsFunc(targets, func(t target) bool { return len(t.caBundle) == 0 }) {
		c.MissingBundle()
	}
	now := c.now()
	var problems []string
	injectFrom := ""
	for _, t := range targets {
		if p := verifyTarget(leaf, t, now); p != "" && !slices.Contains(problems, p) {
			problems = append(problems, p)
			if t.injectFrom != "" {
				injectFrom = t.injectFrom
			}
		}
	}
	if len(problems) == 0 {
		return nil
	}
	if injectFrom != "" {
		problems = append(problems, describeCertManager(ctx, c.Client, injectFrom, leaf))
	}
	return errors.New(strings.Join(problems, "; "))
}

func (c *ServingCheck) now() time.Time {
	if c.Clock == nil {
		return time.Now()
	}
	return c.Clock.Now()
}

// verifyTarget says what is wrong with serving leaf to t, "" when nothing.
func verifyTarget(leaf *x509.Certificate, t target, now time.Time) string {
	where := fmt.Sprintf("webhook %s of %s %s", t.webhook, t.kind, t.config)
	if len(t.caBundle) == 0 {
		return where + " has no caBundle: the API server cannot trust the guard yet"
	}
	cas, err := ParseBundle(t.caBundle)
	if err != nil {
		return fmt.Sprintf("%s has an unreadable caBundle: %v", where, err)
	}
	var hosts []string
	if t.host != "" {
		hosts = []string{t.host}
	}
	if err := verifyLeaf(leaf, cas, hosts, now); err != nil {
		return fmt.Sprintf("%s: %v", where, err)
	}
	return ""
}

// targets reads the guard's webhook configurations, mutating then validating.
func (c *ServingCheck) targets(ctx context.Context) ([]target, error) {
	var out []target
	for _, obj := range []client.Object{
		named(&admissionregistrationv1.MutatingWebhookConfiguration{}, c.MutatingName),
		named(&admissionregistrationv1.ValidatingWebhookConfiguration{}, c.ValidatingName),
	} {
		if obj.GetName() == "" {
			continue
		}
		if err := c.get(ctx, obj.GetName(), obj); err != nil {
			return nil, err
		}
		out = append(out, targetsOf(obj)...)
	}
	return out, nil
}

// targetsOf is every webhook of a configuration, as a target.
func targetsOf(obj client.Object) []target {
	var out []target
	add := func(webhook string, cc admissionregistrationv1.WebhookClientConfig) {
		out = append(out, targetOf(kindOf(obj), obj.GetName(), webhook, cc, obj.GetAnnotations()[AnnotationInjectCAFrom]))
	}
	switch o := obj.(type) {
	case *admissionregistrationv1.MutatingWebhookConfiguration:
		for _, w := range o.Webhooks {
			add(w.Name, w.ClientConfig)
		}
	case *admissionregistrationv1.ValidatingWebhookConfiguration:
		for _, w := range o.Webhooks {
			add(w.Name, w.ClientConfig)
		}
	}
	return out
}

func (c *ServingCheck) get(ctx context.Context, name string, obj client.Object) error {
	err := c.Configurations.Get(ctx, client.ObjectKey{Name: name}, obj)
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("%s %s does not exist: the API server does not call the guard", kindOf(obj), name)
	}
	if err != nil {
		return fmt.Errorf("reading %s %s: %w", kindOf(obj), name, err)
	}
	return nil
}

// targetOf is a webhook with the host name the API server checks the
// certificate against: the Service's DNS name, or the URL's host.
func targetOf(kind, config, webhook string, cc admissionregistrationv1.WebhookClientConfig, injectFrom string) target {
	t := target{kind: kind, config: config, webhook: webhook, caBundle: cc.CABundle, injectFrom: injectFrom}
	switch {
	case cc.Service != nil:
		t.host = cc.Service.Name + "." + cc.Service.Namespace + ".svc"
	case cc.URL != nil:
		if u, err := url.Parse(*cc.URL); err == nil {
			t.host = u.Hostname()
		}
	}
	return t
}
