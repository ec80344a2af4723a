package reconciler

import (
	"testing"

	"github.com/stretchr/testify/assert"
	appsv1 "k8s.io/api/apps/v1"

	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
)

// A record recreates what the user chose, not the guard's verdict on the
// deleted object: no rollback label or annotation comes back with it.
func TestRestorableDeploymentLeavesTheVerdictBehind(t *testing.T) {
	d := deployment(rolledBack, annotate(
		// An earlier release's record of its rollback.
		vocab.LegacyAnnotationRolledBackTo, "web-h1",
		vocab.LegacyAnnotationRolledBackRevision, "2",
	), func(d *appsv1.Deployment) {
		d.Labels = map[string]string{"app": "web", vocab.LabelRolledBack: "3"}
	})
	got := RestorableDeployment(d)
	assert.Equal(t, map[string]string{"app": "web"}, got.Labels)
	assert.NotContains(t, got.Annotations, vocab.LegacyAnnotationRolledBackTo)
	assert.NotContains(t, got.Annotations, vocab.LegacyAnnotationRolledBackRevision)
	_, hasLedger := rollout.ReadLedger(got)
	assert.False(t, hasLedger, "the guard's ledger is about the deleted Deployment")
	assert.Equal(t, "3", d.Labels[vocab.LabelRolledBack], "the recorded Deployment is left as it is")
}
