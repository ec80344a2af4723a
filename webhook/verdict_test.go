package webhook

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/webhook/review"
	"github.com/deployguard/deployguard/webhook/review/reviewtest"
)

// TestVerdictHandler: the status webhook's answers, decided by the
// reconciler's rollout.DecideVerdict (its own table tests the decision). The API
// server's side, and a real status write, are in the integration tier
// (TestAFixIsNeverObservedUnderTheOldVerdict).
func TestVerdictHandler(t *testing.T) {
	restoredTemplate := vocab.TemplateHash(&reviewtest.Stored().Spec.Template)
	recorded := rollout.Ledger{RolledBackTo: "web-restored", RolledBackToTemplate: restoredTemplate, RolledBackRevision: 4}
	// rolledBack is the Deployment at generation 5 after the rollback (with
	// image, when set, applied), its status observed up to observed.
	rolledBack := func(image string, observed int64) *appsv1.Deployment {
		d := reviewtest.Stored(func(d *appsv1.Deployment) {
			d.Generation, d.UID, d.ResourceVersion = 5, "uid-web", "10"
			d.Status.ObservedGeneration = observed
			d.Status.Conditions = []appsv1.DeploymentCondition{
				{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue},
				{Type: vocab.ConditionStalled, Status: corev1.ConditionTrue, Reason: vocab.ReasonAutoRollback},
				{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionTrue},
			}
			rollout.SetLedger(&d.Status, recorded, time.Unix(0, 0))
		})
		if image != "" {
			d.Spec.Template.Spec.Containers[0].Image = image
		}
		return d
	}
	withLedger := func(d *appsv1.Deployment, l rollout.Ledger) *appsv1.Deployment {
		rollout.SetLedger(&d.Status, l, time.Unix(0, 0))
		return d
	}
	with := func(d *appsv1.Deployment, mut func(*appsv1.Deployment)) *appsv1.Deployment { mut(d); return d }
	tests := []struct {
		name        string
		old, d      *appsv1.Deployment
		notStatus   bool
		dryRun      bool
		wantRemoved bool
	}{
		{name: "a fix observed", old: rolledBack("web:fixed", 4), d: rolledBack("web:fixed", 5), wantRemoved: true},
		{name: "the restored template observed", old: rolledBack("", 4), d: rolledBack("", 5)},
		{name: "a fix, not observed yet", old: rolledBack("web:fixed", 4), d: rolledBack("web:fixed", 4)},
		{name: "the restored template observed, the rollback accepted", old: rolledBack("", 4),
			d: with(rolledBack("", 5), func(d *appsv1.Deployment) { d.Annotations = map[string]string{vocab.AnnotationAcceptRollback: "4"} }), wantRemoved: true},
		{name: "a verdict without its rollback recorded", old: rolledBack("", 4),
			d: withLedger(rolledBack("", 5), rollout.Ledger{RolledBackRevision: 4}), wantRemoved: true},
		{name: "a rollback named only by annotations a tenant can write", old: rolledBack("", 4),
			d: with(withLedger(rolledBack("", 5), rollout.Ledger{}), func(d *appsv1.Deployment) {
				d.Annotations = map[string]string{vocab.LegacyAnnotationRolledBackTo: "web-restored", vocab.LegacyAnnotationRolledBackRevision: "4"}
			}), wantRemoved: true},
		{name: "a rollback adopted from an earlier release is left to the reconciler", old: rolledBack("web:fixed", 4),
			d: withLedger(rolledBack("web:fixed", 5), rollout.Ledger{RolledBackTo: "web-restored", RolledBackRevision: 4})},
		{name: "a write of another template than the stored one", old: rolledBack("", 4), d: rolledBack("web:fixed", 5)},
		{name: "a write of another template, without identity", old: rolledBack("", 4),
			d: with(rolledBack("web:fixed", 5), func(d *appsv1.Deployment) { d.UID, d.ResourceVersion = "", "" })},
		{name: "a write that will conflict", old: rolledBack("web:fixed", 4),
			d: with(rolledBack("web:fixed", 5), func(d *appsv1.Deployment) { d.ResourceVersion = "9" })},
		{name: "a dry run", old: rolledBack("web:fixed", 4), d: rolledBack("web:fixed", 5), dryRun: true, wantRemoved: true},
		{name: "not a status write", old: rolledBack("web:fixed", 4), d: rolledBack("web:fixed", 5), notStatus: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			raw, err := json.Marshal(tt.d)
			require.NoError(t, err)
			oldRaw, err := json.Marshal(tt.old)
			require.NoError(t, err)
			sub := "status"
			if tt.notStatus {
				sub = ""
			}
			req := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
				Kind: deploymentKind.gvk, Operation: admissionv1.Update, SubResource: sub,
				Namespace: "shop", Name: "web", DryRun: &tt.dryRun,
				Object: runtime.RawExtension{Raw: raw}, OldObject: runtime.RawExtension{Raw: oldRaw},
			}}
			resp, reason := verdict{}.handle(context.Background(), req)
			require.True(t, resp.Allowed, "a status write is never refused")
			assert.Equal(t, reasonNone, reason)
			if !tt.wantRemoved {
				assert.Empty(t, resp.Patches)
				return
			}
			ops, err := json.Marshal(resp.Patches)
			require.NoError(t, err)
			patch, err := jsonpatch.DecodePatch(ops)
			require.NoError(t, err)
			patched, err := patch.Apply(raw)
			require.NoError(t, err)
			got := &appsv1.Deployment{}
			require.NoError(t, json.Unmarshal(patched, got))
			want := tt.d.DeepCopy()
			want.Status.Conditions = slices.Delete(want.Status.Conditions, 1, 2)
			assert.Equal(t, want, got, "only the guard's Stalled condition is removed")
		})
	}
}

// The status webhook admits what it cannot read, unchanged: a refusal of a
// status write, whatever the failurePolicy, would stop the Deployment
// controller's rollout.
func TestVerdictWebhookNeverRefuses(t *testing.T) {
	h := (&Hooks{Reviewer: &review.Reviewer{}, ServeVerdicts: true}).VerdictHandler(nil)
	for name, req := range map[string]admissionv1.AdmissionRequest{
		"an object that does not decode": {Kind: deploymentKind.gvk, Operation: admissionv1.Update, SubResource: "status",
			Object: runtime.RawExtension{Raw: []byte(`{"spec":"x"}`)}, OldObject: runtime.RawExtension{Raw: []byte(`{}`)}},
		"no oldObject": {Kind: deploymentKind.gvk, Operation: admissionv1.Update, SubResource: "status", Object: runtime.RawExtension{Raw: []byte(`{}`)}},
		"another kind": {Kind: budgetKind.gvk, Operation: admissionv1.Update, SubResource: "status", Object: runtime.RawExtension{Raw: []byte(`{}`)}},
	} {
		t.Run(name, func(t *testing.T) {
			resp := h.Handle(context.Background(), admission.Request{AdmissionRequest: req})
			assert.True(t, resp.Allowed)
			assert.Empty(t, resp.Patches)
		})
	}
	t.Run("a panic", func(t *testing.T) {
		resp := neverRefuse(admission.HandlerFunc(func(context.Context, admission.Request) admission.Response { panic("boom") })).
			Handle(context.Background(), admission.Request{})
		assert.True(t, resp.Allowed)
	})
}
