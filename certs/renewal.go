package certs

import (
	"crypto/x509"
	"fmt"
	"net"
	"slices"
	"time"
)

// Reasons a certificate is replaced, as logged.
const (
	ReasonMissing          = "Missing"
	ReasonExpired          = "Expired"
	ReasonRenewalDue       = "RenewalDue"
	ReasonDNSNameMissing   = "DNSNameMissing"
	ReasonIPAddressMissing = "IPAddressMissing"
	ReasonNotSignedByCA    = "NotSignedBySigningCA"
)

// renewalInput is what the renewal checks look at. Cert is nil when there is
// none or it cannot be read.
type renewalInput struct {
	Cert     *x509.Certificate
	DNSNames []string
	IPs      []net.IP
	Now      time.Time
}

// renewalCheck says whether a certificate is due for replacement, and why.
type renewalCheck func(renewalInput) (reason, message string, due bool)

// renewalChecks run in order; the first that finds the certificate due wins.
type renewalChecks []renewalCheck

func (cs renewalChecks) evaluate(in renewalInput) (reason, message string, due bool) {
	for _, c := range cs {
		if reason, message, due := c(in); due {
			return reason, message, true
		}
	}
	return "", "", false
}

var (
	// caRenewal decides when the self-managed CA is replaced.
	caRenewal = renewalChecks{certificateMissing, certificateExpired, pastRenewalTime}
	// servingRenewal decides when the serving certificate is replaced.
	servingRenewal = renewalChecks{certificateMissing, certificateExpired, pastRenewalTime, dnsNameMissing, ipAddressMissing}
)

func certificateMissing(in renewalInput) (string, string, bool) {
	if in.Cert == nil {
		return ReasonMissing, "there is no readable certificate", true
	}
	return "", "", false
}

func certificateExpired(in renewalInput) (string, string, bool) {
	if !in.Now.Before(in.Cert.NotAfter) {
		return ReasonExpired, fmt.Sprintf("the certificate expired at %s", in.Cert.NotAfter.UTC().Format(time.RFC3339)), true
	}
	return "", "", false
}

// renewalTime is two thirds into a certificate's life, as cert-manager renews
// by default: a third of the life is left to roll the new one out.
func renewalTime(c *x509.Certificate) time.Time {
	return c.NotBefore.Add(c.NotAfter.Sub(c.NotBefore) * 2 / 3)
}

func pastRenewalTime(in renewalInput) (string, string, bool) {
	if at := renewalTime(in.Cert); !in.Now.Before(at) {
		return ReasonRenewalDue, fmt.Sprintf("two thirds of the certificate's life passed at %s (it expires at %s)",
			at.UTC().Format(time.RFC3339), in.Cert.NotAfter.UTC().Format(time.RFC3339)), true
	}
	return "", "", false
}

func dnsNameMissing(in renewalInput) (string, string, bool) {
	for _, n := range in.DNSNames {
		if !slices.Contains(in.Cert.DNSNames, n) {
			return ReasonDNSNameMissing, fmt.Sprintf("the certificate does not name %q", n), true
		}
	}
	return "", "", false
}

func ipAddressMissing(in renewalInput) (string, string, bool) {
	for _, ip := range in.IPs {
		if !slices.ContainsFunc(in.Cert.IPAddresses, ip.Equal) {
			return ReasonIPAddressMissing, fmt.Sprintf("the certificate does not name IP address %s", ip), true
		}
	}
	return "", "", false
}

// expiryWarning says whether an operator must be told about the served
// certificate: renewal is due at two thirds of its life (both the guard and
// cert-manager by default renew then), so one with less than warnRemaining of
// its life left has not been rotated when it should have been.
func expiryWarning(c *x509.Certificate, now time.Time) (string, bool) {
	life := c.NotAfter.Sub(c.NotBefore)
	left := c.NotAfter.Sub(now)
	if life <= 0 || float64(left) >= warnRemaining*float64(life) {
		return "", false
	}
	if left <= 0 {
		return fmt.Sprintf("the serving certificate %s has expired: the API server cannot call the webhooks", Describe(c)), true
	}
	return fmt.Sprintf("the serving certificate %s expires in %s (%.0f%% of its life left) and has not been rotated: renewal was due at %s",
		Describe(c), left.Round(time.Second), 100*float64(left)/float64(life), renewalTime(c).UTC().Format(time.RFC3339)), true
}

// warnRemaining is the share of a certificate's life left below which it is
// reported: renewal is due at a third, so this leaves some slack for a
// rotation in progress and still warns long before expiry.
const warnRemaining = 0.3
