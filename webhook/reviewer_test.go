package webhook

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/deployguard/deployguard/policy"
)

// TestDeletePolicyInput: on a DELETE the policies get operation DELETE, no
// object, the Deployment being deleted as oldObject (as the API server sent
// it), and its namespace and name.
func TestDeletePolicyInput(t *testing.T) {
	var got policy.Request
	w := &Reviewer{Options: testOptions(), Overlaps: indexOf(), Policies: policyFunc(func(in policy.Request) policy.Decision {
		got = in
		return policy.Decision{}
	})}
	old := guarded()
	raw, err := json.Marshal(old)
	require.NoError(t, err)
	rev := w.Review(context.Background(), Request{Operation: admissionv1.Delete, OldObject: old, OldObjectRaw: raw,
		UserInfo: authenticationv1.UserInfo{Username: "alice"}}, Validating)
	assert.True(t, rev.PoliciesRan)
	assert.Equal(t, "DELETE", got.Operation)
	assert.Nil(t, got.Object)
	assert.Equal(t, raw, got.OldObject)
	assert.Equal(t, "shop", got.Namespace)
	assert.Equal(t, "web", got.Name)
	assert.Equal(t, "alice", got.UserInfo.Username)
}

// Where the API server enforces the refusals, it judges a create only when
// deployguard-selector labelled it: the validating webhook judges every
// create itself, for one that arrives unlabelled, and leaves updates to the
// API server.
func TestValidatingJudgesTheRefusalsOnCreates(t *testing.T) {
	o := testOptions()
	o.NativeInAPIServer, o.Native = true, NewNativeEnforcement(true)
	w := &Reviewer{Options: o}
	allDown := func() *appsv1.Deployment {
		d := deploymentWith("web", 3, map[string]string{"app": "web"})
		all := intstr.FromString("100%")
		d.Spec.Strategy = appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType,
			RollingUpdate: &appsv1.RollingUpdateDeployment{MaxUnavailable: &all}}
		return d
	}
	stage := Validating
	stage.Native = !o.NativeEnforced()
	alice := authenticationv1.UserInfo{Username: "alice"}
	created := w.Review(context.Background(), Request{Operation: admissionv1.Create, Object: allDown(), UserInfo: alice}, stage)
	if assert.NotEmpty(t, created.Findings.Refusals(), "an unlabelled create the refusals refuse") {
		assert.Contains(t, created.Findings.Refusals().ToAggregate().Error(), "100% resolves to 3 of 3 replicas")
	}
	old := allDown()
	old.Spec.Replicas = ptr(int32(1))
	updated := w.Review(context.Background(), Request{Operation: admissionv1.Update, Object: allDown(), OldObject: old, UserInfo: alice}, stage)
	assert.Empty(t, updated.Findings.Refusals(), "an update is the API server's to refuse")
}
