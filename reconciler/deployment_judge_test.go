package reconciler

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/vocab"
)

// judge is a RollbackJudge that answers as told and counts the questions.
type judge struct {
	err      error
	refusals []string
	asked    []*appsv1.Deployment
}

func (j *judge) JudgeRollback(_ context.Context, restored, _ *appsv1.Deployment) ([]string, error) {
	j.asked = append(j.asked, restored)
	return j.refusals, j.err
}

// A rollback waits, writing nothing, while the judge cannot tell (a leader
// started before the policy ConfigMaps loaded), and happens once it can.
func TestRollbackWaitsForThePoliciesInForce(t *testing.T) {
	d := deployment(failed)
	rs1, rs2, rs3 := history(d)
	e := newEnv(t, namespace(nil), d, rs1, rs2, rs3)
	j := &judge{err: errors.New("the policy ConfigMaps are not loaded yet")}
	e.r.Judge = j

	res, err := e.r.Reconcile(ctrl.LoggerInto(context.Background(), ctrl.Log), ctrl.Request{NamespacedName: client.ObjectKey{Namespace: "shop", Name: "web"}})
	require.NoError(t, err, "waiting for the policies is not an error")
	assert.Equal(t, judgeRetry, res.RequeueAfter)
	require.Len(t, j.asked, 1)
	assert.Equal(t, "web:v2", j.asked[0].Spec.Template.Spec.Containers[0].Image, "the template the rollback would write is the one judged")
	assert.Empty(t, e.patches, "nothing written before the judge can tell")
	assert.Empty(t, e.statusPatches)
	assert.Empty(t, e.events())
	assert.Equal(t, "web:v3", e.deployment().Spec.Template.Spec.Containers[0].Image)

	j.err = nil
	require.NoError(t, e.reconcile())
	got := e.deployment()
	assert.Equal(t, "web:v2", got.Spec.Template.Spec.Containers[0].Image)
	assert.Equal(t, int64(3), ledgerOf(t, got).RolledBackRevision)
	assert.Equal(t, []string{vocab.ReasonAutoRollback}, eventReasons(e.events()))
	assert.Equal(t, 1.0, e.rollbacks(resultRolledBack))
}

// A template the policies in force refuse is reported, never restored.
func TestRollbackRefusedByThePoliciesInForce(t *testing.T) {
	d := deployment(failed)
	rs1, rs2, rs3 := history(d)
	e := newEnv(t, namespace(nil), d, rs1, rs2, rs3)
	e.r.Judge = &judge{refusals: []string{"[policy nohostnetwork] spec.template.spec.hostNetwork: host networking is not allowed"}}

	require.NoError(t, e.reconcile())
	got := e.deployment()
	assert.Equal(t, "web:v3", got.Spec.Template.Spec.Containers[0].Image, "nothing restored")
	evs := e.events()
	assert.Equal(t, []string{vocab.ReasonRollbackRefused}, eventReasons(evs))
	assert.Contains(t, evs[0], "host networking is not allowed")
	assert.Equal(t, 1.0, e.rollbacks(resultRefused))
	assert.Zero(t, ledgerOf(t, got).RolledBackRevision)
}
