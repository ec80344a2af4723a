package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	nativeconfig "github.com/deployguard/deployguard/config/native"
	"github.com/deployguard/deployguard/test/harness"
	"github.com/deployguard/deployguard/webhook/native"
	"github.com/deployguard/deployguard/webhook/native/floor"
)

// The floor probe reads what kube-apiserver does, not what its objects say.
// With config/native installed it finds the refusals enforced. Then the
// binding skips Deployments: the policy, the binding and the params are all
// still there and current, as when kube-apiserver stopped reading the params
// (kubernetes/kubernetes#130887), so the objects' check still says enforced,
// and only the probe finds out, and says what it saw.
func TestFloorProbeReadsWhatTheAPIServerDoes(t *testing.T) {
	ctx := context.Background()
	o := guardConfig().WebhookOptions(guardUser)
	v, why := floor.Probe(ctx, k8s, k8s, o)
	require.Equal(t, floor.ProbeEnforced, v, why)
	// The refusal names the params the API server read: the ConfigMap as
	// it is now.
	params := &corev1.ConfigMap{}
	require.NoError(t, k8s.Get(ctx, client.ObjectKey{Namespace: harness.GuardNamespace, Name: nativeconfig.ParamsName}, params))
	err := k8s.Create(ctx, floor.ProbeDeployment("default"), client.DryRunAll)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `"deployguard.io/floor-probe" is reserved for deployguard's probe of this policy (params `+params.ResourceVersion+`)`)

	// The binding that takes creates, the probe's.
	b := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
	require.NoError(t, k8s.Get(ctx, client.ObjectKey{Name: native.RefusalsCreateBinding}, b))
	orig := b.Spec.DeepCopy()
	t.Cleanup(func() {
		ctx := context.Background()
		require.NoError(t, wait.PollUntilContextTimeout(ctx, tick, waitShort, true, func(ctx context.Context) (bool, error) {
			cur := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
			if err := k8s.Get(ctx, client.ObjectKey{Name: native.RefusalsCreateBinding}, cur); err != nil {
				return false, nil
			}
			cur.Spec = *orig
			return k8s.Update(ctx, cur) == nil, nil
		}))
		require.NoError(t, harness.WaitForNativePolicies(ctx, k8s, "default", time.Minute))
	})
	b.Spec.MatchResources.ExcludeResourceRules = []admissionregistrationv1.NamedRuleWithOperations{{
		RuleWithOperations: admissionregistrationv1.RuleWithOperations{
			Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.OperationAll},
			Rule:       admissionregistrationv1.Rule{APIGroups: []string{"apps"}, APIVersions: []string{"v1"}, Resources: []string{"deployments"}},
		},
	}}
	require.NoError(t, k8s.Update(ctx, b))

	ok, objWhy, err := floor.PoliciesEnforced(ctx, k8s, harness.GuardNamespace, o)
	require.NoError(t, err)
	require.True(t, ok, "the objects still say enforced: %s", objWhy)
	// The API server takes a moment to act on the binding it was given.
	require.Eventually(t, func() bool {
		v, why = floor.Probe(ctx, k8s, k8s, o)
		return v == floor.ProbeNotEnforced
	}, waitShort, tick, "the probe finds the refusals not enforced: %v %s", v, why)
	t.Log(why)
	assert.Contains(t, why, native.Refusals)
	assert.Contains(t, why, floor.ProbeFinalizer)
	// What the probe sent was a dry run: nothing was stored.
	var stored appsv1.DeploymentList
	require.NoError(t, k8s.List(ctx, &stored, client.MatchingLabels(floor.ProbeDeployment("default").Labels)))
	assert.Empty(t, stored.Items)
}

// kubernetes/kubernetes#130887, its other face: once no binding has named
// a policy with a ConfigMap paramKind for a moment, kube-apiserver stops the
// ConfigMap informer it started for them, and keeps the params it read last.
// On a kube-apiserver of its own, which it leaves in that state: the
// bindings (the refusals' two and the selector repair's: either policy
// plugin may have started the shared informer) are deleted, the params changed,
// the bindings created again, each second, until the probe finds the policy
// reading params older than the ConfigMap's, twice a second apart (a live
// informer a moment behind would have caught up).
func TestFloorProbeSeesParamsTheAPIServerNoLongerReads(t *testing.T) {
	ctx := context.Background()
	tools, err := harness.ToolsDir("kube-apiserver", "etcd")
	require.NoError(t, err)
	env := &envtest.Environment{BinaryAssetsDirectory: tools}
	own, err := env.Start()
	require.NoError(t, err)
	t.Cleanup(func() { _ = env.Stop() })
	c, err := client.New(own, client.Options{Scheme: scheme})
	require.NoError(t, err)
	require.NoError(t, c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: harness.GuardNamespace}}))
	o := guardConfig().WebhookOptions(guardUser)
	require.NoError(t, harness.InstallNativePolicies(ctx, c, o.NativeSettings()))

	vb := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
	require.NoError(t, c.Get(ctx, client.ObjectKey{Name: native.Refusals}, vb))
	cb := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
	require.NoError(t, c.Get(ctx, client.ObjectKey{Name: native.RefusalsCreateBinding}, cb))
	mb := &admissionregistrationv1.MutatingAdmissionPolicyBinding{}
	require.NoError(t, c.Get(ctx, client.ObjectKey{Name: native.Selector}, mb))
	bindings := []client.Object{vb, cb, mb}
	key := client.ObjectKey{Namespace: harness.GuardNamespace, Name: nativeconfig.ParamsName}
	var v floor.ProbeVerdict
	var why, stale string
	tries := 0
	// Each try leaves the bindings deleted until the next, a second later.
	err = wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		if stale != "" {
			if v, why = floor.Probe(ctx, c, c, o); v == floor.ProbeNotEnforced && why == stale {
				return true, nil
			}
			stale = ""
		}
		tries++
		params := &corev1.ConfigMap{}
		if err := c.Get(ctx, key, params); err != nil {
			return false, err
		}
		params.Annotations = map[string]string{"test.deployguard.io/try": fmt.Sprint(tries)}
		if err := c.Update(ctx, params); err != nil {
			return false, nil
		}
		for _, b := range bindings {
			n := b.DeepCopyObject().(client.Object)
			n.SetResourceVersion("")
			n.SetUID("")
			n.SetCreationTimestamp(metav1.Time{})
			if err := c.Create(ctx, n); err != nil && !apierrors.IsAlreadyExists(err) {
				return false, err
			}
		}
		// Until the API server has the binding again, the probe is admitted.
		_ = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 5*time.Second, true, func(ctx context.Context) (bool, error) {
			v, why = floor.Probe(ctx, c, c, o)
			return !strings.Contains(why, "admitted"), nil
		})
		if v == floor.ProbeNotEnforced && strings.Contains(why, "resourceVersion") {
			stale = why
			return false, nil
		}
		for _, b := range bindings {
			cur := b.DeepCopyObject().(client.Object)
			if err := c.Get(ctx, client.ObjectKeyFromObject(b), cur); err == nil {
				_ = c.Delete(ctx, cur)
			}
		}
		return false, nil
	})
	require.NoError(t, err, "after %d tries: %v %s", tries, v, why)
	t.Logf("after %d tries: %s", tries, why)
}
