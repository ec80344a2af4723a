package harness

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"time"
)

// APIServerClientName is the common name of the client certificate the local
// kube-apiserver presents to webhooks when LocalOptions.ClientAuth is set,
// and the guard's --client-names.
const APIServerClientName = "kube-apiserver"

// clientAuth is what StartLocal needs to run the local cluster with webhook
// client authentication: a kwokctl configuration that gives kube-apiserver
// an admission configuration whose kubeconfig presents a client certificate
// to every webhook, and the CA the guard verifies it with.
type clientAuth struct {
	kwokctlConfig string
	caFile        string
}

// guardArgs are the `deployguard serve` flags that require the certificate.
func (a clientAuth) guardArgs() []string {
	return []string{"--client-ca-file", a.caFile, "--client-names", APIServerClientName}
}

// writeClientAuth makes a CA and a client certificate signed by it, and the
// files kube-apiserver reads them from (kube-apiserver's
// --admission-control-config-file, as a platform team configures it), in dir.
func writeClientAuth(dir string) (clientAuth, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return clientAuth{}, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return clientAuth{}, err
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return clientAuth{}, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "deployguard local webhook clients"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(7 * 24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return clientAuth{}, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return clientAuth{}, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return clientAuth{}, err
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: APIServerClientName},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(7 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, ca, &key.PublicKey, caKey)
	if err != nil {
		return clientAuth{}, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return clientAuth{}, err
	}
	a := clientAuth{caFile: filepath.Join(dir, "webhook-client-ca.crt"), kwokctlConfig: filepath.Join(dir, "kwokctl.yaml")}
	crt, keyFile := filepath.Join(dir, "webhook-client.crt"), filepath.Join(dir, "webhook-client.key")
	kubeconfig, admission := filepath.Join(dir, "webhook-kubeconfig.yaml"), filepath.Join(dir, "admission.yaml")
	files := []struct {
		path, content string
		mode          os.FileMode
	}{
		{a.caFile, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})), 0o644},
		{crt, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leafDER})), 0o644},
		{keyFile, string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})), 0o600},
		// '*' matches every webhook host: the guard's port is picked later.
		{kubeconfig, fmt.Sprintf(`apiVersion: v1
kind: Config
users:
- name: '*'
  user:
    client-certificate: %s
    client-key: %s
`, crt, keyFile), 0o644},
		{admission, fmt.Sprintf(`apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
- name: ValidatingAdmissionWebhook
  configuration:
    apiVersion: apiserver.config.k8s.io/v1
    kind: WebhookAdmissionConfiguration
    kubeConfigFile: %[1]s
- name: MutatingAdmissionWebhook
  configuration:
    apiVersion: apiserver.config.k8s.io/v1
    kind: WebhookAdmissionConfiguration
    kubeConfigFile: %[1]s
`, kubeconfig), 0o644},
		{a.kwokctlConfig, fmt.Sprintf(`apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokctlConfiguration
componentsPatches:
- name: kube-apiserver
  extraArgs:
  - key: admission-control-config-file
    value: %s
`, admission), 0o644},
	}
	for _, f := range files {
		if err := os.WriteFile(f.path, []byte(f.content), f.mode); err != nil {
			return clientAuth{}, err
		}
	}
	return a, nil
}
