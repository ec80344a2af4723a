package review_test

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/deployguard/deployguard/policy"
	"github.com/deployguard/deployguard/webhook/exception"
	"github.com/deployguard/deployguard/webhook/review"
	"github.com/deployguard/deployguard/webhook/review/reviewtest"
)

// An owner reference added to a Deployment is judged as its DELETE by the
// same user: the garbage collector, which the webhooks exempt, deletes the
// Deployment once the owner goes. An enforced policy that refuses the user
// the deletion refuses the owner, saying why and what to do.
func TestAnOwnerIsJudgedAsADeletion(t *testing.T) {
	critical := func(d *appsv1.Deployment) { d.Labels = map[string]string{"tier": "critical"} }
	owned := func(uids ...string) func(*appsv1.Deployment) {
		return func(d *appsv1.Deployment) {
			for _, uid := range uids {
				d.OwnerReferences = append(d.OwnerReferences, metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: "bait-" + uid, UID: types.UID(uid)})
			}
		}
	}
	// rewritten: owner u1 as bait-u1 becomes, but for f.
	rewritten := func(f func(*metav1.OwnerReference)) func(*appsv1.Deployment) {
		return func(d *appsv1.Deployment) {
			owned("u1")(d)
			f(&d.OwnerReferences[len(d.OwnerReferences)-1])
		}
	}
	enforce := []policy.Source{reviewtest.CriticalPolicy("critical", "enforce")}
	const refusal = `metadata.ownerReferences: Forbidden: an owner reference to ConfigMap bait-u1 lets the garbage collector delete this Deployment once that owner is deleted, and you may not delete it: [policy critical] a tier: critical Deployment may not be deleted: remove the label first if it is no longer critical. Remove the owner reference, or have it added by someone who may delete the Deployment`
	tests := []struct {
		name     string
		policies []policy.Source
		op       admissionv1.Operation
		old, cur *appsv1.Deployment
		user     authenticationv1.UserInfo
		mut      func(*review.Reviewer)
		refused  string // the refusal, exactly; "" admitted
		warning  string // in a warning
	}{
		{name: "a tenant adds an owner to a critical Deployment", policies: enforce, op: admissionv1.Update,
			old: reviewtest.Guarded(critical), cur: reviewtest.Guarded(critical, owned("u1")), refused: refusal},
		{name: "an operator creates a critical Deployment it owns but may not delete", policies: enforce, op: admissionv1.Create,
			cur: reviewtest.Guarded(critical, owned("u1")), refused: refusal},
		{name: "a second owner", policies: enforce, op: admissionv1.Update,
			old: reviewtest.Guarded(critical, owned("u0")), cur: reviewtest.Guarded(critical, owned("u0", "u1")), refused: refusal},
		// The same uid under other coordinates: the garbage collector finds
		// no owner by them, and deletes the Deployment.
		{name: "an owner's name rewritten, its uid kept", policies: enforce, op: admissionv1.Update,
			old: reviewtest.Guarded(critical, rewritten(func(r *metav1.OwnerReference) { r.Name = "kept" })),
			cur: reviewtest.Guarded(critical, owned("u1")), refused: refusal},
		{name: "an owner's kind rewritten, its uid kept", policies: enforce, op: admissionv1.Update,
			old: reviewtest.Guarded(critical, rewritten(func(r *metav1.OwnerReference) { r.Kind = "Secret" })),
			cur: reviewtest.Guarded(critical, owned("u1")), refused: refusal},
		{name: "an owner's apiVersion rewritten, its uid kept", policies: enforce, op: admissionv1.Update,
			old: reviewtest.Guarded(critical, rewritten(func(r *metav1.OwnerReference) { r.APIVersion = "example.com/v1" })),
			cur: reviewtest.Guarded(critical, owned("u1")), refused: refusal},
		{name: "an owner's controller flag set: the same owner", policies: enforce, op: admissionv1.Update,
			old: reviewtest.Guarded(critical, owned("u1")),
			cur: reviewtest.Guarded(critical, rewritten(func(r *metav1.OwnerReference) { r.Controller = ptr.To(true) }))},
		{name: "an owner the stored Deployment has", policies: enforce, op: admissionv1.Update,
			old: reviewtest.Guarded(critical, owned("u1")), cur: reviewtest.Guarded(critical, owned("u1"))},
		{name: "an owner removed", policies: enforce, op: admissionv1.Update,
			old: reviewtest.Guarded(critical, owned("u0", "u1")), cur: reviewtest.Guarded(critical, owned("u1"))},
		{name: "a Deployment the user may delete", policies: enforce, op: admissionv1.Update,
			old: reviewtest.Guarded(), cur: reviewtest.Guarded(owned("u1"))},
		{name: "a warn-mode policy: admitted, and nothing to warn of", policies: []policy.Source{reviewtest.CriticalPolicy("critical", "warn")},
			op: admissionv1.Update, old: reviewtest.Guarded(critical), cur: reviewtest.Guarded(critical, owned("u1"))},
		{name: "a policy that judges no deletion", policies: []policy.Source{reviewtest.OwnerPolicy}, op: admissionv1.Update,
			old: reviewtest.Guarded(critical, func(d *appsv1.Deployment) { d.Labels["owner"] = "shop" }),
			cur: reviewtest.Guarded(critical, owned("u1"), func(d *appsv1.Deployment) { d.Labels["owner"] = "shop" })},
		{name: "an exempt user", policies: enforce, op: admissionv1.Update, user: authenticationv1.UserInfo{Username: "ops-bot"},
			mut: func(w *review.Reviewer) { w.Options.ExemptUsernames = []string{"ops-bot"} },
			old: reviewtest.Guarded(critical), cur: reviewtest.Guarded(critical, owned("u1"))},
		{name: "the guard", policies: enforce, op: admissionv1.Update, user: authenticationv1.UserInfo{Username: reviewtest.Options().GuardUsername},
			old: reviewtest.Guarded(critical), cur: reviewtest.Guarded(critical, owned("u1"))},
		{name: "the control plane", policies: enforce, op: admissionv1.Update,
			user: authenticationv1.UserInfo{Username: "system:serviceaccount:kube-system:generic-garbage-collector"},
			old:  reviewtest.Guarded(critical), cur: reviewtest.Guarded(critical, owned("u1"))},
		{name: "a PolicyException of the policy warns instead", policies: enforce, op: admissionv1.Update,
			old: reviewtest.Guarded(critical), cur: reviewtest.Guarded(critical, owned("u1")),
			mut: func(w *review.Reviewer) {
				x := exception.NewIndex("deployguard-system")
				x.Set(&exception.PolicyException{
					ObjectMeta: metav1.ObjectMeta{Namespace: "deployguard-system", Name: "adopted"},
					Spec: exception.Spec{Match: exception.Match{Namespace: "shop", Names: []string{"web"}}, Policies: []string{"critical"},
						ExpiresAt: metav1.NewTime(time.Now().Add(time.Hour)), Owner: "platform", Reason: "adopted by an operator"},
				})
				w.Exceptions = x
			}, warning: "lets the garbage collector delete this Deployment"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			eng, err := policy.New(policy.Options{})
			require.NoError(t, err)
			require.NoError(t, eng.Load(context.Background(), append(policy.Builtins(), tt.policies...)))
			w := &review.Reviewer{Options: reviewtest.Options(), Overlaps: reviewtest.Index(), Policies: review.RegoPolicies{Engine: eng}}
			if tt.mut != nil {
				tt.mut(w)
			}
			if tt.user.Username == "" {
				tt.user.Username = "alice"
			}
			r := w.Review(context.Background(), review.Request{Operation: tt.op, Object: tt.cur, OldObject: tt.old, UserInfo: tt.user}, review.Validating)
			refusals := r.Findings.Refusals()
			if tt.refused == "" {
				assert.Empty(t, refusals)
			} else if assert.Len(t, refusals, 1) {
				assert.Equal(t, tt.refused, refusals[0].Error())
			}
			var warned bool
			for _, f := range r.Findings {
				if f.Severity == review.SeverityWarning && f.Field == "metadata.ownerReferences" {
					warned = true
					assert.Contains(t, f.Message, tt.warning)
				}
			}
			assert.Equal(t, tt.warning != "", warned, "warned of the owner: %+v", r.Findings)
		})
	}
}

// IsControlPlane names the identities the webhook configurations and the
// native policies exempt: a controller added there and not here (or the
// reverse) would let the guard judge as a tenant what the API server
// exempts.
func TestIsControlPlaneIsTheManifests(t *testing.T) {
	names := regexp.MustCompile(`"(system:[a-z:-]+)"`)
	for _, path := range []string{"config/webhook/manifests.yaml", "config/native/policies.yaml", "config/helm/deployguard/templates/webhooks.yaml"} {
		raw, err := os.ReadFile(filepath.Join("..", "..", path))
		require.NoError(t, err)
		// Each list of exempt controllers: an "in [" list of usernames.
		lists := regexp.MustCompile(`(?s)username(?:\.orValue\(''\))? in \[(.*?)\]`).FindAllSubmatch(raw, -1)
		require.NotEmpty(t, lists, "no list of the control plane's identities in %s", path)
		for _, l := range lists {
			var got []string
			for _, m := range names.FindAllSubmatch(l[1], -1) {
				got = append(got, string(m[1]))
			}
			require.Len(t, got, 4, "%s lists %v", path, got)
			for _, n := range got {
				assert.True(t, review.IsControlPlane(n), "%s exempts %s, which IsControlPlane does not name", path, n)
			}
		}
	}
	assert.False(t, slices.ContainsFunc([]string{"alice", "system:serviceaccount:kube-system:replicaset-controller", "system:masters"}, review.IsControlPlane))
}

// Where the guard evaluates the native refusals itself, an owner added to a
// protected Deployment counts as deletion protection and the rollback
// annotation with the other rules of the metadata: the audit, which judges
// what is stored, reports neither (they judge writes).
func TestNativeMetadataRulesOrigins(t *testing.T) {
	protected := reviewtest.Guarded(func(d *appsv1.Deployment) { d.Annotations["deployguard.io/protected"] = "true" })
	owned := protected.DeepCopy()
	owned.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "bait", UID: "u1"}}
	rollback := reviewtest.Guarded(func(d *appsv1.Deployment) { d.Annotations[appsv1.DeprecatedRollbackTo] = "2" })
	alice := authenticationv1.UserInfo{Username: "alice"}
	for _, tc := range []struct {
		name     string
		old, cur *appsv1.Deployment
		origin   string
	}{
		{"an owner of a protected Deployment", protected, owned, "protected"},
		{"the rollback annotation", reviewtest.Guarded(), rollback, "finalizers"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := reviewtest.Options()
			req := review.Request{Operation: admissionv1.Update, Object: tc.cur, OldObject: tc.old, UserInfo: alice}
			fs := o.NativeChecks(context.Background(), req, "deployguard-refusals")
			if assert.Len(t, fs, 1, "%+v", fs) {
				assert.Equal(t, tc.origin, fs[0].Origin)
				assert.Equal(t, review.SeverityError, fs[0].Severity)
			}
			w := &review.Reviewer{Options: o}
			audit := w.Review(context.Background(), review.Request{Operation: admissionv1.Update, Object: tc.cur, UserInfo: alice}, review.Audit)
			assert.Empty(t, audit.Findings.Refusals(), "the audit judges what is stored, not the write")
		})
	}
}

// OwnersAdded and the native refusals' ownersAdded (config/native) count
// the same owners as added: on an UPDATE of a protected Deployment, the
// native rule refuses exactly when OwnersAdded finds one, for every pair of
// owner lists drawn from references that share a uid and differ in one
// coordinate. On a CREATE, OwnersAdded counts every owner (for the Rego
// policies) and the native rule judges none.
func TestOwnersAddedIsTheNativeRule(t *testing.T) {
	base := metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: "a", UID: "u1"}
	variants := []metav1.OwnerReference{base}
	for _, f := range []func(*metav1.OwnerReference){
		func(r *metav1.OwnerReference) { r.Name = "b" },
		func(r *metav1.OwnerReference) { r.Kind = "Secret" },
		func(r *metav1.OwnerReference) { r.APIVersion = "example.com/v1" },
		func(r *metav1.OwnerReference) { r.UID = "u2" },
		func(r *metav1.OwnerReference) { r.Controller = ptr.To(true) },
	} {
		r := base
		f(&r)
		variants = append(variants, r)
	}
	// Every list of at most two variants.
	lists := [][]metav1.OwnerReference{nil}
	for i := range variants {
		lists = append(lists, []metav1.OwnerReference{variants[i]})
		for j := range variants {
			if i != j {
				lists = append(lists, []metav1.OwnerReference{variants[i], variants[j]})
			}
		}
	}
	protected := func(owners []metav1.OwnerReference) *appsv1.Deployment {
		return reviewtest.Guarded(func(d *appsv1.Deployment) {
			d.Annotations["deployguard.io/protected"] = "true"
			d.OwnerReferences = owners
		})
	}
	o := reviewtest.Options()
	alice := authenticationv1.UserInfo{Username: "alice"}
	refusedBy := func(req review.Request) bool {
		for _, f := range o.NativeChecks(context.Background(), req, "deployguard-refusals") {
			if f.Field == "metadata.ownerReferences" && f.Severity == review.SeverityError {
				return true
			}
		}
		return false
	}
	added := 0
	for _, old := range lists {
		for _, cur := range lists {
			req := review.Request{Operation: admissionv1.Update, Object: protected(cur), OldObject: protected(old), UserInfo: alice}
			want := review.OwnersAdded(req.Object, req.OldObject)
			if len(want) > 0 {
				added++
			}
			assert.Equal(t, len(want) > 0, refusedBy(req), "UPDATE from %+v to %+v: OwnersAdded %+v", old, cur, want)
		}
		create := review.Request{Operation: admissionv1.Create, Object: protected(old), UserInfo: alice}
		assert.Len(t, review.OwnersAdded(create.Object, nil), len(old), "a CREATE adds every owner")
		assert.False(t, refusedBy(create), "the native rule judges no CREATE: %+v", old)
	}
	assert.NotZero(t, added, "no owner added in the pairs")
}
