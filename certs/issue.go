// Package certs decides where the webhook server's certificate comes from: files
// mounted from a Secret that cert-manager issues, or a CA and serving
// certificate that the guard issues for itself, stores in a Secret, and injects
// into its own webhook configurations.
package certs

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"slices"
	"time"
)

// KeyPair is a PEM certificate and its PEM private key.
type KeyPair struct {
	CertPEM []byte
	KeyPEM  []byte
}

// NewCA issues a self-signed CA valid from now for validity.
func NewCA(now time.Time, validity time.Duration) (KeyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return KeyPair{}, fmt.Errorf("generating the CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "deployguard-webhook-ca", Organization: []string{"deployguard.io"}},
		NotBefore:             now.Add(-time.Minute), // tolerate small clock skew
		NotAfter:              now.Add(validity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return KeyPair{}, fmt.Errorf("signing the CA certificate: %w", err)
	}
	return encode(der, key)
}

// NewServing issues a serving certificate for dnsNames and ips, signed by ca.
func NewServing(ca KeyPair, dnsNames []string, ips []net.IP, now time.Time, validity time.Duration) (KeyPair, error) {
	caCert, caKey, err := ca.parse()
	if err != nil {
		return KeyPair{}, fmt.Errorf("reading the CA: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return KeyPair{}, fmt.Errorf("generating the serving key: %w", err)
	}
	cn := "deployguard-webhook"
	if len(dnsNames) > 0 {
		cn = dnsNames[0]
	}
	notAfter := now.Add(validity)
	if notAfter.After(caCert.NotAfter) {
		notAfter = caCert.NotAfter // never outlive the CA that vouches for it
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: cn},
		DNSNames:     dnsNames,
		IPAddresses:  ips,
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return KeyPair{}, fmt.Errorf("signing the serving certificate: %w", err)
	}
	return encode(der, key)
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return big.NewInt(time.Now().UnixNano())
	}
	return n
}

func encode(der []byte, key *ecdsa.PrivateKey) (KeyPair, error) {
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return KeyPair{}, fmt.Errorf("encoding the key: %w", err)
	}
	return KeyPair{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}),
	}, nil
}

func (k KeyPair) parse() (*x509.Certificate, any, error) {
	cert, err := ParseCertificate(k.CertPEM)
	if err != nil {
		return nil, nil, err
	}
	b, _ := pem.Decode(k.KeyPEM)
	if b == nil {
		return nil, nil, errors.New("no PEM private key")
	}
	if key, err := x509.ParseECPrivateKey(b.Bytes); err == nil {
		return cert, key, nil
	}
	key, err := x509.ParsePKCS8PrivateKey(b.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("parsing the private key: %w", err)
	}
	return cert, key, nil
}

// ParseCertificate returns the first certificate of a PEM bundle.
func ParseCertificate(p []byte) (*x509.Certificate, error) {
	certs, err := ParseBundle(p)
	if err != nil {
		return nil, err
	}
	return certs[0], nil
}

// ParseBundle returns every certificate of a PEM bundle.
func ParseBundle(p []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var b *pem.Block
		b, p = pem.Decode(p)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parsing a certificate: %w", err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, errors.New("no PEM certificate found")
	}
	return out, nil
}

// Verify checks that the serving certificate chains to one of the CAs in
// bundle at now and is valid for every name in dnsNames; the error says what
// differs.
func Verify(servingPEM, bundle []byte, dnsNames []string, now time.Time) error {
	leaf, err := ParseCertificate(servingPEM)
	if err != nil {
		return fmt.Errorf("serving certificate: %w", err)
	}
	roots := x509.NewCertPool()
	cas, err := ParseBundle(bundle)
	if err != nil {
		return fmt.Errorf("CA bundle: %w", err)
	}
	for _, c := range cas {
		roots.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		return fmt.Errorf("serving certificate (serial %x, issuer %q) does not chain to the CA bundle (%d CAs): %w",
			leaf.SerialNumber, leaf.Issuer.CommonName, len(cas), err)
	}
	for _, n := range dnsNames {
		if err := leaf.VerifyHostname(n); err != nil {
			return fmt.Errorf("serving certificate is not valid for %q: %w", n, err)
		}
	}
	return nil
}

// needsRenewal reports whether a certificate must be replaced now: unreadable,
// past two thirds of its life, or not covering the wanted names.
func needsRenewal(certPEM []byte, dnsNames []string, ips []net.IP, now time.Time) bool {
	c, err := ParseCertificate(certPEM)
	if err != nil {
		return true
	}
	life := c.NotAfter.Sub(c.NotBefore)
	if now.After(c.NotBefore.Add(life * 2 / 3)) {
		return true
	}
	for _, n := range dnsNames {
		if !slices.Contains(c.DNSNames, n) {
			return true
		}
	}
	for _, ip := range ips {
		if !slices.ContainsFunc(c.IPAddresses, ip.Equal) {
			return true
		}
	}
	return false
}

// bundleWith returns a CA bundle holding ca first and then those of old that are
// still valid and different, so that clients keep trusting certificates signed
// by a CA that is being replaced.
func bundleWith(ca []byte, old []byte, now time.Time) []byte {
	out := bytes.TrimSpace(ca)
	newCA, err := ParseCertificate(ca)
	if err != nil {
		return ca
	}
	olds, _ := ParseBundle(old)
	for _, c := range olds {
		if c.Equal(newCA) || now.After(c.NotAfter) {
			continue
		}
		out = append(out, '\n')
		out = append(out, bytes.TrimSpace(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw}))...)
	}
	return append(out, '\n')
}
