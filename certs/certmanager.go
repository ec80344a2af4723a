package certs

import (
	"context"
	"crypto/x509"
	"fmt"
	"strings"
	"time"

	cmapi "github.com/cert-manager/cert-manager/pkg/apis/certmanager/v1"
	cmmeta "github.com/cert-manager/cert-manager/pkg/apis/meta/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// AnnotationInjectCAFrom is cainjector's annotation on a webhook
// configuration: the namespace/name of the Certificate whose Secret's ca.crt
// it injects as caBundle.
const AnnotationInjectCAFrom = cmapi.WantInjectAnnotation

// ParseInjectCAFrom splits the annotation's namespace/name.
func ParseInjectCAFrom(v string) (types.NamespacedName, error) {
	ns, name, ok := strings.Cut(v, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return types.NamespacedName{}, fmt.Errorf("%s %q is not namespace/name", AnnotationInjectCAFrom, v)
	}
	return types.NamespacedName{Namespace: ns, Name: name}, nil
}

// CertificateReady returns whether cert-manager's Certificate is Ready and,
// when it is not, cert-manager's reason and message.
func CertificateReady(crt *cmapi.Certificate) (bool, string) {
	for _, c := range crt.Status.Conditions {
		if c.Type != cmapi.CertificateConditionReady {
			continue
		}
		if c.Status == cmmeta.ConditionTrue {
			return true, ""
		}
		return false, fmt.Sprintf("%s: %s", c.Reason, c.Message)
	}
	return false, "no Ready condition yet"
}

// describeCertManager says what cert-manager holds for the Certificate named
// by an inject-ca-from annotation, next to what the guard serves: whether the
// Certificate is Ready or being issued, which certificate and CA its Secret
// holds (the CA is what cainjector injects), and whether the guard serves the
// Secret's certificate or another one (a Secret volume the kubelet has not
// updated yet).
func describeCertManager(ctx context.Context, c client.Reader, injectFrom string, served *x509.Certificate) string {
	ref, err := ParseInjectCAFrom(injectFrom)
	if err != nil {
		return err.Error()
	}
	crt := &cmapi.Certificate{}
	if err := c.Get(ctx, ref, crt); err != nil {
		return fmt.Sprintf("cert-manager Certificate %s cannot be read: %v", ref, err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "cert-manager Certificate %s", ref)
	if ready, why := CertificateReady(crt); ready {
		b.WriteString(" is Ready")
	} else {
		fmt.Fprintf(&b, " is not Ready (%s)", why)
	}
	for _, cond := range crt.Status.Conditions {
		if cond.Type == cmapi.CertificateConditionIssuing && cond.Status == cmmeta.ConditionTrue {
			fmt.Fprintf(&b, ", is being issued (%s)", cond.Reason)
		}
	}
	if crt.Status.Revision != nil {
		fmt.Fprintf(&b, ", revision %d", *crt.Status.Revision)
	}
	if crt.Status.RenewalTime != nil {
		fmt.Fprintf(&b, ", renews at %s", crt.Status.RenewalTime.UTC().Format(time.RFC3339))
	}
	sec := &corev1.Secret{}
	key := types.NamespacedName{Namespace: ref.Namespace, Name: crt.Spec.SecretName}
	if err := c.Get(ctx, key, sec); err != nil {
		fmt.Fprintf(&b, "; its Secret %s cannot be read: %v", key, err)
		return b.String()
	}
	issued, err := ParseCertificate(sec.Data[corev1.TLSCertKey])
	switch {
	case err != nil:
		fmt.Fprintf(&b, "; its Secret %s holds no certificate", key)
	case issued.Equal(served):
		fmt.Fprintf(&b, "; the guard serves its Secret's certificate %s", Describe(issued))
	default:
		fmt.Fprintf(&b, "; its Secret %s holds %s but the guard serves %s: the mounted Secret has not been updated yet", key, Describe(issued), Describe(served))
	}
	if cas, err := ParseBundle(sec.Data[cmmeta.TLSCAKey]); err == nil {
		fmt.Fprintf(&b, "; cainjector injects its ca.crt [%s]", describeAll(cas))
	} else {
		fmt.Fprintf(&b, "; its Secret has no ca.crt for cainjector to inject")
	}
	return b.String()
}
