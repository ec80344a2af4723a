package native

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/utils/ptr"

	"github.com/deployguard/deployguard/reconciler/vocab"
)

var defaults = Settings{GuardUsername: "system:serviceaccount:deployguard-system:deployguard",
	RevisionHistoryMin: 1, RevisionHistoryMax: 100, ProgressDeadlineMin: 30, ProgressDeadlineMax: 7200}

func rolling(replicas int32, surge, unavailable intstr.IntOrString) *appsv1.Deployment {
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web"},
		Spec: appsv1.DeploymentSpec{Replicas: &replicas, Strategy: appsv1.DeploymentStrategy{
			Type:          appsv1.RollingUpdateDeploymentStrategyType,
			RollingUpdate: &appsv1.RollingUpdateDeployment{MaxSurge: &surge, MaxUnavailable: &unavailable}}},
	}
}

func evaluate(t *testing.T, req Request, s Settings, policies ...string) []Finding {
	t.Helper()
	r, err := Load()
	require.NoError(t, err)
	if req.User == nil {
		req.User = &user.DefaultInfo{Name: "alice"}
	}
	req.Namespace, req.Name = "shop", "web"
	fs := r.Evaluate(context.Background(), req, s.Params(), policies...)
	for _, f := range fs {
		require.False(t, f.Error || strings.HasPrefix(f.Message, "failed expression"), "the policy could not say why: %+v", f)
	}
	return fs
}

// The fenceposts as the Deployment controller resolves them: maxSurge
// rounds up, maxUnavailable down, 0/0 is 0/1; refused when every replica
// may go at once.
func TestStrategyFenceposts(t *testing.T) {
	for _, tc := range []struct {
		name               string
		replicas           int32
		surge, unavailable intstr.IntOrString
		want               string // "" admitted
	}{
		{"25%/25% of 3 is 1/0", 3, intstr.FromString("25%"), intstr.FromString("25%"), ""},
		{"0/0 is 0/1, of 1", 1, intstr.FromInt32(0), intstr.FromInt32(0), ""},
		{"0/0 is 0/1, of 2", 2, intstr.FromInt32(0), intstr.FromInt32(0), ""},
		{"counts as they are", 10, intstr.FromInt32(2), intstr.FromInt32(1), ""},
		{"100% of 4", 4, intstr.FromString("0%"), intstr.FromString("100%"), "100% resolves to 4 of 4 replicas"},
		{"a count above replicas", 3, intstr.FromString("25%"), intstr.FromInt32(5), "5 resolves to 5 of 3 replicas"},
		{"99% of 2 rounds down to 1", 2, intstr.FromString("25%"), intstr.FromString("99%"), ""},
		{"one replica may go", 1, intstr.FromString("25%"), intstr.FromString("100%"), ""},
		{"a huge maxSurge percentage never overflows", 3, intstr.FromString("99999999999999999999%"), intstr.FromString("25%"), ""},
		// The API server and the Deployment controller read leading zeros
		// as nothing.
		{"leading zeros", 4, intstr.FromString("0000000025%"), intstr.FromString("000000050%"), ""},
		{"leading zeros, all", 4, intstr.FromString("0%"), intstr.FromString("0000000100%"), "0000000100% resolves to 4 of 4 replicas"},
		{"a huge count of zeros", 2, intstr.FromString("25%"), intstr.FromString("00000000000000000000000000000050%"), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := evaluate(t, Request{Operation: admission.Create, Object: rolling(tc.replicas, tc.surge, tc.unavailable)}, defaults, Refusals)
			got := ""
			for _, f := range fs {
				got = f.Message
				assert.Equal(t, "spec.strategy.rollingUpdate.maxUnavailable", f.Field)
			}
			if tc.want == "" {
				assert.Empty(t, got)
			} else {
				assert.Contains(t, got, tc.want)
			}
		})
	}
}

// The cleanup annotation's grammar is the reconciler's (vocab): the policy
// refuses exactly what ParseCleanupSteps cannot read.
func TestCleanupStepsAgreeWithTheReconciler(t *testing.T) {
	for _, v := range []string{"", "record", "drain", "record,drain", "drain,record", " Record , DRAIN ", "none", "none,record",
		"backup", "record,backup", ",", "record,,drain", "none,none", "NONE"} {
		d := rolling(1, intstr.FromString("25%"), intstr.FromString("25%"))
		d.Annotations = map[string]string{vocab.AnnotationCleanup: v}
		fs := evaluate(t, Request{Operation: admission.Create, Object: d}, defaults, Refusals)
		_, err := vocab.ParseCleanupSteps(v)
		assert.Equal(t, err != nil, len(fs) > 0, "%q: the policy refuses it (%+v) as ParseCleanupSteps does (%v)", v, fs, err)
		if err != nil && len(fs) > 0 {
			assert.Contains(t, fs[0].Message, strings.TrimSuffix(err.Error(), "."), "%q: the policy says what the reconciler says", v)
		}
	}
}

// A message the API server will not show (one with a line break, or over
// 5 KiB) gives way to the validation's static message, which still names
// the field and what to do, never to the expression's text.
func TestUnshowableMessagesFallBackToTheStaticOnes(t *testing.T) {
	d := rolling(1, intstr.FromString("25%"), intstr.FromString("25%"))
	d.Annotations = map[string]string{vocab.AnnotationCleanup: "rec\nord"}
	fs := evaluate(t, Request{Operation: admission.Create, Object: d}, defaults, Refusals)
	require.Len(t, fs, 1, "%+v", fs)
	assert.Equal(t, "metadata.annotations[deployguard.io/cleanup]", fs[0].Field)
	assert.Contains(t, fs[0].Message, `the steps are "record" and "drain"`)
	d = rolling(1, intstr.FromString("25%"), intstr.FromString("25%"))
	for i := range 400 {
		d.Finalizers = append(d.Finalizers, fmt.Sprintf("deployguard.io/unknown-finalizer-%03d", i))
	}
	fs = evaluate(t, Request{Operation: admission.Create, Object: d}, defaults, Refusals)
	require.Len(t, fs, 2, "unknown finalizers, and more than a Deployment may carry: %+v", fs)
	assert.Equal(t, "metadata.finalizers", fs[0].Field)
	assert.Contains(t, fs[0].Message, "supported values")
	assert.LessOrEqual(t, len(fs[0].Message), 5*1024, "the message's length")
	assert.Contains(t, fs[1].Message, "400 finalizers besides deployguard's")
}

// Exemptions, the guard's own writes and metadata-only updates skip the
// spec rules; the finalizer rules hold for everyone but the guard and
// break-glass groups.
func TestWhoTheRulesSkip(t *testing.T) {
	bad := rolling(3, intstr.FromString("25%"), intstr.FromString("100%"))
	s := defaults
	s.ExemptNamespaces, s.BreakGlassGroups = []string{"shop"}, []string{"platform-admins"}
	assert.Empty(t, evaluate(t, Request{Operation: admission.Create, Object: bad}, s, Refusals), "exempt namespace")
	assert.Empty(t, evaluate(t, Request{Operation: admission.Update, Object: bad, OldObject: bad.DeepCopy(),
		User: &user.DefaultInfo{Name: "alice"}}, defaults, Refusals), "an update that leaves the spec alone")
	assert.Empty(t, evaluate(t, Request{Operation: admission.Create, Object: bad, User: &user.DefaultInfo{Name: defaults.GuardUsername}}, defaults, Refusals), "the guard's own write")
	old := rolling(1, intstr.FromString("25%"), intstr.FromString("25%"))
	old.Finalizers = []string{vocab.FinalizerRecord, vocab.FinalizerDrain}
	old.DeletionTimestamp = &metav1.Time{}
	cur := old.DeepCopy()
	cur.Finalizers = nil
	for _, tc := range []struct {
		name    string
		who     user.Info
		refused bool
	}{
		{"a user", &user.DefaultInfo{Name: "alice"}, true},
		{"a break-glass group", &user.DefaultInfo{Name: "bob", Groups: []string{"platform-admins"}}, false},
		{"the guard", &user.DefaultInfo{Name: defaults.GuardUsername}, false},
	} {
		fs := evaluate(t, Request{Operation: admission.Update, Object: cur, OldObject: old, User: tc.who}, s, Refusals)
		assert.Equal(t, tc.refused, len(fs) > 0, "%s removes the finalizers while deleting, refused: %+v", tc.name, fs)
	}
}

// Deletion protection, and the namespace controller let through.
func TestDeletionProtection(t *testing.T) {
	d := rolling(1, intstr.FromString("25%"), intstr.FromString("25%"))
	d.Annotations = map[string]string{vocab.AnnotationProtected: "true"}
	fs := evaluate(t, Request{Operation: admission.Delete, OldObject: d}, defaults, Refusals)
	if assert.Len(t, fs, 1, "a protected Deployment deleted: %+v", fs) {
		assert.Contains(t, fs[0].Message, "kubectl annotate deployment web -n shop deployguard.io/protected-")
	}
	assert.Empty(t, evaluate(t, Request{Operation: admission.Delete, OldObject: d,
		User: &user.DefaultInfo{Name: "system:serviceaccount:kube-system:namespace-controller"}}, defaults, Refusals), "the namespace controller")
	// The garbage collector deletes a Deployment whose owners are gone: not
	// a protected one, whoever added the owner.
	fs = evaluate(t, Request{Operation: admission.Delete, OldObject: d,
		User: &user.DefaultInfo{Name: "system:serviceaccount:kube-system:generic-garbage-collector"}}, defaults, Refusals)
	if assert.Len(t, fs, 1, "the garbage collector deletes a protected Deployment: %+v", fs) {
		assert.Contains(t, fs[0].Message, "removing its owner references")
	}
}

// An owner reference lets the garbage collector delete the Deployment once
// the owner goes: adding one to a protected Deployment is refused as its
// deletion is, to everyone but the control plane.
func TestOwnerOfAProtectedDeployment(t *testing.T) {
	owner := func(name, uid string) metav1.OwnerReference {
		return metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: name, UID: types.UID(uid)}
	}
	deployment := func(protected string, owners ...metav1.OwnerReference) *appsv1.Deployment {
		d := rolling(1, intstr.FromString("25%"), intstr.FromString("25%"))
		if protected != "" {
			d.Annotations = map[string]string{vocab.AnnotationProtected: protected}
		}
		d.OwnerReferences = owners
		return d
	}
	with := func(r metav1.OwnerReference, f func(*metav1.OwnerReference)) metav1.OwnerReference {
		f(&r)
		return r
	}
	gc := &user.DefaultInfo{Name: "system:serviceaccount:kube-system:generic-garbage-collector"}
	s := defaults
	s.ExemptUsernames = []string{"ci-bot"}
	s.BreakGlassGroups = []string{"platform-admins"}
	for _, tc := range []struct {
		name     string
		op       admission.Operation
		old, cur *appsv1.Deployment
		who      user.Info
		refused  string // in the message; "" admitted
	}{
		{"an owner added to a protected Deployment", admission.Update, deployment("true"), deployment("true", owner("bait", "u1")), nil,
			"an owner reference to ConfigMap bait lets the garbage collector delete it"},
		{"a second owner added", admission.Update, deployment("true", owner("a", "u1")), deployment("true", owner("a", "u1"), owner("bait", "u2")), nil,
			"ConfigMap bait"},
		{"an owner's uid changed", admission.Update, deployment("true", owner("a", "u1")), deployment("true", owner("a", "u2")), nil,
			"ConfigMap a"},
		{"by an exempt user", admission.Update, deployment("true"), deployment("true", owner("bait", "u1")), &user.DefaultInfo{Name: "ci-bot"},
			"kubectl annotate deployment web -n shop deployguard.io/protected-"},
		{"by a break-glass group", admission.Update, deployment("true"), deployment("true", owner("bait", "u1")),
			&user.DefaultInfo{Name: "bob", Groups: []string{"platform-admins"}}, "lets the garbage collector"},
		{"by the guard", admission.Update, deployment("true"), deployment("true", owner("bait", "u1")), &user.DefaultInfo{Name: s.GuardUsername},
			"lets the garbage collector"},
		// The same uid naming another owner: the garbage collector finds
		// none by those coordinates, and deletes the Deployment.
		{"an owner's name rewritten, its uid kept", admission.Update, deployment("true", owner("a", "u1")), deployment("true", owner("gone", "u1")), nil,
			"ConfigMap gone"},
		{"an owner's kind rewritten, its uid kept", admission.Update, deployment("true", owner("a", "u1")),
			deployment("true", with(owner("a", "u1"), func(r *metav1.OwnerReference) { r.Kind = "Secret" })), nil, "Secret a"},
		{"an owner's apiVersion rewritten, its uid kept", admission.Update, deployment("true", owner("a", "u1")),
			deployment("true", with(owner("a", "u1"), func(r *metav1.OwnerReference) { r.APIVersion = "example.com/v1" })), nil, "ConfigMap a"},
		{"an owner's controller flag set", admission.Update, deployment("true", owner("a", "u1")),
			deployment("true", with(owner("a", "u1"), func(r *metav1.OwnerReference) { r.Controller = ptr.To(true) })), nil, ""},
		// A CREATE makes no existing Deployment deletable, and the garbage
		// collector's DELETE of a protected one is refused anyway.
		{"an operator creates a protected Deployment it owns", admission.Create, nil, deployment("true", owner("op", "u1")), nil, ""},
		{"an owner of an unprotected Deployment", admission.Update, deployment(""), deployment("", owner("bait", "u1")), nil, ""},
		{"protection set to false", admission.Update, deployment("false"), deployment("false", owner("bait", "u1")), nil, ""},
		{"an operator creates an unprotected Deployment it owns", admission.Create, nil, deployment("", owner("op", "u1")), nil, ""},
		{"protection lifted as the owner is added", admission.Update, deployment("true"), deployment("", owner("bait", "u1")), nil, ""},
		{"protection set on an owned Deployment", admission.Update, deployment("", owner("a", "u1")), deployment("true", owner("a", "u1")), nil, ""},
		{"an owner removed", admission.Update, deployment("true", owner("a", "u1"), owner("b", "u2")), deployment("true", owner("b", "u2")), nil, ""},
		{"the garbage collector orphans it", admission.Update, deployment("true", owner("a", "u1")), deployment("true"), gc, ""},
		{"the control plane adds an owner", admission.Update, deployment("true"), deployment("true", owner("a", "u1")), gc, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := evaluate(t, Request{Operation: tc.op, Object: tc.cur, OldObject: tc.old, User: tc.who}, s, Refusals)
			if tc.refused == "" {
				assert.Empty(t, fs)
				return
			}
			if assert.Len(t, fs, 1, "%+v", fs) {
				assert.Equal(t, "metadata.ownerReferences", fs[0].Field)
				assert.Equal(t, metav1.StatusReasonForbidden, fs[0].Reason)
				assert.Contains(t, fs[0].Message, tc.refused)
			}
		})
	}
}

// deprecated.deployment.rollback.to makes the Deployment controller copy a
// ReplicaSet's template into the Deployment as itself: refused to all but
// the control plane and system:masters, with the command that rolls back
// as the user.
func TestDeprecatedRollbackAnnotation(t *testing.T) {
	with := func(rev string) *appsv1.Deployment {
		d := rolling(1, intstr.FromString("25%"), intstr.FromString("25%"))
		if rev != "" {
			d.Annotations = map[string]string{appsv1.DeprecatedRollbackTo: rev}
		}
		return d
	}
	s := defaults
	s.ExemptUsernames = []string{"ci-bot"}
	s.ExemptNamespaces = []string{"shop"}
	s.BreakGlassGroups = []string{"platform-admins"}
	controller := &user.DefaultInfo{Name: "system:serviceaccount:kube-system:deployment-controller"}
	for _, tc := range []struct {
		name     string
		op       admission.Operation
		old, cur *appsv1.Deployment
		who      user.Info
		refused  string // in the message; "" admitted
	}{
		{"set by a tenant", admission.Update, with(""), with("3"), nil,
			"the ReplicaSet of revision 3 into this Deployment under its own identity, where no policy judges it; remove the annotation and roll back with: kubectl rollout undo deployment/web -n shop --to-revision=3"},
		{"revision 0, the previous one", admission.Update, with(""), with("0"), nil,
			"the previous revision's ReplicaSet into this Deployment under its own identity, where no policy judges it; remove the annotation and roll back with: kubectl rollout undo deployment/web -n shop"},
		{"changed", admission.Update, with("2"), with("3"), nil, "revision 3"},
		{"on a create", admission.Create, nil, with("1"), nil, "revision 1"},
		{"by an exempt user in an exempt namespace", admission.Update, with(""), with("3"), &user.DefaultInfo{Name: "ci-bot"}, "revision 3"},
		{"by a break-glass group", admission.Update, with(""), with("3"), &user.DefaultInfo{Name: "bob", Groups: []string{"platform-admins"}}, "revision 3"},
		{"by the guard", admission.Update, with(""), with("3"), &user.DefaultInfo{Name: s.GuardUsername}, "revision 3"},
		{"by system:masters", admission.Update, with(""), with("3"), &user.DefaultInfo{Name: "admin", Groups: []string{"system:masters"}}, ""},
		{"the controller clears it", admission.Update, with("3"), with(""), controller, ""},
		{"the controller's rollback write", admission.Update, with("3"), with("3"), controller, ""},
		{"the single-identity controller manager", admission.Update, with(""), with("3"), &user.DefaultInfo{Name: "system:kube-controller-manager"}, ""},
		{"an update that keeps a stored value", admission.Update, with("3"), with("3"), nil, ""},
		{"an update that removes it", admission.Update, with("3"), with(""), nil, ""},
		{"a DELETE", admission.Delete, with("3"), nil, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := evaluate(t, Request{Operation: tc.op, Object: tc.cur, OldObject: tc.old, User: tc.who}, s, Refusals)
			if tc.refused == "" {
				assert.Empty(t, fs)
				return
			}
			if assert.Len(t, fs, 1, "%+v", fs) {
				assert.Equal(t, "metadata.annotations[deprecated.deployment.rollback.to]", fs[0].Field)
				assert.Equal(t, metav1.StatusReasonForbidden, fs[0].Reason)
				assert.Contains(t, fs[0].Message, tc.refused)
			}
		})
	}
}

// The policies name the guard's finalizers and annotations as the reconciler
// does (vocab): a renamed constant fails here, not in a cluster.
func TestPoliciesUseTheGuardsVocabulary(t *testing.T) {
	r, err := Load()
	require.NoError(t, err)
	var refusals string
	for _, p := range r.Policies {
		if p.Name == Refusals {
			for _, v := range p.Spec.Variables {
				refusals += v.Expression + "\n"
			}
			for _, v := range p.Spec.Validations {
				refusals += v.Expression + "\n" + v.MessageExpression + "\n"
			}
		}
	}
	for _, c := range append(vocab.CanonicalFinalizers(), vocab.Domain+"/", vocab.AnnotationCleanup, vocab.AnnotationProtected, vocab.AnnotationSkipCleanup) {
		assert.Contains(t, refusals, c, "deployguard-refusals does not name %q", c)
	}
	for _, step := range vocab.CleanupSteps() {
		assert.Contains(t, refusals, "'"+step+"'", "deployguard-refusals does not name the cleanup step %q", step)
	}
}

// The guard evaluates its policies on a projection of the Deployment
// without the pod template (but for its labels) and the managed fields
// (project): no expression may read them, or the guard and the API server
// would disagree.
func TestPoliciesReadNoTemplate(t *testing.T) {
	r, err := Load()
	require.NoError(t, err)
	for _, p := range r.Policies {
		var exprs []string
		for _, v := range p.Spec.Variables {
			exprs = append(exprs, v.Expression)
		}
		for _, v := range p.Spec.Validations {
			exprs = append(exprs, v.Expression, v.MessageExpression)
		}
		for _, c := range p.Spec.MatchConditions {
			exprs = append(exprs, c.Expression)
		}
		for _, e := range exprs {
			// What a message says is not what it reads.
			e = stringLiterals.ReplaceAllString(e, "''")
			// The template's labels are projected.
			for _, labels := range []string{"spec.template.?metadata.?labels", "spec.template.metadata.labels", "spec.template.metadata)"} {
				e = strings.ReplaceAll(e, labels, "spec.projected")
			}
			assert.NotContains(t, e, "template", "%s reads the template", p.Name)
			assert.NotContains(t, e, "managedFields", "%s reads the managed fields", p.Name)
		}
	}
}

var stringLiterals = regexp.MustCompile(`'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"`)

// A template-only update is a spec change to the policies, as in the API
// server.
func TestATemplateOnlyUpdateIsChecked(t *testing.T) {
	old := rolling(3, intstr.FromString("25%"), intstr.FromString("100%"))
	cur := old.DeepCopy()
	cur.Spec.Template.Labels = map[string]string{"version": "2"}
	fs := evaluate(t, Request{Operation: admission.Update, Object: cur, OldObject: old}, defaults, Refusals)
	assert.Len(t, fs, 1, "a template change of an all-down Deployment: %+v", fs)
	assert.Empty(t, evaluate(t, Request{Operation: admission.Update, Object: old.DeepCopy(), OldObject: old}, defaults, Refusals), "no change")
}

// TestParamsFollowTheSettings: the params kept from the last call are given
// only for the same settings; a change of config gives the new values.
func TestParamsFollowTheSettings(t *testing.T) {
	other := defaults
	other.ExemptNamespaces = []string{"legacy"}
	for _, s := range []Settings{defaults, other, other, defaults} {
		u, _ := s.Params().obj.(*unstructured.Unstructured)
		data, _ := u.Object["data"].(map[string]any)
		for k, v := range s.Data() {
			assert.Equal(t, v, data[k], "params %s", k)
		}
	}
	assert.Same(t, defaults.Params(), defaults.Params(), "the same settings build their params again")
}

// What the guard keeps of every Deployment in memory and a tenant sizes is
// bounded: labels, the template's labels, the selector's terms, finalizers
// and owner references. The guard's own labels and finalizers do not count;
// one already over a bound may be updated, not grown.
func TestWhatTheGuardKeepsIsBounded(t *testing.T) {
	labels := func(n int, own bool) map[string]string {
		m := map[string]string{}
		for i := range n {
			m[fmt.Sprintf("team.example.com/l-%d", i)] = "v"
		}
		if own {
			m[LabelDefaulting], m[LabelRefusals], m[vocab.LabelRolledBack] = "pending", "pending", "2"
		}
		return m
	}
	finalizers := func(n int) []string {
		var f []string
		for i := range n {
			f = append(f, fmt.Sprintf("team.example.com/f-%d", i))
		}
		return f
	}
	owners := func(n int) []metav1.OwnerReference {
		var o []metav1.OwnerReference
		for i := range n {
			o = append(o, metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: fmt.Sprintf("o-%d", i), UID: types.UID(fmt.Sprintf("u-%d", i))})
		}
		return o
	}
	selector := func(terms int) *metav1.LabelSelector {
		values := make([]string, terms-2)
		for i := range values {
			values[i] = fmt.Sprintf("v-%d", i)
		}
		return &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"},
			MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "tier", Operator: metav1.LabelSelectorOpNotIn, Values: values}}}
	}
	base := func() *appsv1.Deployment {
		d := rolling(3, intstr.FromString("25%"), intstr.FromString("25%"))
		d.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}
		d.Spec.Template.Labels = map[string]string{"app": "web"}
		return d
	}
	with := func(f func(*appsv1.Deployment)) *appsv1.Deployment {
		d := base()
		f(d)
		return d
	}
	over := with(func(d *appsv1.Deployment) { d.Labels = labels(70, false) })
	for _, tc := range []struct {
		name     string
		req      Request
		settings Settings
		want     string // the refusal, as kubectl shows it; "" admitted
	}{
		{"metadata.labels: 64 labels and the guard's", Request{Operation: admission.Create, Object: with(func(d *appsv1.Deployment) { d.Labels = labels(64, true) })}, defaults, ""},
		{"metadata.labels: 65 labels", Request{Operation: admission.Create, Object: with(func(d *appsv1.Deployment) { d.Labels = labels(65, true) })}, defaults,
			"metadata.labels: 65 labels besides deployguard's, more than the 64 a Deployment may carry; keep the labels that select or group it, and move the rest to metadata.annotations. deployguard keeps these of every Deployment in memory"},
		{"65 on the pod template", Request{Operation: admission.Create, Object: with(func(d *appsv1.Deployment) { d.Spec.Template.Labels = labels(65, false) })}, defaults,
			"spec.template.metadata.labels: 65 labels besides deployguard's, more than the 64 a pod template may carry; keep the labels that select the pods, and move the rest to spec.template.metadata.annotations. deployguard keeps these of every Deployment in memory"},
		{"65 of the guard's domain that are not the guard's", Request{Operation: admission.Create, Object: with(func(d *appsv1.Deployment) {
			d.Labels = map[string]string{}
			for i := range 65 {
				d.Labels[fmt.Sprintf("deployguard.io/x-%d", i)] = "v"
			}
		})}, defaults,
			"metadata.labels: 65 labels besides deployguard's, more than the 64 a Deployment may carry; keep the labels that select or group it, and move the rest to metadata.annotations. deployguard keeps these of every Deployment in memory"},
		{"the guard's finalizer 20 times", Request{Operation: admission.Create, Object: with(func(d *appsv1.Deployment) {
			for range 20 {
				d.Finalizers = append(d.Finalizers, vocab.FinalizerRecord)
			}
		})}, defaults,
			"metadata.finalizers: 19 finalizers besides deployguard's, more than the 16 a Deployment may carry. deployguard keeps these of every Deployment in memory"},
		{"a selector of 64 terms", Request{Operation: admission.Create, Object: with(func(d *appsv1.Deployment) { d.Spec.Selector = selector(64) })}, defaults, ""},
		{"a selector of 65 terms", Request{Operation: admission.Create, Object: with(func(d *appsv1.Deployment) { d.Spec.Selector = selector(65) })}, defaults,
			"spec.selector: 65 terms (match labels, expressions and their values), more than the 64 a selector may have; select on the pods' identity labels. deployguard keeps these of every Deployment in memory"},
		{"metadata.finalizers: 16 finalizers and the guard's", Request{Operation: admission.Create, Object: with(func(d *appsv1.Deployment) {
			d.Finalizers = append(finalizers(16), vocab.FinalizerRecord, vocab.FinalizerDrain)
		})}, defaults, ""},
		{"metadata.finalizers: 17 finalizers", Request{Operation: admission.Create, Object: with(func(d *appsv1.Deployment) { d.Finalizers = finalizers(17) })}, defaults,
			"metadata.finalizers: 17 finalizers besides deployguard's, more than the 16 a Deployment may carry. deployguard keeps these of every Deployment in memory"},
		{"17 owners", Request{Operation: admission.Create, Object: with(func(d *appsv1.Deployment) { d.OwnerReferences = owners(17) })}, defaults,
			"metadata.ownerReferences: 17 owner references, more than the 16 a Deployment may carry. deployguard keeps these of every Deployment in memory"},
		{"labels added to 64", Request{Operation: admission.Update, Object: with(func(d *appsv1.Deployment) { d.Labels = labels(65, false) }),
			OldObject: with(func(d *appsv1.Deployment) { d.Labels = labels(64, false) })}, defaults,
			"metadata.labels: 65 labels besides deployguard's, more than the 64 a Deployment may carry; keep the labels that select or group it, and move the rest to metadata.annotations. deployguard keeps these of every Deployment in memory"},
		{"one over, updated", Request{Operation: admission.Update, Object: with(func(d *appsv1.Deployment) { d.Labels = labels(70, false); d.Spec.Replicas = ptr.To[int32](5) }),
			OldObject: over}, defaults, ""},
		{"one over, shrunk", Request{Operation: admission.Update, Object: with(func(d *appsv1.Deployment) { d.Labels = labels(66, false) }), OldObject: over}, defaults, ""},
		{"one over, grown", Request{Operation: admission.Update, Object: with(func(d *appsv1.Deployment) { d.Labels = labels(71, false) }), OldObject: over}, defaults,
			"metadata.labels: 71 labels besides deployguard's, more than the 64 a Deployment may carry (it had 70: it may keep them, not add more); keep the labels that select or group it, and move the rest to metadata.annotations. deployguard keeps these of every Deployment in memory"},
		{"a stored selector over", Request{Operation: admission.Update, Object: with(func(d *appsv1.Deployment) { d.Spec.Selector = selector(80); d.Spec.Replicas = ptr.To[int32](5) }),
			OldObject: with(func(d *appsv1.Deployment) { d.Spec.Selector = selector(80) })}, defaults, ""},
		{"deleted", Request{Operation: admission.Delete, OldObject: over}, defaults, ""},
		{"by the guard", Request{Operation: admission.Create, Object: over, User: &user.DefaultInfo{Name: defaults.GuardUsername}}, defaults, ""},
		{"in an exempt namespace", Request{Operation: admission.Create, Object: over}, Settings{ExemptNamespaces: []string{"shop"}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := evaluate(t, tc.req, tc.settings, Refusals)
			if tc.want == "" {
				assert.Empty(t, fs)
				return
			}
			if assert.Len(t, fs, 1, "%+v", fs) {
				assert.Equal(t, tc.want, fs[0].Line())
				assert.True(t, strings.HasSuffix(fs[0].Message, SizeBoundSuffix), "the guard tells it by its end")
			}
		})
	}
}

// The guard files the size bounds' findings under a check of their own by
// how their messages end (SizeBoundSuffix): both of their messages end so,
// and no other validation's.
func TestOnlyTheSizeBoundsEndWithTheirSuffix(t *testing.T) {
	r, err := Load()
	require.NoError(t, err)
	sized := 0
	for _, p := range r.Policies {
		for _, v := range p.Spec.Validations {
			bound := v.Expression == "variables.sizeBounded"
			if bound {
				sized++
			}
			assert.Equal(t, bound, strings.HasSuffix(strings.TrimSpace(v.Message), SizeBoundSuffix), "%s: the message of %q", p.Name, v.Expression)
			assert.Equal(t, bound, strings.HasSuffix(strings.TrimSpace(stringLiterals.FindString(lastLiteral(v.MessageExpression))), SizeBoundSuffix+"'"),
				"%s: the message expression of %q", p.Name, v.Expression)
		}
	}
	assert.Equal(t, 1, sized, "the size bounds' validation")
}

// lastLiteral is the tail of e from its last string literal on.
func lastLiteral(e string) string {
	locs := stringLiterals.FindAllStringIndex(e, -1)
	if len(locs) == 0 {
		return ""
	}
	return e[locs[len(locs)-1][0]:]
}
