package status

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/deployguard/deployguard/cmd/deployguard/cli"
	"github.com/deployguard/deployguard/cmd/deployguard/commands/internal/fixtures"
	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
)

var statusNow = fixtures.Now

func withAnnotation(rs appsv1.ReplicaSet, k, v string) appsv1.ReplicaSet {
	rs.Annotations[k] = v
	return rs
}

// withLedger changes d's ledger as the guard would have written it.
func withLedger(d *appsv1.Deployment, change func(*rollout.Ledger)) {
	l, _ := rollout.ReadLedger(d)
	change(&l)
	rollout.SetLedger(&d.Status, l, statusNow)
}

func statusEvent(d *appsv1.Deployment, at time.Time, typ, reason, note string) eventsv1.Event {
	return eventsv1.Event{
		EventTime:           metav1.NewMicroTime(at),
		Regarding:           corev1.ObjectReference{Kind: "Deployment", Namespace: d.Namespace, Name: d.Name, UID: d.UID},
		ReportingController: "deployguard.io/reconciler",
		Type:                typ, Reason: reason, Note: note,
	}
}

func TestBuildStatus(t *testing.T) {
	failedTemplate := func(d *appsv1.Deployment) string {
		c := d.Spec.Template.DeepCopy()
		c.Spec.Containers[0].Image = "web:2"
		return vocab.TemplateHash(c)
	}

	tests := []struct {
		name  string
		input func() statusInput
		check func(t *testing.T, st deploymentStatus, text string)
	}{
		{
			name: "after a fail-fast rollback: known-good, failed and quarantined revisions, the override",
			input: func() statusInput {
				d := fixtures.Deployment("web:1", nil)
				h := failedTemplate(d)
				d.Annotations = map[string]string{
					vocab.RevisionAnnotation:             "3",
					vocab.AnnotationQuarantinedTemplates: h,
					vocab.AnnotationRollbackStatus:       "Rolled back from revision 2 (ReplicaSet web-b): 2/2 new pods ImagePullBackOff for 30s (container app, image web:2), to known-good revision 1 (ReplicaSet web-a).",
				}
				withLedger(d, func(l *rollout.Ledger) { l.RolledBackRevision, l.RolledBackTo, l.FailFastRevision = 2, "web-a", 2 })
				other := fixtures.Deployment("x:1", nil)
				other.Name, other.UID = "other", "other-uid"
				return statusInput{
					Deployment: d,
					ReplicaSets: []appsv1.ReplicaSet{
						fixtures.ReplicaSet(d, "web-b", "b", "web:2", "2", false, 0),
						withAnnotation(fixtures.ReplicaSet(d, "web-a", "a", "web:1", "3", true, 2), "deployment.kubernetes.io/revision-history", "1"),
						fixtures.ReplicaSet(other, "other-x", "x", "x:1", "1", true, 1),
					},
					Events: []eventsv1.Event{
						statusEvent(d, statusNow.Add(-2*time.Minute), corev1.EventTypeNormal, vocab.ReasonKnownGood, "Revision 1 (ReplicaSet web-a) completed its rollout; recorded as known-good"),
						statusEvent(d, statusNow.Add(-time.Minute), corev1.EventTypeNormal, vocab.ReasonAutoRollback, d.Annotations[vocab.AnnotationRollbackStatus]),
						statusEvent(other, statusNow, corev1.EventTypeWarning, vocab.ReasonRolloutFailing, "Revision 1 (ReplicaSet other-x) is failing"),
					},
				}
			},
			check: func(t *testing.T, st deploymentStatus, text string) {
				require.Len(t, st.Revisions, 2, "only this Deployment's ReplicaSets, by owner")
				require.NotNil(t, st.Verdict, "the rollback stands: the Deployment reads as failed")
				assert.Equal(t, "2", st.Verdict.FailedRevision)
				assert.Equal(t, "kubectl annotate deployment -n shop web deployguard.io/accept-rollback=2", st.Verdict.Accept)
				assert.Contains(t, text, "Reads as failed (Stalled): revision 2 was rolled back and is not running.")
				assert.Equal(t, int64(3), st.Revision)
				assert.Equal(t, "3", st.KnownGoodRevision)
				b, a := st.Revisions[0], st.Revisions[1]
				assert.Equal(t, "web-b", b.ReplicaSet)
				require.NotNil(t, b.Failure)
				assert.Equal(t, "fail-fast", b.Failure.By)
				assert.Equal(t, vocab.ReasonAutoRollback, b.Failure.Reason)
				assert.True(t, b.Quarantined)
				assert.False(t, b.Current)
				assert.True(t, a.Current)
				assert.True(t, a.KnownGood)
				assert.Equal(t, statusNow.Add(-time.Hour).Format(time.RFC3339), a.KnownGoodAt, "when the guard recorded it")
				assert.Nil(t, a.Failure)
				require.Len(t, st.Quarantined, 1)
				assert.Equal(t, []string{"web-b"}, st.Quarantined[0].ReplicaSets)
				assert.Equal(t, vocab.AnnotationAllowTemplate+"="+b.TemplateHash, st.Quarantined[0].Override)
				assert.Equal(t, "complete", st.Rollout.State)
				assert.Nil(t, st.Cleanup)
				assert.Len(t, st.Events, 2, "the other Deployment's event is not shown")

				assert.Regexp(t, `2\s+web-b\s+0/0\s+failed \(fail-fast\),quarantined\s+web:2`, text)
				assert.Regexp(t, `3\s+web-a\s+2/2\s+current,known-good,was 1\s+web:1`, text)
				assert.Contains(t, text, "apply it with the annotation "+vocab.AnnotationAllowTemplate+"="+b.TemplateHash)
				assert.Contains(t, text, "2 (web-b), fail-fast: Rolled back from revision 2")
			},
		},
		{
			name: "the config each revision runs with: kept at known-good, and the snapshot a restored revision reads",
			input: func() statusInput {
				d := fixtures.Deployment("web:1", map[string]string{vocab.RevisionAnnotation: "3"})
				envFrom := func(rs *appsv1.ReplicaSet, names ...string) {
					for _, n := range names {
						rs.Spec.Template.Spec.Containers[0].EnvFrom = append(rs.Spec.Template.Spec.Containers[0].EnvFrom,
							corev1.EnvFromSource{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: n}}})
					}
				}
				rs1 := fixtures.ReplicaSet(d, "web-a", "a", "web:1", "1", false, 0)
				envFrom(&rs1, "cfg", "big")
				rs2 := fixtures.ReplicaSet(d, "web-b", "b", "web:2", "2", false, 0)
				envFrom(&rs2, "cfg")
				rs3 := fixtures.ReplicaSet(d, "web-c", "c", "web:1", "3", false, 2)
				envFrom(&rs3, "cfg-dg-0123456789", "big")
				withLedger(d, func(l *rollout.Ledger) {
					*l = l.WithKnownGood(&rs1, 1, statusNow).WithConfig(rs1.UID, []rollout.ConfigSnapshot{
						{Kind: "ConfigMap", Name: "big", Hash: "b", Skipped: "larger than 256 KiB"},
						{Kind: "ConfigMap", Name: "cfg", Snapshot: "cfg-dg-0123456789", Hash: "0123456789ab"}})
				})
				return statusInput{Deployment: d, ReplicaSets: []appsv1.ReplicaSet{rs1, rs2, rs3}}
			},
			check: func(t *testing.T, st deploymentStatus, text string) {
				require.Len(t, st.Revisions, 3)
				assert.Equal(t, []configStatus{{Kind: "ConfigMap", Name: "big", Skipped: "larger than 256 KiB"},
					{Kind: "ConfigMap", Name: "cfg", Snapshot: "cfg-dg-0123456789"}}, st.Revisions[0].Config)
				assert.Equal(t, []configStatus{{Kind: "ConfigMap", Name: "cfg"}}, st.Revisions[1].Config)
				assert.Equal(t, []configStatus{{Kind: "ConfigMap", Name: "big"}, {Kind: "ConfigMap", Name: "cfg-dg-0123456789", SnapshotOf: "cfg"}}, st.Revisions[2].Config)
				assert.Contains(t, text, "Config each revision runs with:\n"+
					"  1 (web-a): ConfigMap big (not kept: larger than 256 KiB), ConfigMap cfg (kept as cfg-dg-0123456789)\n"+
					"  2 (web-b): ConfigMap cfg\n"+
					"  3 (web-c): ConfigMap big, ConfigMap cfg-dg-0123456789 (the guard's snapshot of cfg)\n")
			},
		},
		{
			name: "a deadline's decision, known from the annotation alone once events expired",
			input: func() statusInput {
				d := fixtures.Deployment("web:1", map[string]string{
					vocab.RevisionAnnotation:       "2",
					vocab.AnnotationRollbackStatus: "Revision 2 (ReplicaSet web-b) exceeded its progress deadline; no known-good revision to roll back to, so it is left as it is.",
				})
				d.Spec.Template.Spec.Containers[0].Image = "web:2"
				d.Status = appsv1.DeploymentStatus{ObservedGeneration: 4, Replicas: 3, UpdatedReplicas: 1, ReadyReplicas: 2, AvailableReplicas: 2,
					Conditions: []appsv1.DeploymentCondition{{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionFalse, Reason: vocab.ProgressDeadlineExceeded, Message: `ReplicaSet "web-b" has timed out progressing.`}}}
				return statusInput{Deployment: d, ReplicaSets: []appsv1.ReplicaSet{
					fixtures.ReplicaSet(d, "web-a", "a", "web:1", "1", false, 2),
					fixtures.ReplicaSet(d, "web-b", "b", "web:2", "2", false, 1),
				}}
			},
			check: func(t *testing.T, st deploymentStatus, text string) {
				require.NotNil(t, st.Revisions[1].Failure)
				assert.Equal(t, "progress-deadline", st.Revisions[1].Failure.By)
				assert.True(t, st.Revisions[1].Current)
				assert.Equal(t, "deadline-exceeded", st.Rollout.State)
				assert.Contains(t, text, "known-good revision none yet")
				assert.Contains(t, text, `ReplicaSet "web-b" has timed out progressing.`)
				assert.Empty(t, st.Quarantined)
			},
		},
		{
			name: "a rollout in progress with fail-fast's window open",
			input: func() statusInput {
				d := fixtures.Deployment("web:2", map[string]string{vocab.RevisionAnnotation: "2"})
				d.Status = appsv1.DeploymentStatus{ObservedGeneration: 4, Replicas: 3, UpdatedReplicas: 1, ReadyReplicas: 2, AvailableReplicas: 2}
				withLedger(d, func(l *rollout.Ledger) { l.FailingSince = "2026-11-23T06:59:00Z web-b" })
				return statusInput{Deployment: d}
			},
			check: func(t *testing.T, st deploymentStatus, text string) {
				assert.Equal(t, "progressing", st.Rollout.State)
				assert.Equal(t, "web-b", st.Rollout.FailingReplicaSet)
				assert.Contains(t, text, "Rollout: progressing: 1 updated, 2 ready, 2 available of 3")
				assert.Contains(t, text, "fail-fast: new pods of ReplicaSet web-b failing since 2026-11-23T06:59:00Z")
			},
		},
		{
			// What a tenant can write (or an earlier release left, which the
			// guard adopts once, itself): the guard's facts only in
			// annotations, a known-good mark on a ReplicaSet.
			name: "the guard's facts only in annotations are none",
			input: func() statusInput {
				d := fixtures.Deployment("web:2", map[string]string{
					vocab.RevisionAnnotation:                 "2",
					vocab.LegacyAnnotationKnownGoodRevision:  "1",
					vocab.LegacyAnnotationRolledBackRevision: "2",
					vocab.LegacyAnnotationRolledBackTo:       "web-a",
					vocab.LegacyAnnotationFailFastRevision:   "2",
					vocab.LegacyAnnotationFailingSince:       "2026-11-23T06:59:00Z web-b",
				})
				d.Status = appsv1.DeploymentStatus{ObservedGeneration: 4, Replicas: 3, UpdatedReplicas: 1, ReadyReplicas: 2, AvailableReplicas: 2}
				a := fixtures.ReplicaSet(d, "web-a", "a", "web:1", "1", false, 2)
				a = withAnnotation(a, vocab.LegacyAnnotationKnownGood, "2026-11-23T06:00:00Z")
				a = withAnnotation(a, vocab.LegacyAnnotationKnownGoodHash, "a")
				return statusInput{Deployment: d, ReplicaSets: []appsv1.ReplicaSet{a, fixtures.ReplicaSet(d, "web-b", "b", "web:2", "2", false, 1)}}
			},
			check: func(t *testing.T, st deploymentStatus, text string) {
				assert.Empty(t, st.KnownGoodRevision)
				assert.Contains(t, text, "known-good revision none yet")
				require.Len(t, st.Revisions, 2)
				assert.False(t, st.Revisions[0].KnownGood, "a mark on the ReplicaSet is not the guard's record")
				assert.Empty(t, st.Revisions[0].KnownGoodAt)
				assert.Nil(t, st.Verdict, "no rollback stands")
				assert.Empty(t, st.Rollout.FailingReplicaSet)
				assert.Equal(t, "progressing", st.Rollout.State)
			},
		},
		{
			name: "a spec the controller has not seen yet is progressing, not complete",
			input: func() statusInput {
				d := fixtures.Deployment("web:2", nil)
				d.Generation = 5
				return statusInput{Deployment: d}
			},
			check: func(t *testing.T, st deploymentStatus, _ string) { assert.Equal(t, "progressing", st.Rollout.State) },
		},
		{
			name: "paused, automatic rollback off",
			input: func() statusInput {
				d := fixtures.Deployment("web:2", map[string]string{vocab.AnnotationAutoRollback: "false"})
				d.Spec.Paused = true
				return statusInput{Deployment: d}
			},
			check: func(t *testing.T, st deploymentStatus, text string) {
				assert.Equal(t, "paused", st.Rollout.State)
				assert.False(t, st.AutoRollback)
				assert.Contains(t, text, "automatic rollback off")
			},
		},
		{
			name: "being deleted: the steps left, the drain, other controllers' finalizers",
			input: func() statusInput {
				d := fixtures.Deployment("web:1", map[string]string{vocab.AnnotationDrainStarted: "2026-11-23T06:58:00Z", vocab.AnnotationDrainReplicas: "2"})
				d.DeletionTimestamp = ptr.To(metav1.NewTime(statusNow.Add(-2 * time.Minute)))
				d.Finalizers = []string{vocab.FinalizerDrain, "example.com/keep"}
				d.Status.Replicas = 1
				return statusInput{Deployment: d, Events: []eventsv1.Event{
					statusEvent(d, statusNow.Add(-90*time.Second), corev1.EventTypeNormal, vocab.ReasonRecorded, "Saved a restorable record"),
					statusEvent(d, statusNow.Add(-80*time.Second), corev1.EventTypeNormal, vocab.ReasonDrainStarted, "Scaling to zero"),
				}}
			},
			check: func(t *testing.T, st deploymentStatus, text string) {
				require.NotNil(t, st.Cleanup)
				assert.True(t, st.Cleanup.Deleting)
				assert.Equal(t, []string{vocab.StepDrain}, st.Cleanup.PendingSteps)
				assert.Equal(t, []string{"example.com/keep"}, st.Cleanup.OtherFinalizers)
				assert.Contains(t, text, "Being deleted since 2026-11-23T06:58:00Z; 1 pods left")
				assert.Contains(t, text, "cleanup steps left: drain (next: drain)")
				assert.Contains(t, text, "drain started 2026-11-23T06:58:00Z (replicas before: 2)")
				assert.Contains(t, text, "also waiting for other finalizers: example.com/keep")
				assert.Regexp(t, `Recorded: Saved a restorable record\n.*DrainStarted: Scaling to zero`, text, "events oldest first")
			},
		},
		{
			name: "cleanup asked for, not deleting",
			input: func() statusInput {
				d := fixtures.Deployment("web:1", nil)
				d.Finalizers = []string{vocab.FinalizerRecord, vocab.FinalizerDrain}
				return statusInput{Deployment: d}
			},
			check: func(t *testing.T, st deploymentStatus, text string) {
				require.NotNil(t, st.Cleanup)
				assert.False(t, st.Cleanup.Deleting)
				assert.Contains(t, text, "Cleanup on deletion: record, drain")
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := buildStatus(tt.input())
			var text bytes.Buffer
			printStatus(&text, st)
			tt.check(t, st, text.String())
			// The JSON form always has its lists, for scripts.
			b, err := json.Marshal(st)
			require.NoError(t, err)
			var m map[string]any
			require.NoError(t, json.Unmarshal(b, &m))
			for _, k := range []string{"revisions", "quarantined", "events", "rollout"} {
				assert.NotNil(t, m[k], k)
			}
		})
	}
}

func TestStatusWithoutEvents(t *testing.T) {
	var text bytes.Buffer
	printStatus(&text, deploymentStatus{Namespace: "shop", Name: "web", EventsUnavailable: "events.events.k8s.io is forbidden"})
	assert.Contains(t, text.String(), "Events: not readable (events.events.k8s.io is forbidden)")
}

func TestStatusDeletedWithRecord(t *testing.T) {
	var text bytes.Buffer
	printStatus(&text, deploymentStatus{Namespace: "shop", Name: "web", Deleted: true, Record: true})
	assert.Contains(t, text.String(), "deployguard restore shop/web")
}

func TestStatusUsage(t *testing.T) {
	for _, args := range [][]string{nil, {"shop/"}, {"shop/web", "-o", "yaml"}, {"a/b", "c/d"}, {"--drain", "node-1", "shop/web"}, {"shop/web", "--no-such-flag"}} {
		var stdout, stderr bytes.Buffer
		assert.Equal(t, 2, cli.ExitCode(NewCommand(cli.Streams{Out: &stdout, ErrOut: &stderr}), args, &stderr), "%v", args)
		assert.Contains(t, stderr.String(), "NAMESPACE/NAME", "%v", args)
	}
}

// fetchStatus against a client: the events a user may not read only leave
// them out; a Deployment that is gone tells whether its record was kept.
func TestFetchStatus(t *testing.T) {
	d := fixtures.Deployment("web:1", map[string]string{vocab.RevisionAnnotation: "1"})
	rs := fixtures.ReplicaSet(d, "web-a", "a", "web:1", "1", true, 2)
	record := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "deployguard-system", Name: "deployguard-record-shop.old",
		Labels:      map[string]string{vocab.LabelRecord: "true"},
		Annotations: map[string]string{vocab.AnnotationRecordNamespace: "shop", vocab.AnnotationRecordOf: "old"}}}
	// Labelled as a record in the Deployment's namespace, where a tenant can
	// write: not the guard's.
	forged := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "deployguard-record-forged",
		Labels:      map[string]string{vocab.LabelRecord: "true"},
		Annotations: map[string]string{vocab.AnnotationRecordNamespace: "shop", vocab.AnnotationRecordOf: "forged"}}}
	c := fake.NewClientBuilder().WithScheme(clientgoscheme.Scheme).WithObjects(d, &rs, record, forged).WithInterceptorFuncs(interceptor.Funcs{
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if _, ok := list.(*eventsv1.EventList); ok {
				return apierrors.NewForbidden(schema.GroupResource{Group: "events.k8s.io", Resource: "events"}, "", errors.New("RBAC"))
			}
			return c.List(ctx, list, opts...)
		},
	}).Build()

	st, err := fetchStatus(context.Background(), c, "deployguard-system", "shop", "web")
	require.NoError(t, err)
	require.Len(t, st.Revisions, 1)
	assert.True(t, st.Revisions[0].KnownGood)
	assert.Contains(t, st.EventsUnavailable, "forbidden")

	st, err = fetchStatus(context.Background(), c, "deployguard-system", "shop", "old")
	require.NoError(t, err)
	assert.True(t, st.Deleted)
	assert.True(t, st.Record)
	st, err = fetchStatus(context.Background(), c, "deployguard-system", "shop", "forged")
	require.NoError(t, err)
	assert.True(t, st.Deleted)
	assert.False(t, st.Record, "a ConfigMap labelled as a record outside the guard's namespace is none")
	st, err = fetchStatus(context.Background(), c, "deployguard-system", "shop", "never")
	require.NoError(t, err)
	assert.True(t, st.Deleted)
	assert.False(t, st.Record)
}
