package review_test

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
	"k8s.io/utils/ptr"

	"github.com/deployguard/deployguard/policy"
	"github.com/deployguard/deployguard/webhook/review"
	"github.com/deployguard/deployguard/webhook/review/reviewtest"
)

// TestDeletePolicyInput: on a DELETE the policies get operation DELETE, no
// object, the Deployment being deleted as oldObject (as the API server sent
// it), and its namespace and name.
func TestDeletePolicyInput(t *testing.T) {
	var got policy.Request
	w := &review.Reviewer{Options: reviewtest.Options(), Overlaps: reviewtest.Index(), Policies: reviewtest.PoliciesFunc(func(in policy.Request) policy.Decision {
		got = in
		return policy.Decision{}
	})}
	old := reviewtest.Guarded()
	raw, err := json.Marshal(old)
	require.NoError(t, err)
	rev := w.Review(context.Background(), review.Request{Operation: admissionv1.Delete, OldObject: old, OldObjectRaw: raw,
		UserInfo: authenticationv1.UserInfo{Username: "alice"}}, review.Validating)
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
	o := reviewtest.Options()
	o.NativeInAPIServer, o.Native = true, review.NewNativeEnforcement(true)
	w := &review.Reviewer{Options: o}
	allDown := func() *appsv1.Deployment {
		d := deploymentWith("web", 3, map[string]string{"app": "web"})
		all := intstr.FromString("100%")
		d.Spec.Strategy = appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType,
			RollingUpdate: &appsv1.RollingUpdateDeployment{MaxUnavailable: &all}}
		return d
	}
	stage := review.Validating
	stage.Native = !o.NativeEnforced()
	alice := authenticationv1.UserInfo{Username: "alice"}
	created := w.Review(context.Background(), review.Request{Operation: admissionv1.Create, Object: allDown(), UserInfo: alice}, stage)
	if assert.NotEmpty(t, created.Findings.Refusals(), "an unlabelled create the refusals refuse") {
		assert.Contains(t, created.Findings.Refusals().ToAggregate().Error(), "100% resolves to 3 of 3 replicas")
	}
	old := allDown()
	old.Spec.Replicas = ptr.To(int32(1))
	updated := w.Review(context.Background(), review.Request{Operation: admissionv1.Update, Object: allDown(), OldObject: old, UserInfo: alice}, stage)
	assert.Empty(t, updated.Findings.Refusals(), "an update is the API server's to refuse")
}
