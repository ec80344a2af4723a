package certs

import (
	"crypto/x509"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// leafAt issues a serving certificate of life validity at issued, for names.
func leafAt(t *testing.T, ca KeyPair, issued time.Time, validity time.Duration, names []string, ips []net.IP) (KeyPair, *x509.Certificate) {
	t.Helper()
	kp, err := NewServing(ca, names, ips, issued, validity)
	require.NoError(t, err)
	return kp, mustParse(kp)
}

func caAt(t *testing.T, issued time.Time, validity time.Duration) (KeyPair, *x509.Certificate) {
	t.Helper()
	kp, err := NewCA(issued, validity)
	require.NoError(t, err)
	return kp, mustParse(kp)
}

func TestServingRenewal(t *testing.T) {
	ca, _ := caAt(t, t0, 1000*time.Hour)
	// NotBefore is one minute before issue (clock skew), so the life is 91m and
	// two thirds of it pass at t0+59m40s.
	_, leaf := leafAt(t, ca, t0, 90*time.Minute, []string{"a.svc"}, []net.IP{net.ParseIP("127.0.0.1")})
	due := t0.Add(-time.Minute).Add(91 * time.Minute * 2 / 3)

	tests := []struct {
		name   string
		cert   *x509.Certificate
		dns    []string
		ips    []net.IP
		now    time.Time
		reason string
	}{
		{name: "fresh certificate is kept", cert: leaf, dns: []string{"a.svc"}, now: t0.Add(time.Minute)},
		{name: "just before two thirds of its life it is kept", cert: leaf, now: due.Add(-time.Second)},
		{name: "at two thirds of its life it is renewed", cert: leaf, now: due, reason: ReasonRenewalDue},
		{name: "expired certificate is renewed", cert: leaf, now: t0.Add(2 * time.Hour), reason: ReasonExpired},
		{name: "missing certificate is issued", cert: nil, now: t0, reason: ReasonMissing},
		{name: "a DNS name it lacks renews it", cert: leaf, dns: []string{"a.svc", "b.svc"}, now: t0, reason: ReasonDNSNameMissing},
		{name: "an IP address it lacks renews it", cert: leaf, ips: []net.IP{net.ParseIP("10.0.0.1")}, now: t0, reason: ReasonIPAddressMissing},
		{name: "an IP address it has keeps it", cert: leaf, ips: []net.IP{net.ParseIP("127.0.0.1")}, now: t0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reason, msg, isDue := servingRenewal.evaluate(renewalInput{Cert: tt.cert, DNSNames: tt.dns, IPs: tt.ips, Now: tt.now})
			assert.Equal(t, tt.reason, reason)
			assert.Equal(t, tt.reason != "", isDue)
			if isDue {
				assert.NotEmpty(t, msg, "a renewal says why")
			}
		})
	}
}

func TestCARenewalIgnoresNames(t *testing.T) {
	_, ca := caAt(t, t0, 3*time.Hour)
	reason, _, due := caRenewal.evaluate(renewalInput{Cert: ca, DNSNames: []string{"not-in-a-ca"}, Now: t0.Add(time.Hour)})
	assert.False(t, due, reason)
	reason, _, due = caRenewal.evaluate(renewalInput{Cert: ca, Now: t0.Add(2 * time.Hour)})
	assert.True(t, due)
	assert.Equal(t, ReasonRenewalDue, reason)
}

func TestExpiryWarning(t *testing.T) {
	ca, _ := caAt(t, t0, 1000*time.Hour)
	_, leaf := leafAt(t, ca, t0.Add(time.Minute), 99*time.Minute, nil, nil) // life 100m from t0
	tests := []struct {
		name     string
		now      time.Time
		warn     bool
		contains string
	}{
		{name: "half its life left", now: t0.Add(50 * time.Minute)},
		{name: "renewal just due (a third left)", now: t0.Add(67 * time.Minute)},
		{name: "29% left: not rotated in time", now: t0.Add(71 * time.Minute), warn: true, contains: "29% of its life left"},
		{name: "expired", now: t0.Add(101 * time.Minute), warn: true, contains: "has expired"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg, warn := expiryWarning(leaf, tt.now)
			assert.Equal(t, tt.warn, warn, msg)
			assert.Contains(t, msg, tt.contains)
		})
	}
}
