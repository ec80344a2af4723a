// Package certs decides where the webhook server's certificate comes from: files
// mounted from a Secret that cert-manager issues, or a CA and serving
// certificate that the guard issues for itself, stores in a Secret, and injects
// into its own webhook configurations. It also checks, for either source, that
// the certificate being served is the one the API server trusts.
package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"strings"
	"time"
)

// KeyPair is a PEM certificate and its PEM private key.
type KeyPair struct {
	CertPEM []byte
	KeyPEM  []byte
}

// backdate is how far back NotBefore is set, to tolerate clocks a little
// behind: a minute, or a tenth of a short validity (tests).
func backdate(validity time.Duration) time.Duration {
	return min(time.Minute, validity/10)
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
		NotBefore:             now.Add(-backdate(validity)),
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
// It never outlives the CA that vouches for it.
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
		notAfter = caCert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: cn},
		DNSNames:     dnsNames,
		IPAddresses:  ips,
		NotBefore:    now.Add(-backdate(validity)),
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
// bundle at now and is valid for every name in hostnames (DNS names or IP
// addresses, as the API server dials them); the error says what differs.
func Verify(servingPEM, bundle []byte, hostnames []string, now time.Time) error {
	leaf, err := ParseCertificate(servingPEM)
	if err != nil {
		return fmt.Errorf("serving certificate: %w", err)
	}
	cas, err := ParseBundle(bundle)
	if err != nil {
		return fmt.Errorf("CA bundle: %w", err)
	}
	return verifyLeaf(leaf, cas, hostnames, now)
}

// verifyLeaf is Verify on parsed certificates.
func verifyLeaf(leaf *x509.Certificate, cas []*x509.Certificate, hostnames []string, now time.Time) error {
	roots := x509.NewCertPool()
	for _, c := range cas {
		roots.AddCert(c)
	}
	_, err := leaf.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	if err != nil {
		return fmt.Errorf("serving certificate %s does not chain to the CA bundle [%s]: %s", Describe(leaf), describeAll(cas), why(leaf, cas, now, err))
	}
	for _, n := range hostnames {
		if err := leaf.VerifyHostname(n); err != nil {
			return fmt.Errorf("serving certificate %s is not valid for %q (it names %s)", Describe(leaf), n, names(leaf))
		}
	}
	return nil
}

// why turns a verification error into what an operator compares: which CA
// signed the certificate, and whether the bundle holds it.
func why(leaf *x509.Certificate, cas []*x509.Certificate, now time.Time, err error) string {
	var inv x509.CertificateInvalidError
	if errors.As(err, &inv) && inv.Reason == x509.Expired {
		if now.Before(leaf.NotBefore) {
			return fmt.Sprintf("it is not valid before %s", leaf.NotBefore.UTC().Format(time.RFC3339))
		}
		if now.After(leaf.NotAfter) {
			return fmt.Sprintf("it expired at %s", leaf.NotAfter.UTC().Format(time.RFC3339))
		}
		return "a CA of its chain is expired or not yet valid"
	}
	var unknown x509.UnknownAuthorityError
	if errors.As(err, &unknown) {
		issuer := fmt.Sprintf("it was signed by %q", leaf.Issuer.CommonName)
		if len(leaf.AuthorityKeyId) > 0 {
			issuer += fmt.Sprintf(" (key id %s)", shortHex(leaf.AuthorityKeyId))
		}
		return issuer + ", which the bundle does not hold"
	}
	return err.Error()
}

// Describe names a certificate the way an operator compares two of them.
func Describe(c *x509.Certificate) string {
	if c == nil {
		return "<none>"
	}
	return fmt.Sprintf("%q (serial %s, issuer %q, valid %s to %s)", c.Subject.CommonName, shortHex(c.SerialNumber.Bytes()),
		c.Issuer.CommonName, c.NotBefore.UTC().Format(time.RFC3339), c.NotAfter.UTC().Format(time.RFC3339))
}

func describeAll(cs []*x509.Certificate) string {
	out := make([]string, 0, len(cs))
	for _, c := range cs {
		out = append(out, Describe(c))
	}
	return strings.Join(out, ", ")
}

func names(c *x509.Certificate) string {
	var out []string
	out = append(out, c.DNSNames...)
	for _, ip := range c.IPAddresses {
		out = append(out, ip.String())
	}
	if len(out) == 0 {
		return "no names"
	}
	return strings.Join(out, ", ")
}

// shortHex is the first 8 bytes of b in hex: enough to tell certificates apart
// in a log line.
func shortHex(b []byte) string {
	if len(b) > 8 {
		return hex.EncodeToString(b[:8]) + "…"
	}
	return hex.EncodeToString(b)
}

// fingerprint is the SHA-256 of b, in hex.
func fingerprint(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// composeBundle is the trust bundle for the webhook configurations: first the
// CAs in use (the signing CA, then one waiting to take over), then every CA of
// old that is still valid at now and not listed yet. Keeping an older CA until
// it expires keeps trusted every serving certificate it signed, whichever
// replica still serves one: such a certificate never outlives its CA.
func composeBundle(now time.Time, old []byte, inUse ...*x509.Certificate) []byte {
	var out []*x509.Certificate
	add := func(c *x509.Certificate) {
		for _, have := range out {
			if have.Equal(c) {
				return
			}
		}
		out = append(out, c)
	}
	for _, c := range inUse {
		if c != nil {
			add(c)
		}
	}
	olds, _ := ParseBundle(old)
	for _, c := range olds {
		if !now.After(c.NotAfter) {
			add(c)
		}
	}
	var b []byte
	for _, c := range out {
		b = append(b, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	return b
}

// bundleHolds reports whether the PEM bundle holds ca.
func bundleHolds(bundle []byte, ca *x509.Certificate) bool {
	cs, err := ParseBundle(bundle)
	if err != nil {
		return false
	}
	for _, c := range cs {
		if c.Equal(ca) {
			return true
		}
	}
	return false
}
