package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/vocab"
)

// WebhookConfigurations reads the deployed config/webhook manifests, so that
// tests exercise the very rules, selectors, conditions and failure policies
// that are installed.
func WebhookConfigurations() (*admissionregistrationv1.MutatingWebhookConfiguration, *admissionregistrationv1.ValidatingWebhookConfiguration, error) {
	return WebhookConfigurationsFrom(WebhookManifests())
}

// WebhookManifests is the path of the deployed webhook configurations.
func WebhookManifests() string {
	return filepath.Join(RepoRoot(), "config", "webhook", "manifests.yaml")
}

// WebhookConfigurationsFrom reads webhook configurations from a manifest
// file of config/webhook's shape (a benchmark compares an earlier version's).
func WebhookConfigurationsFrom(path string) (*admissionregistrationv1.MutatingWebhookConfiguration, *admissionregistrationv1.ValidatingWebhookConfiguration, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	var (
		m *admissionregistrationv1.MutatingWebhookConfiguration
		v *admissionregistrationv1.ValidatingWebhookConfiguration
	)
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	for {
		var head metav1.TypeMeta
		var raw map[string]any
		if err := dec.Decode(&raw); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return nil, nil, err
		}
		j, err := jsonOf(raw)
		if err != nil {
			return nil, nil, err
		}
		if err := jsonInto(j, &head); err != nil {
			return nil, nil, err
		}
		switch head.Kind {
		case "MutatingWebhookConfiguration":
			m = &admissionregistrationv1.MutatingWebhookConfiguration{}
			err = jsonInto(j, m)
		case "ValidatingWebhookConfiguration":
			v = &admissionregistrationv1.ValidatingWebhookConfiguration{}
			err = jsonInto(j, v)
		}
		if err != nil {
			return nil, nil, err
		}
	}
	if m == nil || v == nil {
		return nil, nil, errors.New("config/webhook/manifests.yaml must hold one mutating and one validating configuration")
	}
	return m, v, nil
}

// InstallWebhooks installs the deployed webhook configurations pointed at a
// guard reachable at baseURL (https://host:port) instead of the in-cluster
// Service, with caBundle (nil: the guard's self-managed mode injects it).
func InstallWebhooks(ctx context.Context, c client.Client, baseURL string, caBundle []byte) error {
	return InstallWebhooksFrom(ctx, c, WebhookManifests(), baseURL, caBundle)
}

// InstallWebhooksFrom is InstallWebhooks with the configurations of a
// manifest file of its own.
func InstallWebhooksFrom(ctx context.Context, c client.Client, manifests, baseURL string, caBundle []byte) error {
	m, v, err := WebhookConfigurationsFrom(manifests)
	if err != nil {
		return err
	}
	for i := range m.Webhooks {
		m.Webhooks[i].ClientConfig = urlConfig(baseURL, m.Webhooks[i].ClientConfig, caBundle)
	}
	for i := range v.Webhooks {
		v.Webhooks[i].ClientConfig = urlConfig(baseURL, v.Webhooks[i].ClientConfig, caBundle)
	}
	for _, obj := range []client.Object{m, v} {
		if err := c.Create(ctx, obj); err != nil {
			if !apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("installing %s: %w", obj.GetName(), err)
			}
			cur := obj.DeepCopyObject().(client.Object)
			if err := c.Get(ctx, client.ObjectKeyFromObject(obj), cur); err != nil {
				return err
			}
			obj.SetResourceVersion(cur.GetResourceVersion())
			if err := c.Update(ctx, obj); err != nil {
				return fmt.Errorf("updating %s: %w", obj.GetName(), err)
			}
		}
	}
	return nil
}

func urlConfig(base string, cc admissionregistrationv1.WebhookClientConfig, ca []byte) admissionregistrationv1.WebhookClientConfig {
	path := "/"
	if cc.Service != nil && cc.Service.Path != nil {
		path = *cc.Service.Path
	}
	u := strings.TrimSuffix(base, "/") + path
	return admissionregistrationv1.WebhookClientConfig{URL: &u, CABundle: ca}
}

// WaitForWebhooks waits until the API server calls the guard: a server-side dry
// run of a Deployment with no selector comes back marked by the mutating
// webhook (vocab.AnnotationDefaulted) only once the API server trusts and
// reaches the guard. A selector alone proves nothing: the native
// deployguard-selector policy repairs it without the guard.
func WaitForWebhooks(ctx context.Context, c client.Client, namespace string, timeout time.Duration) error {
	probe := func() *appsv1.Deployment {
		return &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: "deployguard-readiness-probe", Namespace: namespace},
			Spec: appsv1.DeploymentSpec{Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app.kubernetes.io/name": "deployguard-readiness-probe"}},
				// Compliant with the built-in policies, so that only an
				// unreachable guard can make the probe fail.
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name: "c", Image: "probe:1",
					ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(80)}}},
					Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
						corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("16Mi")}},
				}}},
			}},
		}
	}
	var last error
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		d := probe()
		last = c.Create(ctx, d, client.DryRunAll)
		return last == nil && d.Spec.Selector != nil &&
			slices.Contains(strings.Split(d.Annotations[vocab.AnnotationDefaulted], ","), "spec.selector"), nil
	})
	if err != nil {
		if last != nil {
			return fmt.Errorf("the API server does not reach the guard's webhooks: %w (last error: %w)", err, last)
		}
		return fmt.Errorf("the API server does not reach the guard's webhooks: %w (the mutating webhook did not repair the selector)", err)
	}
	return nil
}

func jsonOf(v any) ([]byte, error) { return json.Marshal(v) }

func jsonInto(b []byte, v any) error { return json.Unmarshal(b, v) }
