package certs

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// FuzzPEM feeds the PEM parsing arbitrary bytes, where a Secret's tls.crt or
// tls.key, a caBundle of a webhook configuration, or cert-manager's ca.crt
// enter the guard: parse errors say something and never panic; a bundle that
// parses composes into one that parses to the same certificates still valid;
// verification of anything against anything answers with an error or nil.
func FuzzPEM(f *testing.F) {
	ca, err := NewCA(t0, 24*time.Hour)
	require.NoError(f, err)
	serving, err := NewServing(ca, []string{"deployguard.deployguard-system.svc"}, nil, t0, time.Hour)
	require.NoError(f, err)
	f.Add(ca.CertPEM, ca.KeyPEM)
	f.Add(serving.CertPEM, serving.KeyPEM)
	f.Add(append(append([]byte{}, serving.CertPEM...), ca.CertPEM...), ca.CertPEM)
	f.Add([]byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"), []byte("-----BEGIN PRIVATE KEY-----\nMAA=\n-----END PRIVATE KEY-----\n"))
	f.Add([]byte("-----BEGIN RSA PRIVATE KEY-----\n-----END RSA PRIVATE KEY-----\n"), []byte{})
	f.Add([]byte("not PEM"), []byte("-----BEGIN CERTIFICATE-----"))
	now := t0.Add(time.Minute)
	f.Fuzz(func(t *testing.T, certPEM, otherPEM []byte) {
		cs, err := ParseBundle(certPEM)
		if err != nil {
			assert.NotEmpty(t, err.Error())
		} else {
			require.NotEmpty(t, cs)
			for _, c := range cs {
				assert.NotEmpty(t, Describe(c))
			}
			composed := composeBundle(now, certPEM)
			var valid int
			for _, c := range cs {
				if !now.After(c.NotAfter) {
					valid++
					assert.True(t, bundleHolds(composed, c), "a valid CA of the old bundle is kept")
				}
			}
			if valid > 0 {
				again, err := ParseBundle(composed)
				require.NoError(t, err)
				assert.LessOrEqual(t, len(again), valid, "composed without repeats")
			}
		}
		if err := Verify(certPEM, otherPEM, []string{"deployguard.deployguard-system.svc", "127.0.0.1"}, now); err != nil {
			assert.NotEmpty(t, err.Error())
		}
		if _, _, err := (KeyPair{CertPEM: certPEM, KeyPEM: otherPEM}).parse(); err != nil {
			assert.NotEmpty(t, err.Error())
		}
	})
}
