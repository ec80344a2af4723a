package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler"
	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/test/harness"
)

// A tenant is a team that deploys with the built-in `edit` ClusterRole in its
// own namespace, and nothing else: it writes Deployments, ReplicaSets and
// their annotations, never deployments/status. These tests act as one
// (impersonation of a ServiceAccount bound to `edit`), with the platform
// team's enforced policies in place, and check that nothing it writes turns
// the guard off, chooses what the guard restores, or skips a policy.

type tenant struct {
	ns   string
	user string
	c    client.Client
}

// newTenant makes a namespace whose ServiceAccount "tenant" holds `edit`
// there, and a client that acts as it.
func newTenant(t *testing.T) *tenant {
	t.Helper()
	ctx := context.Background()
	ns := harness.NewNamespace(t, local.Client)
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "tenant", Namespace: ns}}
	require.NoError(t, local.Client.Create(ctx, sa))
	require.NoError(t, local.Client.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "tenant-edit", Namespace: ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "edit"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "tenant", Namespace: ns}},
	}))
	cfg, err := local.Cluster.RESTConfig()
	require.NoError(t, err)
	user := fmt.Sprintf("system:serviceaccount:%s:tenant", ns)
	cfg.Impersonate.UserName = user
	cfg.Impersonate.Groups = []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}
	c, err := client.New(cfg, client.Options{Scheme: local.Scheme})
	require.NoError(t, err)
	return &tenant{ns: ns, user: user, c: c}
}

// update changes the tenant's Deployment as the tenant.
func (tn *tenant) update(t *testing.T, name string, mutate func(*appsv1.Deployment)) {
	t.Helper()
	require.NoError(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		d := &appsv1.Deployment{}
		if err := tn.c.Get(context.Background(), client.ObjectKey{Namespace: tn.ns, Name: name}, d); err != nil {
			return err
		}
		mutate(d)
		return tn.c.Update(context.Background(), d)
	}))
}

// kubectl runs the cluster's kubectl as the tenant.
func (tn *tenant) kubectl(ctx context.Context, t *testing.T, args ...string) string {
	t.Helper()
	tools, err := harness.ToolsDir("kubectl")
	require.NoError(t, err)
	cmd := exec.CommandContext(ctx, filepath.Join(tools, "kubectl"), append([]string{"-n", tn.ns, "--as", tn.user}, args...)...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+local.Cluster.Kubeconfig)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	return string(out)
}

func ledgerOf(d *appsv1.Deployment) rollout.Ledger {
	l, _ := rollout.ReadLedger(d)
	return l
}

// waitLedger waits until the Deployment's ledger satisfies cond.
func waitLedger(t *testing.T, ns, name, msg string, timeout time.Duration, cond func(rollout.Ledger, *appsv1.Deployment) bool) *appsv1.Deployment {
	t.Helper()
	var d *appsv1.Deployment
	harness.WaitFor(t, timeout, msg, func(ctx context.Context) (bool, string, error) {
		got := &appsv1.Deployment{}
		if err := local.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, got); err != nil {
			// The client's rate limit near the deadline: the last state
			// seen stays the message.
			if d == nil {
				return false, err.Error(), nil
			}
			return false, describe(d), nil
		}
		d = got
		return cond(ledgerOf(d), d), describe(d), nil
	})
	return d
}

func knownGoodAt(revision int64) func(rollout.Ledger, *appsv1.Deployment) bool {
	return func(l rollout.Ledger, d *appsv1.Deployment) bool {
		n := l.Newest()
		return n != nil && n.Revision == revision && completed(d)
	}
}

// Every annotation the guard read in earlier releases, forged by the tenant
// on its Deployment and on the failing ReplicaSet, changes nothing: the bad
// rollout is rolled back to the revision that completed, and the tenant
// cannot write the status where the guard keeps its facts.
func TestTenantForgedAnnotationsStopNoRollback(t *testing.T) {
	ctx := context.Background()
	tn := newTenant(t)
	require.NoError(t, tn.c.Create(ctx, harness.Deployment(tn.ns, "web", "app:1", shortDeadline)))
	waitLedger(t, tn.ns, "web", "revision 1 was not recorded known-good", time.Minute, knownGoodAt(1))

	// What the guard keeps is out of the tenant's reach.
	d := get(ctx, t, tn.ns, "web")
	patch := client.MergeFrom(d.DeepCopy())
	d.Status.Conditions = nil
	err := tn.c.Status().Patch(ctx, d, patch)
	require.True(t, apierrors.IsForbidden(err), "a tenant cannot write deployments/status: %v", err)

	forged := map[string]string{
		vocab.LegacyAnnotationFailFastRevision:   "2",
		vocab.LegacyAnnotationRolledBackRevision: "2",
		vocab.LegacyAnnotationHandledDeadline:    "2100-01-01T00:00:00Z",
		vocab.LegacyAnnotationFailingSince:       "2100-01-01T00:00:00Z web-x",
		vocab.LegacyAnnotationKnownGoodRevision:  "2",
		vocab.LegacyAnnotationRolledBackTo:       "web-x",
		vocab.LegacyAnnotationKnownGood:          "2000-01-01T00:00:00Z",
		vocab.Domain + "/cached-template-hash":   "forged",
		// A word for people only (reconciler/README.md, "The ledger"). The
		// other speed bumps a tenant may set on its own Deployment (the
		// quarantine list and labels, the drain's annotations) are
		// documented there and tested in the reconciler's unit tests.
		vocab.AnnotationRollbackStatus: "forged",
	}
	tn.update(t, "web", func(d *appsv1.Deployment) {
		for k, v := range forged {
			metav1.SetMetaDataAnnotation(&d.ObjectMeta, k, v)
		}
		// An image that does not exist: fail-fast's evidence (the
		// forged fail-fast-revision once stopped it silently), and the
		// deadline's too.
		d.Spec.Template.Spec.Containers[0].Image = "app:no-such-tag-forged"
	})
	// The mark as an earlier release wrote it, naming the failing
	// ReplicaSet's own pod-template-hash: written on the Deployment, which
	// the Deployment controller copies onto that ReplicaSet (the issue's
	// attack; a mark written on the ReplicaSet itself is in the reconciler's
	// unit tests).
	var failing appsv1.ReplicaSet
	harness.WaitFor(t, time.Minute, "no ReplicaSet of revision 2", func(ctx context.Context) (bool, string, error) {
		var list appsv1.ReplicaSetList
		if err := tn.c.List(ctx, &list, client.InNamespace(tn.ns)); err != nil {
			return false, "", err
		}
		for _, rs := range list.Items {
			if rs.Annotations[vocab.RevisionAnnotation] == "2" {
				failing = rs
				return true, "", nil
			}
		}
		return false, fmt.Sprint(len(list.Items), " ReplicaSets"), nil
	})
	tn.update(t, "web", func(d *appsv1.Deployment) {
		metav1.SetMetaDataAnnotation(&d.ObjectMeta, vocab.LegacyAnnotationKnownGoodHash, failing.Labels[appsv1.DefaultDeploymentUniqueLabelKey])
		// The words of a held rollback, which once held it: the hold is
		// read from the ledger only (the exact deadline's words are in the
		// reconciler's unit tests).
		metav1.SetMetaDataAnnotation(&d.ObjectMeta, vocab.AnnotationRollbackStatus, fmt.Sprintf(
			"Revision 2 (ReplicaSet %s) exceeded its progress deadline, but its new pods fail only transiently", failing.Name))
	})

	got := waitLedger(t, tn.ns, "web", "the forged annotations stopped the rollback of revision 2", time.Duration(deadline+60)*time.Second,
		func(l rollout.Ledger, d *appsv1.Deployment) bool { return l.RolledBackRevision == 2 })
	assert.Equal(t, "app:1", got.Spec.Template.Spec.Containers[0].Image, "rolled back to the revision that completed")
	assert.Equal(t, "2", got.Labels[vocab.LabelRolledBack])
	l := ledgerOf(got)
	for _, e := range l.KnownGood {
		assert.NotEqual(t, failing.UID, e.UID, "the failing ReplicaSet never became known-good")
	}
	// And the guard said, once, that it ignores what was forged.
	assert.Contains(t, guardEventWithin(t, tn.ns, "web", vocab.ReasonAnnotationsIgnored, time.Minute), vocab.LegacyAnnotationFailFastRevision)
}

// The guard restores a template under its own identity, so it asks the
// policies first: a known-good template that an enforced policy refuses
// today is reported, never restored.
func TestRollbackNeverRestoresATemplateThePoliciesRefuse(t *testing.T) {
	ctx := context.Background()
	tn := newTenant(t)
	d := harness.Deployment(tn.ns, "net", "app:1", shortDeadline)
	d.Spec.Template.Spec.HostNetwork = true
	require.NoError(t, tn.c.Create(ctx, d))
	waitLedger(t, tn.ns, "net", "revision 1 was not recorded known-good", time.Minute, knownGoodAt(1))

	hotLoadPolicy(ctx, t, "e2e-tenant-hostnetwork", "hostnetwork.rego", fmt.Sprintf(`# METADATA
# custom:
#   mode: enforce
package deployguard.e2ehostnetwork

import rego.v1

deny contains {"msg": "host networking is not allowed", "field": "spec.template.spec.hostNetwork"} if {
	input.object.metadata.namespace == %q
	input.object.spec.template.spec.hostNetwork
}
`, tn.ns))
	// In force once the tenant's own write of it is refused.
	harness.WaitFor(t, time.Minute, "the policy was never enforced", func(ctx context.Context) (bool, string, error) {
		d := get(ctx, t, tn.ns, "net")
		d.Spec.Template.Labels["try"] = "1"
		err := tn.c.Update(ctx, d, client.DryRunAll)
		return err != nil && strings.Contains(err.Error(), "host networking is not allowed"), fmt.Sprint(err), nil
	})

	tn.update(t, "net", func(d *appsv1.Deployment) {
		d.Spec.Template.Spec.HostNetwork = false
		breakTemplate(&d.Spec.Template, "app:2-typo")
	})
	msg := guardEventWithin(t, tn.ns, "net", vocab.ReasonRollbackRefused, time.Duration(deadline+60)*time.Second)
	assert.Contains(t, msg, "host networking is not allowed", "the Event says which policy refuses the restore")
	got := get(ctx, t, tn.ns, "net")
	assert.False(t, got.Spec.Template.Spec.HostNetwork, "the refused template was not restored")
	assert.Equal(t, "app:2-typo", got.Spec.Template.Spec.Containers[0].Image)
	assert.Zero(t, ledgerOf(got).RolledBackRevision, "nothing was rolled back")
}

// kubectl rollout undo copies a ReplicaSet's annotations onto the
// Deployment, and the Deployment controller copies the Deployment's onto
// each new ReplicaSet: nothing of that reaches what the guard believes. After
// an undo and three rollouts, one bad, each fact was recorded once, and the
// guard then keeps quiet.
func TestRolloutUndoThenRolloutsRecordEachFactOnce(t *testing.T) {
	ctx := context.Background()
	tn := newTenant(t)
	require.NoError(t, tn.c.Create(ctx, harness.Deployment(tn.ns, "undo", "app:1", shortDeadline)))
	waitLedger(t, tn.ns, "undo", "revision 1 was not recorded known-good", time.Minute, knownGoodAt(1))
	tn.update(t, "undo", func(d *appsv1.Deployment) { d.Spec.Template.Spec.Containers[0].Image = "app:2" })
	waitLedger(t, tn.ns, "undo", "revision 2 was not recorded known-good", time.Minute, knownGoodAt(2))

	tn.kubectl(ctx, t, "rollout", "undo", "deployment/undo")
	waitLedger(t, tn.ns, "undo", "the undone revision was not recorded known-good", time.Minute, knownGoodAt(3))
	tn.update(t, "undo", func(d *appsv1.Deployment) { d.Spec.Template.Spec.Containers[0].Image = "app:4" })
	waitLedger(t, tn.ns, "undo", "revision 4 was not recorded known-good", time.Minute, knownGoodAt(4))
	tn.update(t, "undo", breakImage("app:5-typo"))
	waitLedger(t, tn.ns, "undo", "revision 5 was not rolled back", time.Duration(deadline+60)*time.Second,
		func(l rollout.Ledger, d *appsv1.Deployment) bool {
			return l.RolledBackRevision == 5 && knownGoodAt(6)(l, d)
		})
	// The restored template is revision 6; it is recorded before the fix
	// moves on, or its Event would rightly never be told.
	tn.update(t, "undo", func(d *appsv1.Deployment) {
		d.Spec.Template = harness.Deployment(tn.ns, "undo", "app:7", shortDeadline).Spec.Template
	})
	final := waitLedger(t, tn.ns, "undo", "the fixed revision was not recorded known-good", time.Minute, func(l rollout.Ledger, d *appsv1.Deployment) bool {
		rev, _ := rollout.Revision(d)
		n := l.Newest()
		return n != nil && n.Revision == rev && rev >= 7 && completed(d)
	})

	// The fix's Event is told after its ledger write; the quiet minute
	// starts once it is there.
	finalRevision, _ := rollout.Revision(final)
	harness.WaitFor(t, time.Minute, "no Event for the fixed revision", func(ctx context.Context) (bool, string, error) {
		notes := guardEvents(ctx, t, tn.ns, "undo", vocab.ReasonKnownGood)
		return slices.ContainsFunc(notes, func(n string) bool { return strings.HasPrefix(n, fmt.Sprintf("Revision %d ", finalRevision)) }), fmt.Sprint(notes), nil
	})
	// And the rollback's verdict has ended (the fix is a new template): its
	// label, its condition and the ledger's record of it are gone.
	waitLedger(t, tn.ns, "undo", "the rollback's verdict did not end", time.Minute, func(l rollout.Ledger, d *appsv1.Deployment) bool {
		_, labelled := d.Labels[vocab.LabelRolledBack]
		return !labelled && l.RolledBackTo == "" && rollout.StalledIndex(&d.Status) < 0
	})
	var now eventsv1.EventList
	require.NoError(t, local.Client.List(ctx, &now, client.InNamespace(tn.ns)))
	from := &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: now.ResourceVersion}}

	// Over a quiet minute, nothing changes: no write, no Event.
	cfg, err := local.Cluster.RESTConfig()
	require.NoError(t, err)
	wc, err := client.NewWithWatch(cfg, client.Options{Scheme: local.Scheme})
	require.NoError(t, err)
	w, err := wc.Watch(ctx, &appsv1.DeploymentList{}, client.InNamespace(tn.ns), from)
	require.NoError(t, err)
	rsw, err := wc.Watch(ctx, &appsv1.ReplicaSetList{}, client.InNamespace(tn.ns), from)
	require.NoError(t, err)
	evw, err := wc.Watch(ctx, &eventsv1.EventList{}, client.InNamespace(tn.ns), from)
	require.NoError(t, err)
	quiet := time.After(time.Minute)
	var changes []string
loop:
	for {
		select {
		case ev := <-w.ResultChan():
			if d, ok := ev.Object.(*appsv1.Deployment); ok && ev.Type != watch.Bookmark {
				changes = append(changes, fmt.Sprintf("Deployment %s at %s: %s", ev.Type, d.ResourceVersion, writers(d.ManagedFields)))
			}
		case ev := <-rsw.ResultChan():
			if ev.Type != watch.Bookmark {
				if o, ok := ev.Object.(metav1.Object); ok {
					changes = append(changes, fmt.Sprintf("ReplicaSet %s %s: %s", o.GetName(), ev.Type, writers(o.GetManagedFields())))
				}
			}
		case ev := <-evw.ResultChan():
			if e, ok := ev.Object.(*eventsv1.Event); ok && ev.Type == watch.Added && strings.Contains(e.ReportingController, "deployguard") {
				changes = append(changes, fmt.Sprintf("Event %s: %s", e.Reason, e.Note))
			}
		case <-quiet:
			break loop
		}
	}
	w.Stop()
	rsw.Stop()
	evw.Stop()
	assert.Empty(t, changes, "the guard and the Deployment controller stop writing once the rollouts are done")

	// Each revision recorded known-good once, whatever was copied around.
	counts := map[string]int{}
	for _, e := range guardEvents(ctx, t, tn.ns, "undo", vocab.ReasonKnownGood) {
		counts[e]++
	}
	for note, n := range counts {
		assert.Equal(t, 1, n, "recorded once: %s", note)
	}
	// Revisions 1, 2, 3 (the undo), 4, 6 (revision 4's ReplicaSet, restored)
	// and 7 (the fix) completed.
	assert.Len(t, counts, 6, "one Event per completed revision: %v", counts)
}

// guardEvents returns the notes of the guard's Events of reason about the
// Deployment.
func guardEvents(ctx context.Context, t *testing.T, ns, name, reason string) []string {
	t.Helper()
	var list eventsv1.EventList
	require.NoError(t, local.Client.List(ctx, &list, client.InNamespace(ns)))
	var out []string
	for _, e := range list.Items {
		if e.Regarding.Name == name && e.Reason == reason && strings.Contains(e.ReportingController, "deployguard") {
			out = append(out, e.Note)
		}
	}
	return out
}

// Enforced policies judge a tenant's DELETE, with the Deployment being
// deleted as oldObject.
func TestEnforcedPolicyJudgesATenantsDelete(t *testing.T) {
	ctx := context.Background()
	tn := newTenant(t)
	d := harness.Deployment(tn.ns, "payments", "app:1", shortDeadline)
	d.Labels = map[string]string{"tier": "critical"}
	require.NoError(t, tn.c.Create(ctx, d))
	hotLoadPolicy(ctx, t, "e2e-tenant-critical", "critical.rego", fmt.Sprintf(`# METADATA
# custom:
#   mode: enforce
package deployguard.e2ecritical

import rego.v1

deny contains "a tier: critical Deployment may not be deleted: remove the label first if it is no longer critical" if {
	input.operation == "DELETE"
	input.oldObject.metadata.namespace == %q
	input.oldObject.metadata.labels.tier == "critical"
}
`, tn.ns))
	harness.WaitFor(t, time.Minute, "the tenant's delete was never refused", func(ctx context.Context) (bool, string, error) {
		err := tn.c.Delete(ctx, d.DeepCopy(), client.DryRunAll)
		return err != nil && strings.Contains(err.Error(), "may not be deleted"), fmt.Sprint(err), nil
	})
	err := tn.c.Delete(ctx, d.DeepCopy())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "may not be deleted")
	require.NoError(t, local.Client.Get(ctx, client.ObjectKeyFromObject(d), &appsv1.Deployment{}), "still there")
}

// The webhook port answers any pod that reaches it. With the API server
// presenting its client certificate (the local cluster runs so), a flood of
// admission reviews from anyone else is refused before any admission work,
// and the API server's own calls go on being answered.
func TestFloodOnTheWebhookPortFromOutsideTheAPIServer(t *testing.T) {
	ctx := context.Background()
	tn := newTenant(t)
	review := fmt.Sprintf(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"x","kind":{"group":"apps","version":"v1","kind":"Deployment"},"resource":{"group":"apps","version":"v1","resource":"deployments"},"operation":"DELETE","namespace":%q,"name":"web","oldObject":{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"web","namespace":%q}}}}`, tn.ns, tn.ns)
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig:     &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}, //nolint:gosec // the caller is the attacker here
		MaxIdleConnsPerHost: 16,
	}}
	url := fmt.Sprintf("https://127.0.0.1:%d", local.Guard.Opts.WebhookPort)
	var (
		mu     sync.Mutex
		status = map[int]int{}
		wg     sync.WaitGroup
	)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				for _, path := range []string{"/validate-apps-v1-deployment", "/mutate-apps-v1-deployment", "/mutate-apps-v1-deployment-status"} {
					resp, err := hc.Post(url+path, "application/json", strings.NewReader(review))
					code := -1
					if err == nil {
						code = resp.StatusCode
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					}
					mu.Lock()
					status[code]++
					mu.Unlock()
				}
			}
		}()
	}
	// Meanwhile the tenant deploys, through the API server and the guard,
	// whose own check refuses a second Deployment over the same pods.
	require.NoError(t, tn.c.Create(ctx, harness.Deployment(tn.ns, "web", "app:1", shortDeadline)))
	harness.WaitFor(t, time.Minute, "the guard never judged the overlapping Deployment", func(ctx context.Context) (bool, string, error) {
		twin := harness.Deployment(tn.ns, "web-twin", "app:1", shortDeadline)
		twin.Spec.Selector.MatchLabels = map[string]string{"app.kubernetes.io/name": "web"}
		twin.Spec.Template.Labels = map[string]string{"app.kubernetes.io/name": "web"}
		err := tn.c.Create(ctx, twin, client.DryRunAll)
		return err != nil && strings.Contains(err.Error(), `also selects the pods of Deployment "web"`), fmt.Sprint(err), nil
	})
	wg.Wait()
	assert.Equal(t, map[int]int{http.StatusForbidden: 8 * 50 * 3}, status, "every request without the API server's client certificate is refused")
	waitAvailable(t, tn.ns, "web", time.Minute)
}

// Revision 1 ran with host networking, revision 2 without; both completed.
// The platform team then enforces "no host network". A tenant who deletes
// revision 2's ReplicaSet (edit may) and starts a bad rollout gets no
// rollback to revision 1: the guard restores only the newest known-good
// revision, as it completed, and says why it restores nothing.
func TestTenantDeletingTheKnownGoodReplicaSetChoosesNoOlderTemplate(t *testing.T) {
	ctx := context.Background()
	tn := newTenant(t)
	d := harness.Deployment(tn.ns, "hop", "app:1", shortDeadline)
	d.Spec.Template.Spec.HostNetwork = true
	require.NoError(t, tn.c.Create(ctx, d))
	waitLedger(t, tn.ns, "hop", "revision 1 was not recorded known-good", time.Minute, knownGoodAt(1))
	tn.update(t, "hop", func(d *appsv1.Deployment) {
		d.Spec.Template.Spec.HostNetwork = false
		d.Spec.Template.Spec.Containers[0].Image = "app:2"
	})
	waitLedger(t, tn.ns, "hop", "revision 2 was not recorded known-good", time.Minute, knownGoodAt(2))

	// A bad rollout, and revision 2's ReplicaSet (now an old one) deleted
	// before its deadline.
	tn.update(t, "hop", breakImage("app:3-typo"))
	var rss appsv1.ReplicaSetList
	require.NoError(t, tn.c.List(ctx, &rss, client.InNamespace(tn.ns)))
	deleted := 0
	for i := range rss.Items {
		if rss.Items[i].Annotations[vocab.RevisionAnnotation] == "2" {
			require.NoError(t, tn.c.Delete(ctx, &rss.Items[i]), "a tenant may delete its ReplicaSets")
			deleted++
		}
	}
	require.Equal(t, 1, deleted)
	msg := guardEventWithin(t, tn.ns, "hop", vocab.ReasonNoKnownGoodRevision, time.Duration(deadline+60)*time.Second)
	assert.Contains(t, msg, "the guard restores only the newest known-good revision")
	got := get(ctx, t, tn.ns, "hop")
	assert.False(t, got.Spec.Template.Spec.HostNetwork, "revision 1's template was not restored")
	assert.Equal(t, "app:3-typo", got.Spec.Template.Spec.Containers[0].Image)
	assert.Zero(t, ledgerOf(got).RolledBackRevision)
}

// writers names who last wrote what, from managedFields, for a failure
// message: manager, operation, subresource and time of each entry.
func writers(mf []metav1.ManagedFieldsEntry) string {
	var out []string
	for _, e := range mf {
		at := ""
		if e.Time != nil {
			at = e.Time.UTC().Format(time.RFC3339)
		}
		out = append(out, fmt.Sprintf("%s %s %s %s", e.Manager, e.Operation, e.Subresource, at))
	}
	return strings.Join(out, "; ")
}

// A guard of this release taking over from an earlier one, which kept its
// known-good marks in annotations: the Deployments that existed before it
// first ran keep their history. Here the earlier release's state is written
// as it wrote it, on a Deployment the guard has not seen (its namespace was
// opted out), and the guard's first run is moved to now; the failed rollout
// is then rolled back to the revision the earlier release recorded. Last in
// the tier: it restarts the guard twice.
func TestTakeoverFromAnEarlierReleaseKeepsItsHistory(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, local.Client, harness.NamespaceLabels(map[string]string{vocab.LabelGuard: vocab.LabelGuardDisabled}))
	require.NoError(t, local.Client.Create(ctx, harness.Deployment(ns, "old", "app:1", shortDeadline)))
	waitAvailable(t, ns, "old", time.Minute)

	// Revision 1 completed: the earlier release marked its ReplicaSet, and
	// the Deployment.
	var rss appsv1.ReplicaSetList
	require.NoError(t, local.Client.List(ctx, &rss, client.InNamespace(ns)))
	require.Len(t, rss.Items, 1)
	rs1 := rss.Items[0]
	require.NoError(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		rs := &appsv1.ReplicaSet{}
		if err := local.Client.Get(ctx, client.ObjectKeyFromObject(&rs1), rs); err != nil {
			return err
		}
		metav1.SetMetaDataAnnotation(&rs.ObjectMeta, vocab.LegacyAnnotationKnownGood, time.Now().UTC().Format(time.RFC3339))
		metav1.SetMetaDataAnnotation(&rs.ObjectMeta, vocab.LegacyAnnotationKnownGoodHash, rs.Labels[appsv1.DefaultDeploymentUniqueLabelKey])
		return local.Client.Update(ctx, rs)
	}))
	require.NoError(t, update(t, ns, "old", func(d *appsv1.Deployment) {
		metav1.SetMetaDataAnnotation(&d.ObjectMeta, vocab.LegacyAnnotationKnownGoodRevision, "1")
	}))
	// Revision 2 fails its deadline while no guard looks.
	require.NoError(t, update(t, ns, "old", breakImage("app:2")))
	waitDeadlineExceeded(t, ns, "old")

	// This release runs for the first time now.
	since := &corev1.ConfigMap{}
	key := client.ObjectKey{Namespace: harness.GuardNamespace, Name: reconciler.LedgerSinceConfigMap}
	require.NoError(t, local.Client.Get(ctx, key, since))
	was := since.Data["since"]
	// The platform team asks for the takeover (reconciler.LedgerAdoptKey):
	// without it, nothing is adopted.
	setSince := func(v string, adopt bool) {
		require.NoError(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cm := &corev1.ConfigMap{}
			if err := local.Client.Get(ctx, key, cm); err != nil {
				return err
			}
			cm.Data["since"] = v
			delete(cm.Data, reconciler.LedgerAdoptKey)
			if adopt {
				cm.Data[reconciler.LedgerAdoptKey] = "true"
			}
			return local.Client.Update(ctx, cm)
		}))
	}
	setSince(time.Now().UTC().Add(time.Second).Format(time.RFC3339), true)
	t.Cleanup(func() {
		setSince(was, false)
		require.NoError(t, local.RestartGuard(context.Background()))
	})
	// Restarted first, so that it reads the new time before it sees the
	// namespace.
	require.NoError(t, local.RestartGuard(ctx))
	nsObj := &corev1.Namespace{}
	require.NoError(t, local.Client.Get(ctx, client.ObjectKey{Name: ns}, nsObj))
	delete(nsObj.Labels, vocab.LabelGuard)
	require.NoError(t, local.Client.Update(ctx, nsObj))

	d := waitLedger(t, ns, "old", "the earlier release's known-good revision was not rolled back to", time.Duration(deadline+60)*time.Second,
		func(l rollout.Ledger, d *appsv1.Deployment) bool { return l.RolledBackRevision == 2 })
	assert.Equal(t, "app:1", d.Spec.Template.Spec.Containers[0].Image)
	l := ledgerOf(d)
	require.NotEmpty(t, l.KnownGood)
	assert.Equal(t, rs1.UID, l.KnownGood[0].UID, "the earlier release's mark, adopted")
}

// What the guard keeps of every Deployment in memory is bounded for a
// tenant: a create with more labels on its pod template than a Deployment
// may carry is refused by the API server itself, in words that say what to
// move, and so is an update that grows its labels past the bound.
func TestATenantCannotGrowWhatTheGuardKeeps(t *testing.T) {
	ctx := context.Background()
	tn := newTenant(t)
	labels := func(n int) map[string]string {
		m := map[string]string{}
		for i := range n {
			m[fmt.Sprintf("team.example.com/l-%d", i)] = "v"
		}
		return m
	}
	big := harness.Deployment(tn.ns, "big", "app:1", shortDeadline)
	for k, v := range labels(64) {
		big.Spec.Template.Labels[k] = v
	}
	err := tn.c.Create(ctx, big)
	require.Error(t, err, "a pod template of 65 labels")
	assert.Contains(t, err.Error(), "ValidatingAdmissionPolicy 'deployguard-refusals'")
	assert.Contains(t, err.Error(), "spec.template.metadata.labels: 65 labels besides deployguard's, more than the 64 a pod template may carry")

	d := harness.Deployment(tn.ns, "small", "app:1", shortDeadline)
	d.Labels = labels(64)
	require.NoError(t, tn.c.Create(ctx, d), "64 labels are admitted")
	// A patch, not a read and an update: the controllers write the
	// Deployment meanwhile.
	err = tn.c.Patch(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: tn.ns, Name: "small"}},
		client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"team.example.com/one-more":"v"}}}`)))
	require.Error(t, err, "a 65th label")
	assert.Contains(t, err.Error(), "metadata.labels: 65 labels besides deployguard's, more than the 64 a Deployment may carry")

	// A PodDisruptionBudget's selector, which the budget index would keep
	// whole: one of 65 terms is kept by no guard replica, and the budget's
	// webhook says so where the tenant looks (warn mode admits it).
	terms := make([]string, 0, 65)
	for k, v := range labels(65) {
		terms = append(terms, fmt.Sprintf("%s: %s", k, v))
	}
	manifest := filepath.Join(t.TempDir(), "budget.yaml")
	require.NoError(t, os.WriteFile(manifest, []byte(fmt.Sprintf(
		"apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: wide}\nspec:\n  maxUnavailable: 1\n  selector: {matchLabels: {%s}}\n",
		strings.Join(terms, ", "))), 0o600))
	out := tn.kubectl(ctx, t, "apply", "-f", manifest)
	assert.Contains(t, out, "Warning: spec.selector: 65 terms (match labels, expressions and their values), more than the 64 deployguard keeps of a PodDisruptionBudget's selector")
	assert.Contains(t, out, "poddisruptionbudget.policy/wide created")
	// The platform team sees it on the guard's metrics, until it is gone.
	unjudged := func(want string) {
		t.Helper()
		harness.WaitFor(t, time.Minute, "deployguard_disruption_budgets_unjudged never read "+want, func(context.Context) (bool, string, error) {
			code, body, err := local.Guard.Scrape()
			if err != nil || code != http.StatusOK {
				return false, fmt.Sprintf("scrape: %d %v", code, err), nil
			}
			for _, line := range strings.Split(body, "\n") {
				if strings.HasPrefix(line, "deployguard_disruption_budgets_unjudged ") {
					return line == "deployguard_disruption_budgets_unjudged "+want, line, nil
				}
			}
			return false, "no deployguard_disruption_budgets_unjudged series", nil
		})
	}
	unjudged("1")
	require.NoError(t, tn.c.Delete(ctx, &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: tn.ns, Name: "wide"}}))
	unjudged("0")
}
