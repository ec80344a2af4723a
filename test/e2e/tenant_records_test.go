package e2e

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler"
	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/test/harness"
)

// A tenant's deletions write records into the guard's namespace, where no
// quota of the tenant's applies. These tests flood it as a tenant (`edit` in
// its namespace) and check that the records of its namespace stay within
// their budget (the e2e guard runs with the defaults:
// reconciler.DefaultRecordsPerNamespace records,
// reconciler.DefaultRecordBytesPerNamespace bytes, one record at most
// reconciler.DefaultMaxRecordBytes), that the oldest go and the tenant is told,
// and that no deletion is refused or held for it.

// recordedDeployment is a Deployment that asks for a record on deletion,
// with payload bytes in an environment variable of its template. It runs no
// pod (nothing completes, so its record holds the Deployment alone).
func recordedDeployment(ns, name string, payload int) *appsv1.Deployment {
	d := harness.Deployment(ns, name, "app:1")
	d.Spec.Replicas = ptr[int32](0)
	d.Annotations = map[string]string{vocab.AnnotationCleanup: "record"}
	if payload > 0 {
		d.Spec.Template.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "PAYLOAD", Value: strings.Repeat("x", payload)}}
	}
	return d
}

// tenantRecords returns the records of namespace ns's deletions in the
// guard's namespace, whole (the test reads their data to check the size the
// guard counts), by the namespace annotation rather than the guard's own
// label, so that a record the label would miss is counted too.
func tenantRecords(ctx context.Context, t *testing.T, ns string) (names []string, bytes int64) {
	t.Helper()
	var list corev1.ConfigMapList
	require.NoError(t, local.Client.List(ctx, &list, client.InNamespace(harness.GuardNamespace), client.MatchingLabels{vocab.LabelRecord: "true"}))
	for i := range list.Items {
		cm := &list.Items[i]
		if cm.Annotations[vocab.AnnotationRecordNamespace] != ns {
			continue
		}
		names = append(names, cm.Annotations[vocab.AnnotationRecordOf])
		bytes += reconciler.RecordBytes(cm)
		assert.Equal(t, strconv.FormatInt(reconciler.RecordBytes(cm), 10), cm.Annotations[vocab.AnnotationRecordBytes], "record %s: the size the budget counts is the data's", cm.Name)
	}
	return names, bytes
}

// waitEdit waits until the tenant's `edit` binding lets it write
// Deployments: at a cluster's start the controller manager aggregates the
// built-in roles a moment after the API server serves them.
func (tn *tenant) waitEdit(t *testing.T) {
	t.Helper()
	harness.WaitFor(t, time.Minute, "the tenant's edit role does not let it create Deployments", func(ctx context.Context) (bool, string, error) {
		review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: tn.ns, Verb: "create", Group: "apps", Resource: "deployments"},
		}}
		if err := tn.c.Create(ctx, review); err != nil {
			return false, "", err
		}
		return review.Status.Allowed, review.Status.Reason, nil
	})
}

// createAndDelete creates the Deployment as the tenant and deletes it as the
// tenant: the delete is never refused, and the Deployment goes.
func (tn *tenant) createAndDelete(t *testing.T, d *appsv1.Deployment) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, tn.c.Create(ctx, d))
	require.NoError(t, tn.c.Delete(ctx, d), "a deletion is never refused for the records' budget")
	waitGone(t, tn.ns, d.Name, time.Minute)
}

// tenantEvent waits for an Event of the guard's about Deployment name, read
// as the tenant (the deleting user), and returns its note.
func (tn *tenant) tenantEvent(t *testing.T, name, reason string) string {
	t.Helper()
	var note string
	harness.WaitFor(t, 30*time.Second, fmt.Sprintf("the tenant sees no %s event about %s", reason, name), func(ctx context.Context) (bool, string, error) {
		// The core API's view of Events, which `kubectl get events` and the
		// built-in roles read.
		var list corev1.EventList
		if err := tn.c.List(ctx, &list, client.InNamespace(tn.ns)); err != nil {
			return false, "", err
		}
		for _, e := range list.Items {
			if e.InvolvedObject.Name == name && e.Reason == reason && strings.Contains(e.ReportingController, "deployguard") {
				note = e.Message + " (" + e.Type + ")"
				return true, "", nil
			}
		}
		return false, fmt.Sprintf("%d events", len(list.Items)), nil
	})
	return note
}

// Deployments of half a MiB created and deleted one after another: the
// bytes budget is reached after eight; each later record makes the oldest
// go, the tenant is told so, and the guard's namespace never holds more than
// the budget for the tenant.
func TestTenantRecordFloodStaysWithinItsBytesBudget(t *testing.T) {
	ctx := context.Background()
	tn := newTenant(t)
	tn.waitEdit(t)
	const payload, n = 500_000, 10
	fits := reconciler.DefaultRecordBytesPerNamespace / payload // records that fit, at most
	for i := range n {
		tn.createAndDelete(t, recordedDeployment(tn.ns, fmt.Sprintf("big-%d", i), payload))
		names, bytes := tenantRecords(ctx, t, tn.ns)
		assert.LessOrEqual(t, bytes, int64(reconciler.DefaultRecordBytesPerNamespace), "after %d deletions: %v", i+1, names)
		assert.LessOrEqual(t, len(names), fits, "after %d deletions", i+1)
		assert.Contains(t, names, fmt.Sprintf("big-%d", i), "the newest record is always kept")
	}
	names, _ := tenantRecords(ctx, t, tn.ns)
	assert.NotContains(t, names, "big-0", "the oldest went")
	assert.Less(t, len(names), n)

	// The deleting user is told which records went, on the Deployment whose
	// deletion made them go.
	note := tn.tenantEvent(t, fmt.Sprintf("big-%d", n-1), vocab.ReasonRecordsEvicted)
	assert.Contains(t, note, "(Warning)")
	assert.Contains(t, note, "cleanup.recordBytesPerNamespace")

	// What is kept restores as it was deleted.
	out, err := guard(ctx, t, "restore", fmt.Sprintf("%s/big-%d", tn.ns, n-1))
	require.NoError(t, err, out)
	got := &appsv1.Deployment{}
	require.NoError(t, local.Client.Get(ctx, client.ObjectKey{Namespace: tn.ns, Name: fmt.Sprintf("big-%d", n-1)}, got))
	assert.Len(t, got.Spec.Template.Spec.Containers[0].Env[0].Value, payload)
}

// More deletions than the count allows, all at once: the records of the
// namespace end at the budget, whatever order the guard wrote them in.
func TestTenantRecordFloodStaysWithinItsCountBudget(t *testing.T) {
	ctx := context.Background()
	tn := newTenant(t)
	tn.waitEdit(t)
	n := reconciler.DefaultRecordsPerNamespace + 4
	for i := range n {
		require.NoError(t, tn.c.Create(ctx, recordedDeployment(tn.ns, fmt.Sprintf("small-%d", i), 0)))
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			errs[i] = tn.c.Delete(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: tn.ns, Name: fmt.Sprintf("small-%d", i)}})
		})
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "deleting small-%d", i)
	}
	for i := range n {
		waitGone(t, tn.ns, fmt.Sprintf("small-%d", i), time.Minute)
	}
	// Every record step is done once its Deployment is gone, and each made
	// room after its write: the namespace is within its budget now.
	names, _ := tenantRecords(ctx, t, tn.ns)
	assert.Len(t, names, reconciler.DefaultRecordsPerNamespace, "%v", names)
}

// A Deployment whose record would be larger than a record may be: no record,
// a Warning the tenant sees, and the deletion completes.
func TestTenantRecordTooLargeIsNotWritten(t *testing.T) {
	ctx := context.Background()
	tn := newTenant(t)
	tn.waitEdit(t)
	kept := recordedDeployment(tn.ns, "kept", 1000)
	tn.createAndDelete(t, kept)
	d := recordedDeployment(tn.ns, "huge", reconciler.DefaultMaxRecordBytes+10_000)
	tn.createAndDelete(t, d)

	note := tn.tenantEvent(t, "huge", vocab.ReasonRecordFailed)
	assert.Contains(t, note, "cleanup.maxRecordBytes")
	assert.Contains(t, note, "(Warning)")
	names, _ := tenantRecords(ctx, t, tn.ns)
	assert.Equal(t, []string{"kept"}, names, "no record of the huge one, and none evicted for it")
	err := local.Client.Get(ctx, client.ObjectKey{Namespace: harness.GuardNamespace, Name: reconciler.RecordName(tn.ns, "huge")}, &corev1.ConfigMap{})
	assert.True(t, apierrors.IsNotFound(err), "%v", err)
}
