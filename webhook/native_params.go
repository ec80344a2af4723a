package webhook

import (
	"context"
	"fmt"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/webhook/native"
)

// NativePoliciesInstalled reports whether every one of the guard's native
// policies and its binding is in the cluster, so that the API server enforces
// them. When one is missing (the policies were not installed, or removed),
// the webhook must evaluate them itself, or nothing would.
func NativePoliciesInstalled(ctx context.Context, c client.Reader) (bool, string, error) {
	rules, err := native.Load()
	if err != nil {
		return false, "", err
	}
	for _, p := range rules.Policies {
		if p.Name != native.Refusals {
			continue // the guard's webhook evaluates it
		}
		if err := c.Get(ctx, client.ObjectKey{Name: p.Name}, &admissionregistrationv1.ValidatingAdmissionPolicy{}); err != nil {
			if apierrors.IsNotFound(err) {
				return false, "ValidatingAdmissionPolicy " + p.Name + " is not installed", nil
			}
			return false, "", err
		}
		if err := c.Get(ctx, client.ObjectKey{Name: p.Name}, &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}); err != nil {
			if apierrors.IsNotFound(err) {
				return false, "ValidatingAdmissionPolicyBinding " + p.Name + " is not installed", nil
			}
			return false, "", err
		}
	}
	return true, "", nil
}

// ApplyNativeParams writes the policies' params ConfigMap in namespace from
// o, so that the config file stays the one place a platform team sets them.
func ApplyNativeParams(ctx context.Context, c client.Client, namespace string, o *Options) error {
	cm := o.NativeSettings().ConfigMap(namespace)
	//nolint:staticcheck // a typed object applied whole; the guard owns every field it sets
	if err := c.Patch(ctx, cm, client.Apply, client.FieldOwner("deployguard"), client.ForceOwnership); err != nil {
		return fmt.Errorf("writing the native policies' params (ConfigMap %s/%s): %w", namespace, cm.Name, err)
	}
	return nil
}
