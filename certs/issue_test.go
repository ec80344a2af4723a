package certs

import (
	"crypto/x509"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func pemOf(cs ...*x509.Certificate) []byte {
	return composeBundle(time.Time{}, nil, cs...)
}

func serials(t *testing.T, bundle []byte) []string {
	t.Helper()
	cs, err := ParseBundle(bundle)
	require.NoError(t, err)
	var out []string
	for _, c := range cs {
		out = append(out, c.SerialNumber.String())
	}
	return out
}

func TestComposeBundle(t *testing.T) {
	_, oldCA := caAt(t, t0, 2*time.Hour)
	_, curCA := caAt(t, t0.Add(time.Hour), 10*time.Hour)
	_, nextCA := caAt(t, t0.Add(2*time.Hour), 10*time.Hour)
	s := func(cs ...*x509.Certificate) []string {
		var out []string
		for _, c := range cs {
			out = append(out, c.SerialNumber.String())
		}
		return out
	}
	tests := []struct {
		name  string
		now   time.Time
		old   []byte
		inUse []*x509.Certificate
		want  []string
	}{
		{name: "first CA alone", now: t0, inUse: []*x509.Certificate{curCA}, want: s(curCA)},
		{name: "a replaced CA stays while it is valid", now: t0.Add(90 * time.Minute), old: pemOf(oldCA), inUse: []*x509.Certificate{curCA}, want: s(curCA, oldCA)},
		{name: "a replaced CA goes once it expired", now: t0.Add(3 * time.Hour), old: pemOf(oldCA, curCA), inUse: []*x509.Certificate{curCA}, want: s(curCA)},
		{name: "the next CA is trusted before it signs", now: t0.Add(2 * time.Hour), old: pemOf(curCA), inUse: []*x509.Certificate{curCA, nextCA}, want: s(curCA, nextCA)},
		{name: "no CA is listed twice", now: t0.Add(time.Hour), old: pemOf(curCA, oldCA, curCA), inUse: []*x509.Certificate{curCA, nil}, want: s(curCA, oldCA)},
		{name: "an unreadable old bundle is replaced", now: t0.Add(time.Hour), old: []byte("garbage"), inUse: []*x509.Certificate{curCA}, want: s(curCA)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := composeBundle(tt.now, tt.old, tt.inUse...)
			assert.Equal(t, tt.want, serials(t, got))
		})
	}
}

func TestVerifyMessages(t *testing.T) {
	ca, caCert := caAt(t, t0, 10*time.Hour)
	other, _ := caAt(t, t0, 10*time.Hour)
	leaf, _ := leafAt(t, ca, t0, time.Hour, []string{"deployguard-webhook.deployguard-system.svc"}, []net.IP{net.ParseIP("127.0.0.1")})
	foreign, _ := leafAt(t, other, t0, time.Hour, []string{"deployguard-webhook.deployguard-system.svc"}, nil)
	bundle := pemOf(caCert)

	tests := []struct {
		name     string
		serving  []byte
		bundle   []byte
		hosts    []string
		now      time.Time
		contains []string
	}{
		{name: "chains and names the host", serving: leaf.CertPEM, bundle: bundle, hosts: []string{"deployguard-webhook.deployguard-system.svc", "127.0.0.1"}, now: t0.Add(time.Minute)},
		{name: "signed by a CA the bundle lacks", serving: foreign.CertPEM, bundle: bundle, now: t0.Add(time.Minute),
			contains: []string{"does not chain to the CA bundle", `signed by "deployguard-webhook-ca"`, "which the bundle does not hold", "serial"}},
		{name: "expired", serving: leaf.CertPEM, bundle: bundle, now: t0.Add(2 * time.Hour), contains: []string{"it expired at 2030-01-01T01:00:00Z"}},
		{name: "not valid yet", serving: leaf.CertPEM, bundle: bundle, now: t0.Add(-time.Hour), contains: []string{"not valid before 2029-12-31T23:59:00Z"}},
		{name: "wrong host", serving: leaf.CertPEM, bundle: bundle, hosts: []string{"other.svc"}, now: t0.Add(time.Minute),
			contains: []string{`is not valid for "other.svc"`, "deployguard-webhook.deployguard-system.svc, 127.0.0.1"}},
		{name: "empty bundle", serving: leaf.CertPEM, bundle: nil, now: t0, contains: []string{"CA bundle: no PEM certificate found"}},
		{name: "no serving certificate", serving: nil, bundle: bundle, now: t0, contains: []string{"serving certificate: no PEM certificate found"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Verify(tt.serving, tt.bundle, tt.hosts, tt.now)
			if len(tt.contains) == 0 {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			for _, c := range tt.contains {
				assert.Contains(t, err.Error(), c)
			}
		})
	}
}

func TestNewServingNeverOutlivesItsCA(t *testing.T) {
	ca, caCert := caAt(t, t0, time.Hour)
	_, leaf := leafAt(t, ca, t0.Add(30*time.Minute), 24*time.Hour, []string{"a"}, nil)
	assert.Equal(t, caCert.NotAfter, leaf.NotAfter)
}
