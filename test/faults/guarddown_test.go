package faults

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nativeconfig "github.com/deployguard/deployguard/config/native"
	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/test/harness"
	"github.com/deployguard/deployguard/webhook/native"
	"github.com/deployguard/deployguard/webhook/review"
	"github.com/deployguard/deployguard/webhook/routing"
)

// downConfig exempts one namespace, so that the routing's exemptions are
// seen; enforcing adds an enforce-mode Rego policy.
const (
	downConfig = `apiVersion: deployguard.io/v1alpha1
kind: GuardConfig
exemptions:
  namespaces: [legacy]
`
	enforcingConfig = downConfig + `policy:
  modes: {resources: enforce}
`
)

// TestGuardDown stops every guard replica with SIGKILL and checks, through
// kubectl on a real cluster, the table of webhook/README.md: the native floor
// holds in the guard's words, what no enforced rule needs the guard for goes
// through, what an enforced rule may refuse is refused, and nothing outside
// the guarded namespaces notices. Then a replica whose config enforces a Rego
// policy routes the validating webhook accordingly, and is killed too.
func TestGuardDown(t *testing.T) {
	dir, log := tier.TestWorkDir(t)
	ctx := context.Background()
	startCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()

	// The selector comparison sends a few hundred dry runs: no client-side
	// throttling.
	e := startEnv(startCtx, t, dir, log, "down", 3, func(c *rest.Config) *rest.Config { c.QPS, c.Burst = 200, 400; return c })
	cluster, admin, kubeconfig, lb := e.cluster, e.admin, e.kubeconfig, e.lb
	guardUser := "system:serviceaccount:" + harness.GuardNamespace + ":deployguard"
	require.NoError(t, harness.InstallNativePolicies(startCtx, admin, native.Settings{GuardUsername: guardUser, ExemptNamespaces: []string{"legacy"},
		StableLabelKeys: stableLabelKeys}))

	var running []*harness.Guard
	defer func() {
		for _, g := range running {
			g.Kill()
		}
	}()
	start := func(s slot, config string) *harness.Guard {
		t.Helper()
		out, err := os.Create(filepath.Join(dir, s.name+".log"))
		require.NoError(t, err)
		t.Cleanup(func() { out.Close() })
		g, err := harness.StartGuard(harness.GuardOptions{
			Binary: tier.Guard, Kubeconfig: kubeconfig, WorkDir: filepath.Join(dir, s.name), Config: config,
			WebhookPort: s.webhookPort, ProbePort: s.probePort, Output: out, Env: harness.DeployedRuntimeEnv(),
			ExtraArgs: []string{"--native-check-period=1s"},
		})
		require.NoError(t, err)
		running = append(running, g)
		require.NoError(t, g.WaitReady(ctx, time.Minute))
		require.NoError(t, lb.waitStatus(ctx, s.name, "UP", 30*time.Second))
		return g
	}
	killAll := func() {
		for _, g := range running {
			g.Kill() // SIGKILL: no shutdown, no lease released
		}
		running = nil
	}
	kubectl := func(args ...string) (string, error) {
		return cluster.Kubectl(ctx, cluster.Kubeconfig, args...)
	}
	admitted := func(what string, args ...string) {
		t.Helper()
		out, err := kubectl(args...)
		assert.NoError(t, err, "%s: admitted with the guard down\n%s", what, out)
	}
	refused := func(what string, wants []string, args ...string) {
		t.Helper()
		out, err := kubectl(args...)
		if assert.Error(t, err, "%s: refused with the guard down\n%s", what, out) {
			for _, w := range wants {
				assert.Contains(t, out, w, what)
			}
		}
	}
	byPolicy := func(msg string) []string { return []string{"ValidatingAdmissionPolicy 'deployguard-refusals'", msg} }
	byWebhook := []string{`failed calling webhook "enforce.deployments.deployguard.io"`}
	apply := func(manifest string) []string { return []string{"apply", "-f", writeManifest(t, manifest)} }

	start(lb.slots[0], downConfig)
	start(lb.slots[1], downConfig)
	require.NoError(t, harness.WaitForWebhooks(startCtx, admin, "default", time.Minute))
	for _, ns := range []string{"shop", "legacy"} {
		harness.NewNamespace(t, admin, harness.NamespaceNamed(ns))
	}
	// Written while the guard is up: an ordinary Deployment, a protected
	// one, and one with a quarantined template (as after a rollback).
	require.NoError(t, admin.Create(ctx, harness.Deployment("shop", "web", "app:1", harness.ProgressDeadline(deadline))))
	require.NoError(t, admin.Create(ctx, harness.Deployment("legacy", "old", "app:1", harness.ProgressDeadline(deadline))))
	vault := harness.Deployment("shop", "vault", "app:1", harness.ProgressDeadline(deadline))
	vault.Annotations = map[string]string{vocab.AnnotationProtected: "true"}
	require.NoError(t, admin.Create(ctx, vault))
	held := harness.Deployment("shop", "held", "app:1", harness.ProgressDeadline(deadline))
	held.Annotations = map[string]string{vocab.AnnotationQuarantinedTemplates: "0123456789"}
	require.NoError(t, admin.Create(ctx, held))
	// The leader leaves the default operations and conditions as installed.
	def := &review.Options{NativeInAPIServer: true, Quarantine: review.QuarantineEnforce, ExemptNamespaces: []string{"legacy"}, GuardUsername: guardUser}
	assert.Equal(t, routing.MustDecide(routing.EnforcedOf(def, routing.LoadedPolicies{})), condition(ctx, t, admin, routing.EnforceWebhook, routing.MustDecideCondition))
	assert.Equal(t, []admissionregistrationv1.OperationType{admissionregistrationv1.Update}, enforceOperations(ctx, t, admin), "the enforce entry takes updates alone")
	// The leader adds the selector the manifests leave out: the enforce
	// entry then takes the Deployments labelled quarantined alone.
	harness.WaitFor(t, time.Minute, "the enforce entry selecting the quarantined Deployments", func(ctx context.Context) (bool, string, error) {
		got := enforceSelector(ctx, t, admin)
		return assert.ObjectsAreEqual(routing.EnforceObjectSelector(routing.EnforcedOf(def, routing.LoadedPolicies{})), got), fmt.Sprint(got), nil
	})
	// The reconciler labels a quarantined Deployment (a rollback writes
	// the label with the list): the enforce entry selects on it.
	harness.WaitFor(t, time.Minute, "the quarantined Deployment labelled", func(ctx context.Context) (bool, string, error) {
		d := getDeployment(ctx, t, admin, "shop", "held")
		return d.Labels[vocab.LabelQuarantined] == vocab.LabelQuarantinedValue, fmt.Sprint(d.Labels), nil
	})

	nativeLostWhileUp(ctx, t, admin, kubectl, def, allDown)

	killAll()

	// The native floor, in the guard's words.
	refused("all-replicas-down strategy", byPolicy("spec.strategy.rollingUpdate.maxUnavailable: 100% resolves to 3 of 3 replicas"), apply(allDown)...)
	refused("protected delete", byPolicy("metadata.annotations[deployguard.io/protected]: Deployment shop/vault is protected from deletion"), "delete", "deployment", "vault", "-n", "shop")
	refused("unknown guard finalizer", byPolicy(`metadata.finalizers: "deployguard.io/nope" is not one of deployguard's finalizers`), "patch", "deployment", "web", "-n", "shop", "--type=merge", "-p", `{"metadata":{"finalizers":["deployguard.io/nope"]}}`)
	// An empty selector: repaired by deployguard-selector, or, with nothing
	// stable to select on, refused in the guard's words.
	refused("unrepairable empty selector", byPolicy("spec.selector: the selector is empty and cannot be repaired: the pod template has none of the stable labels "+
		"app.kubernetes.io/name, app.kubernetes.io/instance, app. Add one to spec.template.metadata.labels (for example app.kubernetes.io/name: no-selector), "+
		"or set spec.selector.matchLabels to labels the template carries"), apply(noSelector)...)
	admitted("repairable empty selector", apply(repairableSelector)...)
	repaired := getDeployment(ctx, t, admin, "shop", "front")
	if assert.NotNil(t, repaired.Spec.Selector) {
		assert.Equal(t, map[string]string{"app.kubernetes.io/name": "front", "app": "shop"}, repaired.Spec.Selector.MatchLabels)
	}
	assert.Equal(t, "true", repaired.Annotations[native.AnnotationSelectorRepaired], "the record that the API server repaired it")
	assert.Equal(t, native.DefaultingPending, repaired.Labels[native.LabelDefaulting], "labelled for the guard, which removes it at the next update it sees")
	selectorRepairsAgree(ctx, t, admin, "shop")

	// What needs the guard only for advice goes through.
	admitted("ordinary create", "create", "deployment", "hotfix", "--image=app:1", "-n", "shop")
	assert.NotContains(t, getDeployment(ctx, t, admin, "shop", "hotfix").Labels, native.LabelRefusals, "an ordinary create is not labelled")
	// One the guard has something to do for: labelled by deployguard-selector
	// for the mutating webhook's entry for creates, whose call fails open.
	cleanup := harness.Deployment("shop", "records", "app:1", harness.ProgressDeadline(deadline))
	cleanup.Annotations = map[string]string{vocab.AnnotationCleanup: "record"}
	require.NoError(t, admin.Create(ctx, cleanup), "a create asking for a cleanup step")
	assert.Equal(t, native.DefaultingPending, getDeployment(ctx, t, admin, "shop", "records").Labels[native.LabelDefaulting])
	assert.Equal(t, native.DefaultingPending, getDeployment(ctx, t, admin, "shop", "records").Labels[native.LabelRefusals],
		"the refusals judged it, and admitted it, labelled")
	admitted("image change", "set", "image", "deployment/web", "app=app:2", "-n", "shop")
	admitted("scale (subresource)", "scale", "deployment/web", "--replicas=3", "-n", "shop")
	admitted("scale (update)", "patch", "deployment", "web", "-n", "shop", "--type=merge", "-p", `{"spec":{"replicas":4}}`)
	admitted("annotation", "annotate", "deployment", "web", "-n", "shop", "team=checkout")
	admitted("delete", "delete", "deployment", "hotfix", "-n", "shop")
	// An enforced rule that needs the guard's state: refused.
	refused("template change of a quarantined Deployment", byWebhook,
		"set", "image", "deployment/held", "app=app:2", "-n", "shop")
	admitted("annotation of a quarantined Deployment", "annotate", "deployment", "held", "-n", "shop", "team=checkout")
	// Outside the guarded namespaces, nothing notices.
	admitted("kube-system create", "create", "deployment", "sys", "--image=app:1", "-n", "kube-system")
	admitted("kube-system image change", "set", "image", "deployment/sys", "app=app:2", "-n", "kube-system")
	admitted("kube-system delete", "delete", "deployment", "sys", "-n", "kube-system")
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "lock"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("a")}}
	require.NoError(t, admin.Create(ctx, lease), "a Lease in a guarded namespace")
	lease.Spec.HolderIdentity = ptr.To("b")
	require.NoError(t, admin.Update(ctx, lease), "a Lease in a guarded namespace")
	d := getDeployment(ctx, t, admin, "shop", "web")
	assert.Equal(t, "app:2", d.Spec.Template.Spec.Containers[0].Image)
	assert.Equal(t, int32(4), *d.Spec.Replicas)

	// A replica whose config enforces a Rego policy: once it leads (the
	// killed leader's lease runs out first), it routes every write that
	// policy may refuse to the enforce entry. The built-in resources judges
	// no deletion (policy/README.md, "Deletions"): DELETE is not routed.
	start(lb.slots[2], enforcingConfig)
	enforcing := routing.EnforcedOf(def, routing.LoadedPolicies{Enforce: true, EnforceSkipsDelete: true})
	harness.WaitFor(t, 2*time.Minute, "the validating webhook routed for the enforced policy", func(ctx context.Context) (bool, string, error) {
		got := condition(ctx, t, admin, routing.EnforceWebhook, routing.MustDecideCondition)
		return got == routing.MustDecide(enforcing) &&
			condition(ctx, t, admin, routing.UpdateWebhook, routing.MayAdviseCondition) == routing.MayAdvise(enforcing) &&
			condition(ctx, t, admin, routing.CreateWebhook, routing.MayAdviseCondition) == routing.MayAdviseCreate(enforcing) &&
			slices.Equal(enforceOperations(ctx, t, admin), routing.EnforceOperations(enforcing)) &&
			enforceSelector(ctx, t, admin) == nil, got, nil
	})
	killAll()
	refused("image change under an enforced policy", byWebhook,
		"set", "image", "deployment/web", "app=app:3", "-n", "shop")
	refused("create under an enforced policy", byWebhook,
		"create", "deployment", "hotfix", "--image=app:1", "-n", "shop")
	admitted("image change in an exempt namespace", "set", "image", "deployment/old", "app=app:2", "-n", "legacy")
	admitted("delete under an enforced policy that judges no deletion", "delete", "deployment", "web", "-n", "shop")
	refused("protected delete", byPolicy("is protected from deletion"), "delete", "deployment", "vault", "-n", "shop")
	admitted("kube-system create", "create", "deployment", "sys", "--image=app:1", "-n", "kube-system")
}

// nativeLostWhileUp takes the refusals away from the API server while the
// guard runs (their bindings turned to Audit: nothing is denied): within a
// check the guard's webhook refuses in the policy's place, in the same
// words, and the leader routes every request to the failing-closed entry.
// Put back, the refusals are the API server's again and the routing narrows.
// The binding is not deleted: kube-apiserver 1.36 may then stop reading the
// params for good (kubernetes/kubernetes#130887, webhook/README.md), which
// the guard finds and answers by failing closed, but which would leave the
// rest of this test without the floor it checks.
func nativeLostWhileUp(ctx context.Context, t *testing.T, admin client.Client, kubectl func(...string) (string, error),
	def *review.Options, manifest string) {
	t.Helper()
	// Both bindings: the refusals' own, and the one for creates (the
	// probe's and this test's).
	setActions := func(actions ...admissionregistrationv1.ValidationAction) error {
		for _, name := range []string{native.Refusals, native.RefusalsCreateBinding} {
			if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
				b := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
				if err := admin.Get(ctx, client.ObjectKey{Name: name}, b); err != nil {
					return err
				}
				b.Spec.ValidationActions = actions
				return admin.Update(ctx, b)
			}); err != nil {
				return err
			}
		}
		return nil
	}
	require.NoError(t, setActions(admissionregistrationv1.Audit))
	restored := false
	restore := func() error {
		restored = true
		return setActions(admissionregistrationv1.Deny)
	}
	// A failed wait must not leave the floor away for what follows.
	t.Cleanup(func() {
		if !restored {
			_ = restore()
		}
	})
	dryRun := []string{"apply", "--dry-run=server", "-f", writeManifest(t, manifest)}
	// The same message; the webhook renders it as the API server renders a
	// field error ("field: Invalid value: message").
	const words = "100% resolves to 3 of 3 replicas, so a rollout may take every replica down at once"
	// kubectl prints the webhook's Invalid status as "The Deployment … is
	// invalid: …", and the policy's refusal names the policy.
	refused := func(byPolicy bool) func(ctx context.Context) (bool, string, error) {
		return func(context.Context) (bool, string, error) {
			out, err := kubectl(dryRun...)
			named := strings.Contains(out, "ValidatingAdmissionPolicy 'deployguard-refusals'")
			return err != nil && strings.Contains(out, words) && named == byPolicy, out, nil
		}
	}
	harness.WaitFor(t, time.Minute, "the guard's webhook refuses in the lost policy's place", refused(false))
	lost := *def
	lost.Native = review.NewNativeEnforcement(false)
	harness.WaitFor(t, time.Minute, "every request routed to the enforce entry", func(ctx context.Context) (bool, string, error) {
		got := condition(ctx, t, admin, routing.EnforceWebhook, routing.MustDecideCondition)
		return got == routing.MustDecide(routing.EnforcedOf(&lost, routing.LoadedPolicies{})), got, nil
	})

	require.NoError(t, restore())
	harness.WaitFor(t, time.Minute, "the routing narrowed again", func(ctx context.Context) (bool, string, error) {
		got := condition(ctx, t, admin, routing.EnforceWebhook, routing.MustDecideCondition)
		return got == routing.MustDecide(routing.EnforcedOf(def, routing.LoadedPolicies{})), got, nil
	})
	harness.WaitFor(t, time.Minute, "the API server refuses again", refused(true))

	// The params deleted: without them the bound policy allows everything,
	// so the guard writes them again from its config file.
	params := &corev1.ConfigMap{}
	key := client.ObjectKey{Namespace: harness.GuardNamespace, Name: nativeconfig.ParamsName}
	require.NoError(t, admin.Get(ctx, key, params))
	want := params.Data
	require.NoError(t, admin.Delete(ctx, params))
	harness.WaitFor(t, time.Minute, "the params written again", func(ctx context.Context) (bool, string, error) {
		got := &corev1.ConfigMap{}
		if err := admin.Get(ctx, key, got); err != nil {
			return false, err.Error(), nil
		}
		return reflect.DeepEqual(got.Data, want), fmt.Sprint(got.Data), nil
	})
	harness.WaitFor(t, time.Minute, "the API server refuses with the params back", refused(true))
}

// condition is the expression of the matchCondition name of the validating
// webhook entry hook.
func condition(ctx context.Context, t *testing.T, c client.Client, hook, name string) string {
	t.Helper()
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	require.NoError(t, c.Get(ctx, client.ObjectKey{Name: "deployguard-validating"}, vwc))
	for _, w := range vwc.Webhooks {
		if w.Name != hook {
			continue
		}
		for _, mc := range w.MatchConditions {
			if mc.Name == name {
				return mc.Expression
			}
		}
	}
	return ""
}

// enforceOperations are the operations of the enforce entry's rules as
// installed.
func enforceOperations(ctx context.Context, t *testing.T, c client.Client) []admissionregistrationv1.OperationType {
	t.Helper()
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	require.NoError(t, c.Get(ctx, client.ObjectKey{Name: "deployguard-validating"}, vwc))
	for _, w := range vwc.Webhooks {
		if w.Name == routing.EnforceWebhook && len(w.Rules) > 0 {
			return w.Rules[0].Operations
		}
	}
	return nil
}

// enforceSelector is the enforce entry's objectSelector, nil when it
// selects every object.
func enforceSelector(ctx context.Context, t *testing.T, c client.Client) *metav1.LabelSelector {
	t.Helper()
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	require.NoError(t, c.Get(ctx, client.ObjectKey{Name: "deployguard-validating"}, vwc))
	for _, w := range vwc.Webhooks {
		if s := w.ObjectSelector; w.Name == routing.EnforceWebhook && s != nil && (len(s.MatchLabels) > 0 || len(s.MatchExpressions) > 0) {
			return s
		}
	}
	return nil
}

func writeManifest(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), strings.ReplaceAll(t.Name(), "/", "-")+".yaml")
	require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
	return p
}

const allDown = `apiVersion: apps/v1
kind: Deployment
metadata: {name: all-down, namespace: shop}
spec:
  replicas: 3
  selector: {matchLabels: {app: all-down}}
  strategy: {type: RollingUpdate, rollingUpdate: {maxUnavailable: 100%, maxSurge: 0}}
  template:
    metadata: {labels: {app: all-down}}
    spec: {containers: [{name: app, image: app:1}]}
`

const noSelector = `apiVersion: apps/v1
kind: Deployment
metadata: {name: no-selector, namespace: shop}
spec:
  replicas: 1
  template:
    metadata: {labels: {version: v1}}
    spec: {containers: [{name: app, image: app:1}]}
`

const repairableSelector = `apiVersion: apps/v1
kind: Deployment
metadata: {name: front, namespace: shop}
spec:
  replicas: 1
  template:
    metadata: {labels: {app.kubernetes.io/name: front, app: shop, app.kubernetes.io/version: "2.0"}}
    spec: {containers: [{name: app, image: app:1}]}
`
