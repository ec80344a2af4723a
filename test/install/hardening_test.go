package install

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/test/harness"
)

// serviceAccountToken creates (or reuses) a ServiceAccount in the guard's
// namespace and returns a short-lived token for it.
func serviceAccountToken(ctx context.Context, t *testing.T, name string) string {
	t.Helper()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: harness.GuardNamespace}}
	if err := local.Client.Create(ctx, sa); err != nil && !apierrors.IsAlreadyExists(err) {
		require.NoError(t, err)
	}
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr(int64(600))}}
	require.NoError(t, local.Client.SubResource("token").Create(ctx, sa, tr))
	require.NotEmpty(t, tr.Status.Token)
	return tr.Status.Token
}

// The guard's /metrics is served only to a caller the API server
// authenticates and authorizes for GET /metrics, over TLS: what a pod that
// merely reaches the port gets is a refusal, not the metrics.
func TestMetricsNeedAnAuthorizedToken(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	g := local.Guard
	require.True(t, g.MetricsSecure(), "the tier runs the guard with the default --metrics-secure")
	require.True(t, strings.HasPrefix(g.MetricsURL(), "https://"))
	reader, err := harness.MetricsScraperToken(local.GuardKubeconfig)
	require.NoError(t, err)
	for _, tc := range []struct {
		name  string
		token string
		want  int
	}{
		{name: "no token", want: http.StatusUnauthorized},
		{name: "a token the API server does not know", token: "not-a-token", want: http.StatusUnauthorized},
		{name: "a ServiceAccount without the reader role", token: serviceAccountToken(ctx, t, "metrics-nobody"), want: http.StatusForbidden},
		{name: "a ServiceAccount bound to deployguard-metrics-reader", token: reader, want: http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body, err := g.GetMetrics(tc.token)
			require.NoError(t, err)
			assert.Equal(t, tc.want, code, "%.300s", body)
			if tc.want == http.StatusOK {
				assert.Contains(t, body, "deployguard_", "the guard's metrics")
			} else {
				assert.NotContains(t, body, "deployguard_", "no metric leaks with the refusal")
			}
		})
	}
	// Over plain HTTP the TLS listener answers nothing a scraper could read.
	hc := &http.Client{Timeout: 2 * time.Second}
	resp, err := hc.Get("http://" + g.Metrics + "/metrics")
	if err == nil {
		defer resp.Body.Close()
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "plain HTTP to the TLS port")
	}
}

// The guard's shipped rights (config/rbac, applied to this cluster: the guard
// runs under them) are no wider than its code needs, asked of the real API
// server as the guard's ServiceAccount would be judged. A rule widened again
// fails here.
func TestGuardRightsAreNarrow(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	guard := "system:serviceaccount:" + harness.GuardNamespace + ":deployguard"
	resource := func(verb, group, res, ns string) authorizationv1.SubjectAccessReviewSpec {
		return authorizationv1.SubjectAccessReviewSpec{User: guard, ResourceAttributes: &authorizationv1.ResourceAttributes{
			Verb: verb, Group: group, Resource: res, Namespace: ns}}
	}
	for _, tc := range []struct {
		name    string
		spec    authorizationv1.SubjectAccessReviewSpec
		allowed bool
	}{
		// PolicyExceptions: read in the one namespace they are honoured in.
		{"watches PolicyExceptions in its namespace", resource("watch", "deployguard.io", "policyexceptions", harness.GuardNamespace), true},
		{"lists PolicyExceptions in its namespace", resource("list", "deployguard.io", "policyexceptions", harness.GuardNamespace), true},
		{"does not list PolicyExceptions in a tenant's namespace", resource("list", "deployguard.io", "policyexceptions", "team-a"), false},
		{"does not watch PolicyExceptions cluster-wide", resource("watch", "deployguard.io", "policyexceptions", ""), false},
		{"does not write PolicyExceptions", resource("create", "deployguard.io", "policyexceptions", harness.GuardNamespace), false},
		// ConfigMaps outside its namespace: config snapshots only.
		{"patches a tenant's ConfigMaps (a snapshot's owners)", resource("patch", "", "configmaps", "team-a"), true},
		{"does not update a tenant's ConfigMaps", resource("update", "", "configmaps", "team-a"), false},
		{"does not delete a tenant's ConfigMaps", resource("delete", "", "configmaps", "team-a"), false},
		{"does not list a tenant's ConfigMaps", resource("list", "", "configmaps", "team-a"), false},
		{"does not watch ConfigMaps cluster-wide", resource("watch", "", "configmaps", ""), false},
		{"does not delete ConfigMaps in kube-system", resource("delete", "", "configmaps", "kube-system"), false},
		{"does not read Secrets outside its namespace", resource("get", "", "secrets", "team-a"), false},
		// The metrics filter's questions, and nothing of a reader's.
		{"reviews tokens (metrics authentication)", resource("create", "authentication.k8s.io", "tokenreviews", ""), true},
		{"reviews access (metrics authorization)", resource("create", "authorization.k8s.io", "subjectaccessreviews", ""), true},
		{"does not read /metrics itself", authorizationv1.SubjectAccessReviewSpec{User: guard,
			NonResourceAttributes: &authorizationv1.NonResourceAttributes{Verb: "get", Path: "/metrics"}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sar := &authorizationv1.SubjectAccessReview{Spec: tc.spec}
			sar.Spec.Groups = []string{"system:serviceaccounts", "system:serviceaccounts:" + harness.GuardNamespace, "system:authenticated"}
			require.NoError(t, local.Client.Create(ctx, sar))
			assert.Equal(t, tc.allowed, sar.Status.Allowed, "%s: %s", sar.Status.Reason, sar.Status.EvaluationError)
		})
	}
}

// The chart's namespace enforces Pod Security "restricted", and the guard's
// own pod, as the chart renders it, is admitted there by the real API server
// (server-side dry run); a privileged pod is refused, so the API server does
// enforce the label.
func TestChartNamespaceIsPodSecurityRestricted(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const ns = "psa-restricted-check"
	objs, err := objects(helmTemplate(t, ns, "--set", "createNamespace=true"))
	require.NoError(t, err)
	rendered := objs["Namespace//"+ns]
	require.NotNil(t, rendered, "the chart renders its namespace")
	labels := map[string]string{}
	for k, v := range dig(rendered, "metadata", "labels").(map[string]any) {
		labels[k] = v.(string)
	}
	for _, mode := range []string{"enforce", "audit", "warn"} {
		assert.Equal(t, "restricted", labels["pod-security.kubernetes.io/"+mode], mode)
	}
	nsObj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: labels}}
	require.NoError(t, client.IgnoreAlreadyExists(local.Client.Create(ctx, nsObj)))
	t.Cleanup(func() { _ = local.Client.Delete(context.Background(), nsObj) })
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "deployguard", Namespace: ns}}
	// The namespace's ServiceAccount admission needs the pod's account; it may
	// take a moment after the namespace is created.
	require.NoError(t, wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		err := local.Client.Create(ctx, sa)
		return err == nil || apierrors.IsAlreadyExists(err), nil
	}))

	b, err := json.Marshal(dig(objs["Deployment/"+ns+"/deployguard"], "spec", "template"))
	require.NoError(t, err)
	var tmpl corev1.PodTemplateSpec
	require.NoError(t, json.Unmarshal(b, &tmpl))
	guardPod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "deployguard", Namespace: ns, Labels: tmpl.Labels}, Spec: tmpl.Spec}
	require.NoError(t, local.Client.Create(ctx, guardPod, client.DryRunAll), "the guard's pod under Pod Security restricted")

	privileged := guardPod.DeepCopy()
	privileged.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: ptr(true)}
	err = local.Client.Create(ctx, privileged, client.DryRunAll)
	require.Error(t, err, "a privileged pod in the guard's namespace")
	assert.Contains(t, err.Error(), "restricted", "refused by Pod Security")
}
