package webhook

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// TestNativeEnforced: the webhook leaves the refusals to the API server only
// while the config says they are installed and the last check found them
// enforced; a lost policy brings them back to the webhook and routes them to
// the failing-closed entry.
func TestNativeEnforced(t *testing.T) {
	o := &Options{}
	assert.False(t, o.NativeEnforced(), "not installed")
	o.NativeInAPIServer = true
	assert.True(t, o.NativeEnforced(), "installed, never checked (in-process callers)")

	o.Native = NewNativeEnforcement(true)
	assert.True(t, o.NativeEnforced())
	assert.False(t, EnforcedOf(o, LoadedPolicies{}).Refusals)
	assert.NotEqual(t, "true", MustDecide(EnforcedOf(o, LoadedPolicies{})))

	changed := o.Native.Changed()
	assert.True(t, o.Native.Set(false), "lost")
	select {
	case <-changed:
	default:
		t.Fatal("a change closes Changed")
	}
	assert.False(t, o.NativeEnforced())
	assert.True(t, EnforcedOf(o, LoadedPolicies{}).Refusals)
	assert.Equal(t, "true", MustDecide(EnforcedOf(o, LoadedPolicies{})), "the enforce entry takes every request")

	again := o.Native.Changed()
	assert.False(t, o.Native.Set(false), "no change")
	select {
	case <-again:
		t.Fatal("no change, Changed stays open")
	default:
	}
	assert.True(t, o.Native.Set(true), "back")
	assert.True(t, o.NativeEnforced())

	o.NativeInAPIServer = false
	assert.False(t, o.NativeEnforced(), "the config's word comes first")
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
