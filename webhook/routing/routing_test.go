package routing

import (
	"context"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/utils/ptr"

	"github.com/deployguard/deployguard/policy"
	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/webhook/native"
	"github.com/deployguard/deployguard/webhook/review"
	"github.com/deployguard/deployguard/webhook/review/reviewtest"
)

// matches compiles expr as a matchCondition with the API server's own CEL
// compiler (a policy whose one validation always fails: it fails exactly when
// the condition matches) and evaluates it on r.
func matches(t *testing.T, expr string, r native.Request) bool {
	t.Helper()
	p, err := native.Compile(&admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "condition"},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy:   ptr.To(admissionregistrationv1.Fail),
			MatchConditions: []admissionregistrationv1.MatchCondition{{Name: "c", Expression: expr}},
			Validations:     []admissionregistrationv1.Validation{{Expression: "false", Message: "matched"}},
		},
	})
	require.NoError(t, err, expr)
	ds := p.Evaluate(context.Background(), r)
	for _, d := range ds {
		require.False(t, d.Error, "the condition errors (a Fail entry would refuse): %s\n%s", d.Message, expr)
	}
	return len(ds) > 0
}

// TestRouting: each request goes to at most one of the entries, the
// enforcing one only where an enforced rule that needs the guard may refuse
// it; to none only an update that leaves the spec as it was, when no
// loaded policy reads more than the spec; and no condition errors. So in
// the previous layout (two entries), which the guard still routes.
func TestRouting(t *testing.T) {
	def := reviewtest.Options()
	def.NativeInAPIServer = true
	def.Quarantine = review.QuarantineEnforce
	def.GuardUsername = "system:serviceaccount:deployguard-system:deployguard"
	def.ExemptNamespaces = []string{"legacy"}
	def.ExemptGroups = []string{"ops:exempt"}

	base := reviewtest.Guarded()
	base.Namespace = "shop"
	quarantinedOld := reviewtest.Guarded(func(d *appsv1.Deployment) {
		d.Annotations[vocab.AnnotationQuarantinedTemplates] = "abc"
		d.Labels = map[string]string{vocab.LabelQuarantined: vocab.LabelQuarantinedValue}
	})
	// Quarantined by an earlier release, or its label removed by a client.
	unlabelledOld := quarantinedOld.DeepCopy()
	delete(unlabelledOld.Labels, vocab.LabelQuarantined)
	image := func(d *appsv1.Deployment) *appsv1.Deployment {
		d = d.DeepCopy()
		d.Spec.Template.Spec.Containers[0].Image = "app:9"
		return d
	}
	scaled := base.DeepCopy()
	scaled.Spec.Replicas = ptr.To(int32(7))
	annotated := base.DeepCopy()
	annotated.Annotations["team"] = "a"
	finalized := base.DeepCopy()
	finalized.Finalizers = append(finalized.Finalizers, vocab.FinalizerDrain)
	cleanupAsked := base.DeepCopy()
	cleanupAsked.Annotations[vocab.AnnotationCleanup] = "drain"
	relabelled := base.DeepCopy()
	relabelled.Spec.Template.Labels["tier"] = "web"
	noLabels := base.DeepCopy()
	noLabels.Spec.Template.Labels = nil
	noReplicas := base.DeepCopy()
	noReplicas.Spec.Replicas = nil
	app := &user.DefaultInfo{Name: "alice", Groups: []string{"dev"}}

	type req struct {
		name    string
		op      admission.Operation
		obj     *appsv1.Deployment
		old     *appsv1.Deployment
		ns      string
		u       user.Info
		decides bool
		// quiet: the request reaches neither entry.
		quiet bool
		// unlabelled: decided by the enforce entry in the previous layout
		// only; in this one its objectSelector leaves it to the update
		// entry.
		unlabelled bool
	}
	create := req{name: "create", op: admission.Create, obj: base}
	imageUpdate := req{name: "image change", op: admission.Update, obj: image(base), old: base}
	scale := req{name: "scale", op: admission.Update, obj: scaled, old: base}
	metadata := req{name: "annotation change", op: admission.Update, obj: annotated, old: base}
	finalizer := req{name: "finalizer added", op: admission.Update, obj: finalized, old: base}
	unfinalize := req{name: "finalizer removed", op: admission.Update, obj: base, old: finalized}
	cleanup := req{name: "cleanup annotation written", op: admission.Update, obj: cleanupAsked, old: base}
	del := req{name: "delete", op: admission.Delete, old: base}
	quarantine := req{name: "template change of a quarantined Deployment", op: admission.Update, obj: image(quarantinedOld), old: quarantinedOld}
	quarantineMeta := req{name: "annotation change of a quarantined Deployment", op: admission.Update, obj: quarantinedOld, old: quarantinedOld}
	unlabelledQuarantine := req{name: "template change of a quarantined Deployment without the label", op: admission.Update, obj: image(unlabelledOld), old: unlabelledOld}
	labelRemoved := req{name: "template change of a quarantined Deployment that removes the label", op: admission.Update, obj: image(unlabelledOld), old: quarantinedOld}
	unlabelled := func(r *req) { r.unlabelled = true }
	relabel := req{name: "template labels change", op: admission.Update, obj: relabelled, old: base}
	unlabel := req{name: "template labels removed", op: admission.Update, obj: noLabels, old: base}
	unset := req{name: "replicas unset", op: admission.Update, obj: noReplicas, old: base}
	with := func(r req, decides bool, mut ...func(*req)) req {
		r.decides = decides
		for _, m := range mut {
			m(&r)
		}
		return r
	}
	in := func(ns string) func(*req) { return func(r *req) { r.ns, r.name = ns, r.name+" in "+ns } }
	quiet := func(r *req) { r.quiet = true }
	as := func(u user.Info) func(*req) { return func(r *req) { r.u, r.name = u, r.name+" by "+u.GetName() } }
	guard := &user.DefaultInfo{Name: def.GuardUsername}
	exemptGroup := &user.DefaultInfo{Name: "bob", Groups: []string{"dev", "ops:exempt"}}
	noGroups := &user.DefaultInfo{Name: "carol"}

	cases := []struct {
		name   string
		mut    func(*review.Options)
		loaded LoadedPolicies
		reqs   []req
	}{
		{"default install: only the quarantine", nil, LoadedPolicies{}, []req{
			with(create, false), with(imageUpdate, false), with(scale, false), with(metadata, false, quiet), with(del, false),
			with(quarantine, true), with(quarantineMeta, false, quiet), with(quarantine, true, in("legacy")), with(quarantine, true, as(guard)),
			with(labelRemoved, true), with(unlabelledQuarantine, true, unlabelled),
			with(metadata, false, quiet, as(guard)), with(metadata, false, quiet, in("legacy")),
			// The finalizer rules judge these: a replica that finds them no
			// longer enforced by the API server evaluates them itself.
			with(finalizer, false), with(unfinalize, false), with(cleanup, false), with(finalizer, false, as(guard)),
		}},
		{"a policy that reads the metadata", nil, LoadedPolicies{BeyondSpec: true}, []req{
			with(create, false), with(imageUpdate, false), with(metadata, false), with(quarantineMeta, false), with(quarantine, true),
			with(unlabelledQuarantine, true, unlabelled),
		}},
		{"quarantine off", func(o *review.Options) { o.Quarantine = review.QuarantineWarn }, LoadedPolicies{}, []req{
			with(quarantine, false), with(create, false), with(quarantineMeta, false, quiet),
		}},
		{"native refusals not in the API server: everything", func(o *review.Options) { o.NativeInAPIServer = false }, LoadedPolicies{}, []req{
			with(create, true), with(metadata, true), with(del, true),
		}},
		{"an enforced Rego policy", nil, LoadedPolicies{Enforce: true}, []req{
			with(create, true), with(imageUpdate, true), with(scale, true), with(metadata, true),
			with(create, false, in("legacy")), with(imageUpdate, false, as(guard)), with(imageUpdate, false, as(exemptGroup)),
			with(imageUpdate, true, as(noGroups)), with(quarantine, true, in("legacy")), with(metadata, false, quiet, in("legacy")),
			// Every Deployment is selected: no label needed.
			with(unlabelledQuarantine, true),
			// Not known to judge no deletion: the policies judge the
			// Deployment being deleted, with the same exemptions.
			with(del, true), with(del, true, as(noGroups)), with(del, false, in("legacy")), with(del, false, as(guard)),
			with(del, false, as(exemptGroup)),
		}},
		{"enforced Rego policies that judge no deletion", nil, LoadedPolicies{Enforce: true, EnforceSkipsDelete: true}, []req{
			with(create, true), with(imageUpdate, true), with(del, false), with(metadata, true),
		}},
		{"an enforced Rego policy that reads the metadata", nil, LoadedPolicies{Enforce: true, BeyondSpec: true}, []req{
			with(metadata, true), with(metadata, false, in("legacy")), with(metadata, false, as(guard)), with(create, false, in("legacy")),
		}},
		{"enforced bounds", func(o *review.Options) { o.BoundsEnforce = true }, LoadedPolicies{}, []req{
			with(create, true), with(imageUpdate, true), with(metadata, false, quiet), with(del, false), with(create, false, in("legacy")),
		}},
		{"enforced budgets", func(o *review.Options) { o.DisruptionBudgets = review.BudgetsEnforce }, LoadedPolicies{}, []req{
			with(create, true), with(scale, true), with(relabel, true), with(unlabel, true), with(unset, true),
			with(imageUpdate, false), with(metadata, false, quiet), with(del, false), with(scale, false, as(guard)),
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := *def
			if c.mut != nil {
				c.mut(&o)
			}
			e := EnforcedOf(&o, c.loaded)
			decide, advise, adviseCreates := MustDecide(e), MayAdvise(e), MayAdviseCreate(e)
			selector, err := metav1.LabelSelectorAsSelector(EnforceObjectSelector(e))
			require.NoError(t, err)
			if EnforceObjectSelector(e) == nil {
				selector = labels.Everything()
			}
			// An objectSelector matches when the stored object or the new one does.
			selected := func(r req) bool {
				for _, d := range []*appsv1.Deployment{r.obj, r.old} {
					if d != nil && selector.Matches(labels.Set(d.Labels)) {
						return true
					}
				}
				return false
			}
			for _, r := range c.reqs {
				ns := r.ns
				if ns == "" {
					ns = "shop"
				}
				u := r.u
				if u == nil {
					u = app
				}
				nr := native.Request{Operation: r.op, Object: r.obj, OldObject: r.old, Namespace: ns, Name: base.Name, User: u}
				// As the API server picks the entries: by their operations,
				// their objectSelector, then their conditions (none: every
				// request).
				enforced := slices.Contains(EnforceOperations(e), admissionregistrationv1.OperationType(r.op)) && selected(r) && matches(t, decide, nr)
				created := r.op == admission.Create && (adviseCreates == "" || matches(t, adviseCreates, nr))
				updated := r.op == admission.Update && matches(t, advise, nr)
				decides := r.decides && !r.unlabelled
				assert.Equal(t, decides, enforced, "%s: enforced by the guard (failurePolicy Fail)", r.name)
				if r.op != admission.Delete {
					assert.Equal(t, !decides && !r.quiet, created || updated, "%s: advised by the guard (failurePolicy Ignore)", r.name)
				}
				// The previous layout: enforce for every operation, one
				// entry for the creates and updates advised.
				legacy := matches(t, decide, nr)
				assert.Equal(t, r.decides, legacy, "%s: enforced by the guard (previous layout)", r.name)
				if r.op != admission.Delete {
					assert.Equal(t, !legacy && !r.quiet, matches(t, mayAdvise(e, false), nr), "%s: advised by the guard (previous layout)", r.name)
				}
			}
		})
	}
}

// The mutating webhook is called for the marks deployguard-selector leaves
// in a request, and not again for a mark a Deployment keeps.
func TestMutatingScopeSeesTheSelectorMarks(t *testing.T) {
	var expr string
	for _, mc := range shippedMutating(t).Webhooks[0].MatchConditions {
		if mc.Name == "guard-may-change-it" {
			expr = mc.Expression
		}
	}
	require.NotEmpty(t, expr)
	// Without the guard's cleanup steps and finalizers, which the webhook is
	// called for anyway.
	plain := reviewtest.Stored()
	repaired := plain.DeepCopy()
	repaired.Annotations = map[string]string{native.AnnotationSelectorRepaired: "true"}
	refused := plain.DeepCopy()
	refused.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{native.LabelEmptySelector: native.EmptySelectorRefused}}
	labelled := plain.DeepCopy()
	labelled.Labels = map[string]string{native.LabelDefaulting: native.DefaultingPending}
	app := &user.DefaultInfo{Name: "alice"}
	for _, tc := range []struct {
		name     string
		op       admission.Operation
		obj, old *appsv1.Deployment
		want     bool
	}{
		{"an ordinary create", admission.Create, plain, nil, false},
		{"a create the API server repaired", admission.Create, repaired, nil, true},
		{"a create the API server marked unrepairable", admission.Create, refused, nil, true},
		{"an update of a Deployment repaired while the guard was down", admission.Update, repaired, repaired, false},
		{"an update of a marked Deployment", admission.Update, refused, refused, false},
		{"an ordinary update", admission.Update, plain, plain, false},
		// Created while the guard was down: the label the API server put
		// on it for the guard is removed at the next update.
		{"an update of a Deployment labelled for the guard", admission.Update, labelled, labelled, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := matches(t, expr, native.Request{Operation: tc.op, Object: tc.obj, OldObject: tc.old, Namespace: "shop", Name: "web", User: app})
			assert.Equal(t, tc.want, got)
		})
	}
}

// TestEnforceOperationsCoverMustDecide: whatever is enforced, MustDecide is
// false for every operation EnforceOperations leaves out of the enforce
// entry's rules, so narrowing them never drops a request the guard must
// decide (the create entry then takes every create: MayAdviseCreate is
// empty exactly when CREATE is left out).
func TestEnforceOperationsCoverMustDecide(t *testing.T) {
	base := reviewtest.Guarded()
	base.Namespace = "shop"
	quarantined := reviewtest.Guarded(func(d *appsv1.Deployment) {
		d.Annotations[vocab.AnnotationQuarantinedTemplates] = "abc"
	})
	changed := quarantined.DeepCopy()
	changed.Spec.Template.Spec.Containers[0].Image = "app:9"
	changed.Spec.Replicas = ptr.To(int32(9))
	changed.Spec.Template.Labels["tier"] = "web"
	app := &user.DefaultInfo{Name: "alice", Groups: []string{"dev"}}
	reqs := []native.Request{
		{Operation: admission.Create, Object: base},
		{Operation: admission.Create, Object: quarantined},
		{Operation: admission.Update, Object: changed, OldObject: quarantined},
		{Operation: admission.Update, Object: base, OldObject: base},
		{Operation: admission.Delete, OldObject: quarantined},
		{Operation: admission.Delete, OldObject: base},
	}
	for mask := range 1 << 7 {
		e := Enforced{
			Refusals: mask&1 != 0, Quarantine: mask&2 != 0, Policies: mask&4 != 0,
			PoliciesBeyondSpec: mask&8 != 0, Bounds: mask&16 != 0, Budgets: mask&32 != 0,
			PoliciesOnDelete: mask&64 != 0,
		}
		ops := EnforceOperations(e)
		require.NotEmpty(t, ops, "%+v: a rule lists at least one operation", e)
		assert.Equal(t, slices.Contains(ops, admissionregistrationv1.Create), MayAdviseCreate(e) != "", "%+v", e)
		decide := MustDecide(e)
		for _, r := range reqs {
			r.Namespace, r.Name, r.User = "shop", base.Name, app
			if slices.Contains(ops, admissionregistrationv1.OperationType(r.Operation)) {
				continue
			}
			assert.False(t, matches(t, decide, r), "%+v: %s is not in the enforce entry's rules %v, yet the guard must decide it", e, r.Operation, ops)
		}
	}
}

// TestLoadedPoliciesOf: the routing learns from the loaded set whether a
// policy is enforced, and whether one of those enforced judges deletions
// (only then does a DELETE go to the enforce entry for the policies).
func TestLoadedPoliciesOf(t *testing.T) {
	tests := []struct {
		name    string
		modes   map[string]policy.Mode
		sources []policy.Source
		want    LoadedPolicies
	}{
		{"the built-ins, in warn", nil, nil, LoadedPolicies{EnforceSkipsDelete: true}},
		{"a built-in enforced: it judges no deletion", map[string]policy.Mode{"resources": policy.ModeEnforce}, nil,
			LoadedPolicies{Enforce: true, EnforceSkipsDelete: true}},
		{"an enforced deletion rule", nil, []policy.Source{reviewtest.CriticalPolicy("critical", "enforce")},
			LoadedPolicies{Enforce: true, BeyondSpec: true}},
		{"a deletion rule in warn, a built-in enforced", map[string]policy.Mode{"resources": policy.ModeEnforce},
			[]policy.Source{reviewtest.CriticalPolicy("critical", "warn")}, LoadedPolicies{Enforce: true, EnforceSkipsDelete: true, BeyondSpec: true}},
		{"an enforced rule about the object's labels alone", nil, []policy.Source{reviewtest.OwnerPolicy},
			LoadedPolicies{Enforce: true, EnforceSkipsDelete: true, BeyondSpec: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			eng, err := policy.New(policy.Options{PolicyModes: tt.modes})
			require.NoError(t, err)
			require.NoError(t, eng.Load(context.Background(), append(policy.Builtins(), tt.sources...)))
			assert.Equal(t, tt.want, LoadedPoliciesOf(eng.Active()))
		})
	}
}
