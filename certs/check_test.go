package certs

import (
	"bytes"
	"context"
	"crypto/x509"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cmapi "github.com/cert-manager/cert-manager/pkg/apis/certmanager/v1"
	cmmeta "github.com/cert-manager/cert-manager/pkg/apis/meta/v1"
)

func withBundle(objs []client.Object, bundle []byte, annotations map[string]string) []client.Object {
	for _, o := range objs {
		o.SetAnnotations(annotations)
		for _, b := range caBundles(o) {
			*b = bundle
		}
	}
	return objs
}

func serviceConfigurations(bundle []byte) []client.Object {
	objs := webhookConfigurations("")
	for _, o := range objs {
		for _, b := range caBundles(o) {
			*b = bundle
		}
	}
	svc := admissionregistrationv1.WebhookClientConfig{
		Service:  &admissionregistrationv1.ServiceReference{Name: "deployguard-webhook", Namespace: testNS},
		CABundle: bundle,
	}
	objs[0].(*admissionregistrationv1.MutatingWebhookConfiguration).Webhooks[0].ClientConfig = svc
	objs[1].(*admissionregistrationv1.ValidatingWebhookConfiguration).Webhooks[0].ClientConfig = svc
	return objs
}

func TestServingCheck(t *testing.T) {
	ca, caCert := caAt(t, t0, 10*time.Hour)
	other, otherCert := caAt(t, t0, 10*time.Hour)
	leafKP, _ := leafAt(t, ca, t0, time.Hour, []string{"localhost", "deployguard-webhook.deployguard-system.svc"}, []net.IP{net.ParseIP("127.0.0.1")})
	leaf := mustParse(leafKP)
	_, localOnly := leafAt(t, ca, t0, time.Hour, []string{"localhost"}, nil)
	_, foreign := leafAt(t, other, t0, time.Hour, []string{"localhost"}, []net.IP{net.ParseIP("127.0.0.1")})
	url := "https://127.0.0.1:9443/validate"

	tests := []struct {
		name     string
		objs     []client.Object
		served   *x509.Certificate
		now      time.Time
		contains []string
	}{
		{name: "served certificate chains to both bundles (URL)", objs: withBundle(webhookConfigurations(url), pemOf(caCert), nil), served: leaf, now: t0.Add(time.Minute)},
		{name: "served certificate chains to both bundles (Service)", objs: serviceConfigurations(pemOf(caCert)), served: leaf, now: t0.Add(time.Minute)},
		{name: "bundle during a CA rotation", objs: withBundle(webhookConfigurations(url), pemOf(otherCert, caCert), nil), served: leaf, now: t0.Add(time.Minute)},
		{name: "wrong CA in the bundle", objs: withBundle(webhookConfigurations(url), pemOf(otherCert), nil), served: leaf, now: t0.Add(time.Minute),
			contains: []string{
				"webhook default.deployments.deployguard.io of MutatingWebhookConfiguration deployguard-mutating",
				"webhook validate.deployments.deployguard.io of ValidatingWebhookConfiguration deployguard-validating",
				"does not chain to the CA bundle", "which the bundle does not hold", "serial " + shortHex(leaf.SerialNumber.Bytes()),
			}},
		{name: "served by a CA nobody trusts", objs: withBundle(webhookConfigurations(url), pemOf(caCert), nil), served: foreign, now: t0.Add(time.Minute),
			contains: []string{"does not chain"}},
		{name: "no caBundle yet", objs: withBundle(webhookConfigurations(url), nil, nil), served: leaf, now: t0,
			contains: []string{"has no caBundle"}},
		{name: "expired", objs: withBundle(webhookConfigurations(url), pemOf(caCert), nil), served: leaf, now: t0.Add(2 * time.Hour),
			contains: []string{"it expired at"}},
		{name: "the Service name is not in the certificate", objs: serviceConfigurations(pemOf(caCert)), served: localOnly, now: t0.Add(time.Minute),
			contains: []string{`is not valid for "deployguard-webhook.deployguard-system.svc"`}},
		{name: "configuration missing", objs: nil, served: leaf, now: t0,
			contains: []string{"MutatingWebhookConfiguration deployguard-mutating does not exist"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var logged bytes.Buffer
			cl := newFakeClient(tt.objs...)
			c := &ServingCheck{
				Configurations: cl,
				Client:         cl,
				Served:         func(context.Context) (*x509.Certificate, error) { return tt.served, nil },
				MutatingName:   "deployguard-mutating",
				ValidatingName: "deployguard-validating",
				Clock:          clocktesting.NewFakeClock(tt.now),
				Log:            funcr.New(func(prefix, args string) { logged.WriteString(args + "\n") }, funcr.Options{}),
			}
			err := c.Check(&http.Request{})
			if len(tt.contains) == 0 {
				assert.NoError(t, err)
				assert.Empty(t, logged.String(), "nothing to say while it matches")
				return
			}
			require.Error(t, err)
			for _, s := range tt.contains {
				assert.Contains(t, err.Error(), s)
			}
			assert.Contains(t, logged.String(), "not ready", "a mismatch is logged")
			logged.Reset()
			require.Error(t, c.Check(&http.Request{}))
			assert.Empty(t, logged.String(), "the same mismatch is logged once")
		})
	}
}

// On the cert-manager path the message says what cert-manager holds.
func TestServingCheckDescribesCertManager(t *testing.T) {
	ca, caCert := caAt(t, t0, 10*time.Hour)
	_, staleCACert := caAt(t, t0, 10*time.Hour)
	oldKP, _ := leafAt(t, ca, t0, time.Hour, []string{"localhost"}, []net.IP{net.ParseIP("127.0.0.1")})
	newKP, _ := leafAt(t, ca, t0.Add(time.Minute), time.Hour, []string{"localhost"}, []net.IP{net.ParseIP("127.0.0.1")})
	revision := 3
	crt := &cmapi.Certificate{
		ObjectMeta: metav1.ObjectMeta{Name: "deployguard-webhook-tls", Namespace: testNS},
		Spec:       cmapi.CertificateSpec{SecretName: "deployguard-webhook-tls"},
		Status: cmapi.CertificateStatus{Revision: &revision, Conditions: []cmapi.CertificateCondition{
			{Type: cmapi.CertificateConditionReady, Status: cmmeta.ConditionFalse, Reason: "Expired", Message: "Certificate expired"},
			{Type: cmapi.CertificateConditionIssuing, Status: cmmeta.ConditionTrue, Reason: "ManuallyTriggered"},
		}},
	}
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "deployguard-webhook-tls", Namespace: testNS},
		Data: map[string][]byte{corev1.TLSCertKey: newKP.CertPEM, corev1.TLSPrivateKeyKey: newKP.KeyPEM, cmmeta.TLSCAKey: pemOf(caCert)}}
	objs := withBundle(webhookConfigurations("https://127.0.0.1:9443/validate"), pemOf(staleCACert),
		map[string]string{AnnotationInjectCAFrom: testNS + "/deployguard-webhook-tls"})
	cl := newFakeClient(append(objs, crt, sec)...)
	c := &ServingCheck{
		Configurations: cl,
		Client:         cl,
		Served:         func(context.Context) (*x509.Certificate, error) { return mustParse(oldKP), nil },
		MutatingName:   "deployguard-mutating",
		ValidatingName: "deployguard-validating",
		Clock:          clocktesting.NewFakeClock(t0.Add(2 * time.Minute)),
		Log:            funcr.New(func(string, string) {}, funcr.Options{}),
	}
	err := c.Check(&http.Request{})
	require.Error(t, err)
	for _, s := range []string{
		"cert-manager Certificate deployguard-system/deployguard-webhook-tls is not Ready (Expired: Certificate expired)",
		"is being issued (ManuallyTriggered)", "revision 3",
		"holds " + Describe(mustParse(newKP)) + " but the guard serves " + Describe(mustParse(oldKP)),
		"cainjector injects its ca.crt [" + Describe(caCert) + "]",
	} {
		assert.Contains(t, err.Error(), s)
	}
}

func TestParseInjectCAFrom(t *testing.T) {
	tests := []struct {
		in   string
		want string
		ok   bool
	}{
		{in: "deployguard-system/deployguard-webhook-tls", want: "deployguard-system/deployguard-webhook-tls", ok: true},
		{in: "deployguard-webhook-tls"},
		{in: "/name"},
		{in: "ns/"},
		{in: "a/b/c"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseInjectCAFrom(tt.in)
			if !tt.ok {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got.String())
		})
	}
}

func TestCertificateReady(t *testing.T) {
	ready, why := CertificateReady(&cmapi.Certificate{})
	assert.False(t, ready)
	assert.Equal(t, "no Ready condition yet", why)
	ready, _ = CertificateReady(&cmapi.Certificate{Status: cmapi.CertificateStatus{Conditions: []cmapi.CertificateCondition{
		{Type: cmapi.CertificateConditionReady, Status: cmmeta.ConditionTrue}}}})
	assert.True(t, ready)
}
