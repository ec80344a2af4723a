package native_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/authentication/user"

	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/test/harness"
	"github.com/deployguard/deployguard/webhook/native"
)

// The refusals' match condition only spares the API server work: every
// request it leaves out, each validation admits. Every request below is
// decided by the policy as installed and by the same policy without its
// match condition, and both must decide alike, in the same words. The
// ordinary writes must be left out, or the condition spares nothing.
func TestTheMatchConditionSkipsOnlyWhatIsAdmitted(t *testing.T) {
	rules, err := native.Load()
	require.NoError(t, err)
	installed := refusalsAsInstalled(rules)
	require.NotNil(t, installed, "%s is installed", native.Refusals)
	require.NotEmpty(t, installed.Spec.MatchConditions, "%s has no match condition", native.Refusals)
	unmatched := installed.DeepCopy()
	unmatched.Spec.MatchConditions = nil
	// The match condition alone: refused exactly when it matches.
	matches := installed.DeepCopy()
	matches.Spec.Validations = []admissionregistrationv1.Validation{{Expression: "false", Message: "matched"}}
	compile := func(p *admissionregistrationv1.ValidatingAdmissionPolicy) *native.Policy {
		c, err := native.Compile(p)
		require.NoError(t, err)
		return c
	}
	with, without, matcher := compile(installed), compile(unmatched), compile(matches)

	rng := rand.New(rand.NewPCG(25, 1))
	corpus, bases := corpusAndVaried(t, rng, 600)
	guard := native.Settings{GuardUsername: "system:serviceaccount:deployguard-system:deployguard",
		BreakGlassGroups: []string{"platform-admins"}, ExemptNamespaces: []string{"legacy"},
		ExemptUsernames: []string{"ci-bot"}, ExemptGroups: []string{"migrations"},
		StableLabelKeys: []string{"app.kubernetes.io/name", "app"}}
	users := []user.Info{
		&user.DefaultInfo{Name: "alice", Groups: []string{"system:authenticated"}},
		&user.DefaultInfo{Name: "bob", Groups: []string{"platform-admins", "system:authenticated"}},
		&user.DefaultInfo{Name: "ci-bot"},
		&user.DefaultInfo{Name: guard.GuardUsername},
		&user.DefaultInfo{Name: "system:serviceaccount:kube-system:namespace-controller"},
		&user.DefaultInfo{Name: "system:serviceaccount:kube-system:deployment-controller"},
		&user.DefaultInfo{Name: "system:serviceaccount:kube-system:generic-garbage-collector"},
		&user.DefaultInfo{Name: "admin", Groups: []string{"system:masters"}},
	}
	params := []runtime.Object{guard.ConfigMap("deployguard-system"), native.Settings{}.ConfigMap("deployguard-system")}

	ctx := context.Background()
	compared, refused, plainCreates, plainSkipped := 0, 0, 0, 0
	for i, d := range bases {
		for _, req := range requests(rng, d) {
			req.Namespace, req.Name = "shop", fmt.Sprintf("d-%d", i)
			if rng.IntN(8) == 0 {
				req.Namespace = "legacy"
			}
			req.User = users[rng.IntN(len(users))]
			req.Params = params[rng.IntN(len(params))]
			got, want := with.Evaluate(ctx, req), without.Evaluate(ctx, req)
			if !slices.Equal(got, want) {
				assert.Fail(t, "the match condition changes the decisions", "%s %s by %s: with it %+v, without %+v", req.Operation, req.Name, req.User.GetName(), got, want)
			}
			compared++
			if len(want) > 0 {
				refused++
			}
			if i < len(corpus) && req.Operation == admission.Create && plain(req.Object) {
				plainCreates++
				if len(matcher.Evaluate(ctx, req)) == 0 {
					plainSkipped++
				}
			}
		}
	}
	// Some corpus manifests set maxUnavailable to every replica: those
	// match, as they must. The others are left out.
	exercised(t, "requests", compared, refused, "left out", plainSkipped, plainCreates)
	// Where the config sets cleanup steps, every Deployment carries the
	// guard's finalizers and its cleanup annotation: an image change is
	// still left out.
	old := corpus[0].DeepCopy()
	old.Finalizers = []string{vocab.FinalizerRecord, vocab.FinalizerDrain}
	old.Annotations = map[string]string{vocab.AnnotationCleanup: "record,drain"}
	cur := old.DeepCopy()
	cur.Spec.Template.Spec.Containers[0].Image += "-next"
	req := native.Request{Operation: admission.Update, Object: cur, OldObject: old, Namespace: "shop", Name: old.Name,
		User: users[0], Params: params[0]}
	assert.Empty(t, matcher.Evaluate(ctx, req), "an image change of a Deployment with the guard's cleanup is matched")
}

// deployguard-refusals judges a create only when deployguard-selector
// labelled it (its binding for creates selects the label): every create it
// would refuse must come out of the selector policy labelled, as the API
// server applies it, whoever sends it and whatever the params. An ordinary
// create must come out unlabelled, or the label spares nothing.
func TestTheSelectorPolicyLabelsEveryCreateTheRefusalsRefuse(t *testing.T) {
	rules, err := native.Load()
	require.NoError(t, err)
	installed := refusalsAsInstalled(rules)
	// Without the refusals' own match condition: the label must not lean
	// on it.
	unmatched := installed.DeepCopy()
	unmatched.Spec.MatchConditions = nil
	refusals, err := native.Compile(unmatched)
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(25, 2))
	corpus, bases := corpusAndVaried(t, rng, 1500)
	// Empty selectors too: the repair's marker is what the refusals refuse.
	for i := range 100 {
		d := varied(rng, i)
		d.Spec.Selector = nil
		if i%2 == 0 {
			d.Spec.Template.Labels = map[string]string{"tier": "front"}
		}
		bases = append(bases, d)
	}
	settings := []native.Settings{{GuardUsername: "system:serviceaccount:deployguard-system:deployguard",
		BreakGlassGroups: []string{"platform-admins"}, ExemptNamespaces: []string{"legacy"},
		ExemptUsernames: []string{"ci-bot"}, StableLabelKeys: []string{"app.kubernetes.io/name", "app"}}, {}}
	users := []user.Info{
		&user.DefaultInfo{Name: "alice", Groups: []string{"system:authenticated"}},
		&user.DefaultInfo{Name: "ci-bot"},
		&user.DefaultInfo{Name: settings[0].GuardUsername},
		&user.DefaultInfo{Name: "system:serviceaccount:kube-system:deployment-controller"},
		&user.DefaultInfo{Name: "admin", Groups: []string{"system:masters"}},
	}
	ctx := context.Background()
	compared, refused, plainCreates, plainUnlabelled := 0, 0, 0, 0
	for i, d := range bases {
		s := settings[rng.IntN(len(settings))]
		req := native.Request{Operation: admission.Create, Object: d, Namespace: "shop", Name: fmt.Sprintf("d-%d", i),
			User: users[rng.IntN(len(users))], Params: s.ConfigMap("deployguard-system")}
		if rng.IntN(8) == 0 {
			req.Namespace = "legacy"
		}
		mutated, err := rules.Mutate(ctx, req, s.Params(), native.Selector)
		require.NoError(t, err, req.Name)
		req.Object = mutated
		_, labelled := mutated.Labels[native.LabelRefusals]
		compared++
		if ds := refusals.Evaluate(ctx, req); len(ds) > 0 {
			refused++
			if !labelled {
				assert.Fail(t, "refused but not labelled: the API server would admit it", "%s by %s is refused (%+v) but not labelled %s", req.Name, req.User.GetName(), ds, native.LabelRefusals)
			}
		}
		if i < len(corpus) && plain(d) {
			plainCreates++
			if !labelled {
				plainUnlabelled++
			}
		}
	}
	exercised(t, "creates", compared, refused, "left unlabelled", plainUnlabelled, plainCreates)
}

// exercised: the compared requests include refused and admitted ones, and
// at least nine in ten of the corpora's plain creates are spared (left out
// by a match condition, or unlabelled).
func exercised(t *testing.T, what string, compared, refused int, spared string, plainSpared, plainCreates int) {
	t.Helper()
	t.Logf("%d %s compared, %d refused; %d of %d plain creates of the corpora %s", compared, what, refused, plainSpared, plainCreates, spared)
	assert.True(t, refused > 0 && refused < compared, "the %s do not exercise the refusals: %d refused of %d", what, refused, compared)
	assert.GreaterOrEqual(t, plainSpared*10, plainCreates*9, "only %d of %d plain creates of the corpora are %s", plainSpared, plainCreates, spared)
}

// The guard evaluates the refusals with the warnings and bounds in one run,
// which joins the refusals by their match condition: on every request of the
// corpora and of varied Deployments it must answer as the three policies
// one by one, in the same order and words.
func TestTheRefusalsJoinTheAdviceByTheirMatchCondition(t *testing.T) {
	rules, err := native.Load()
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(25, 3))
	_, bases := corpusAndVaried(t, rng, 400)
	settings := []native.Settings{{GuardUsername: "system:serviceaccount:deployguard-system:deployguard",
		BreakGlassGroups: []string{"platform-admins"}, ExemptNamespaces: []string{"legacy"}, ExemptUsernames: []string{"ci-bot"},
		StableLabelKeys: []string{"app"}, RevisionHistoryMin: 2, RevisionHistoryMax: 20, ProgressDeadlineMin: 60, ProgressDeadlineMax: 900}, {}}
	users := []user.Info{&user.DefaultInfo{Name: "alice"}, &user.DefaultInfo{Name: "ci-bot"},
		&user.DefaultInfo{Name: settings[0].GuardUsername}, &user.DefaultInfo{Name: "system:serviceaccount:kube-system:namespace-controller"}}
	ctx := context.Background()
	compared, found := 0, 0
	for i, d := range bases {
		for _, req := range requests(rng, d) {
			req.Namespace, req.Name = "shop", fmt.Sprintf("d-%d", i)
			if rng.IntN(8) == 0 {
				req.Namespace = "legacy"
			}
			req.User = users[rng.IntN(len(users))]
			p := settings[rng.IntN(len(settings))].Params()
			got := rules.Evaluate(ctx, req, p, native.Refusals, native.Warnings, native.Bounds)
			var want []native.Finding
			for _, name := range []string{native.Refusals, native.Warnings, native.Bounds} {
				want = append(want, rules.Evaluate(ctx, req, p, name)...)
			}
			if !slices.Equal(got, want) {
				assert.Fail(t, "together and one by one differ", "%s %s by %s: together %+v, one by one %+v", req.Operation, req.Name, req.User.GetName(), got, want)
			}
			compared++
			found += len(want)
		}
	}
	t.Logf("%d requests compared, %d findings", compared, found)
	assert.NotZero(t, found, "no findings: the requests do not exercise the policies")
}

// refusalsAsInstalled is deployguard-refusals as config/native has it.
func refusalsAsInstalled(rules *native.Rules) *admissionregistrationv1.ValidatingAdmissionPolicy {
	for _, p := range rules.Policies {
		if p.Name == native.Refusals {
			return p
		}
	}
	return nil
}

// corpusAndVaried are the corpora's Deployments, and those followed by n
// varied ones.
func corpusAndVaried(t *testing.T, rng *rand.Rand, n int) (corpus, all []*appsv1.Deployment) {
	t.Helper()
	corpus, err := harness.CorpusDeployments()
	require.NoError(t, err)
	all = slices.Clone(corpus)
	for i := range n {
		all = append(all, varied(rng, i))
	}
	return corpus, all
}

// plain: d carries nothing the refusals read but its strategy.
func plain(d *appsv1.Deployment) bool {
	_, cleanup := d.Annotations[vocab.AnnotationCleanup]
	return d.Finalizers == nil && !cleanup
}

// requests are the writes of d the refusals tell apart: its create, updates
// that change it (or not) from a varied stored object, one while it is being
// deleted, its deletion, and the owners it has added to it (or rewritten
// around their uids).
func requests(rng *rand.Rand, d *appsv1.Deployment) []native.Request {
	d = d.DeepCopy()
	old := d.DeepCopy()
	switch rng.IntN(3) {
	case 0:
		old = varied(rng, 0)
	case 1:
		old.Spec.Replicas = ptr(int32(rng.IntN(4)))
	}
	deleting := old.DeepCopy()
	deleting.DeletionTimestamp = &deletedAt
	deleting.Finalizers = append(deleting.Finalizers, vocab.FinalizerRecord, vocab.FinalizerDrain)
	removed := deleting.DeepCopy()
	removed.DeletionTimestamp = &deletedAt
	removed.Finalizers = removed.Finalizers[:len(removed.Finalizers)-rng.IntN(3)]
	reqs := []native.Request{
		{Operation: admission.Create, Object: d},
		{Operation: admission.Update, Object: d, OldObject: old},
		{Operation: admission.Update, Object: d, OldObject: d.DeepCopy()},
		{Operation: admission.Update, Object: removed, OldObject: deleting},
		{Operation: admission.Delete, OldObject: d},
	}
	if len(d.OwnerReferences) > 0 {
		// The owners added to the same Deployment.
		unowned := d.DeepCopy()
		unowned.OwnerReferences = nil
		reqs = append(reqs, native.Request{Operation: admission.Update, Object: d, OldObject: unowned})
		// An owner rewritten around its uid: the same uid, and another
		// name, kind or apiVersion than the stored one.
		rewritten := d.DeepCopy()
		r := &rewritten.OwnerReferences[rng.IntN(len(rewritten.OwnerReferences))]
		switch rng.IntN(3) {
		case 0:
			r.Name += "-was"
		case 1:
			r.Kind = "Secret"
		default:
			r.APIVersion = "example.com/v1"
		}
		reqs = append(reqs, native.Request{Operation: admission.Update, Object: d, OldObject: rewritten})
	}
	return reqs
}

// varied is a Deployment with what the refusals read drawn at random:
// replicas, strategy, finalizers, the cleanup, protection and selector
// marks, the deprecated rollback annotation, owners.
func varied(rng *rand.Rand, i int) *appsv1.Deployment {
	pick := func(xs ...string) string { return xs[rng.IntN(len(xs))] }
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("v-%d", i)}}
	if rng.IntN(5) > 0 {
		d.Spec.Replicas = ptr(int32(rng.IntN(6)))
	}
	ios := func() *intstr.IntOrString {
		if rng.IntN(6) == 0 {
			return nil
		}
		x := intstr.Parse(pick("0", "1", "2", "3", "5", "0%", "10%", "25%", "50%", "99%", "100%", "0100%", "250%",
			"000000050%", "123456789%", "x", "1000", "abcd"))
		return &x
	}
	switch rng.IntN(5) {
	case 0:
		d.Spec.Strategy = appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType}
	case 1:
	default:
		d.Spec.Strategy = appsv1.DeploymentStrategy{Type: appsv1.DeploymentStrategyType(pick("RollingUpdate", "", "Recreate")),
			RollingUpdate: &appsv1.RollingUpdateDeployment{MaxSurge: ios(), MaxUnavailable: ios()}}
	}
	if rng.IntN(3) == 0 {
		d.Finalizers = []string{pick(vocab.FinalizerRecord, vocab.FinalizerDrain, "deployguard.io/backup",
			"deployguard.io/floor-probe", "deployguard.io/", "example.com/keep")}
	}
	a := map[string]string{}
	if rng.IntN(3) == 0 {
		a[vocab.AnnotationCleanup] = pick("record", "drain,record", "none", "none,drain", "backup", " Record ", "")
	}
	if rng.IntN(4) == 0 {
		a[vocab.AnnotationProtected] = pick("true", "false", "")
	}
	if rng.IntN(8) == 0 {
		a[appsv1.DeprecatedRollbackTo] = pick("0", "1", "3")
	}
	if len(a) > 0 {
		d.Annotations = a
	}
	if rng.IntN(4) == 0 {
		// Owners drawn from a small set, so that an update keeps, adds or
		// removes one.
		for _, uid := range []string{"u1", "u2"}[:1+rng.IntN(2)] {
			if rng.IntN(2) == 0 {
				d.OwnerReferences = append(d.OwnerReferences, metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: "owner-" + uid, UID: types.UID(uid)})
			}
		}
	}
	labels := map[string]string{"app": "web"}
	if rng.IntN(6) == 0 {
		labels["deployguard.io/empty-selector"] = pick("refused", "repaired", "")
	}
	d.Spec.Selector = &metav1.LabelSelector{MatchLabels: labels}
	if rng.IntN(5) == 0 {
		sized(rng, d)
	}
	return d
}

// sized gives d one of the lists the refusals bound (the guard keeps them in
// memory) at a size around its bound, some of its entries the guard's own,
// which do not count.
func sized(rng *rand.Rand, d *appsv1.Deployment) {
	n := func(bound int) int { return bound - 2 + rng.IntN(5) }
	own := rng.IntN(2) == 0
	labels := func(bound int) map[string]string {
		m := map[string]string{}
		for i := range n(bound) {
			m[fmt.Sprintf("example.com/l-%d", i)] = "v"
		}
		if own {
			m[native.LabelDefaulting], m[native.LabelRefusals] = "pending", "pending"
		}
		return m
	}
	switch rng.IntN(5) {
	case 0:
		d.Labels = labels(64)
	case 1:
		d.Spec.Template.Labels = labels(64)
	case 2:
		// Match labels, expressions and their values: 1 + 2 + (n - 3).
		values := make([]string, n(64)-3)
		for i := range values {
			values[i] = fmt.Sprintf("v-%d", i)
		}
		d.Spec.Selector.MatchExpressions = []metav1.LabelSelectorRequirement{
			{Key: "tier", Operator: metav1.LabelSelectorOpNotIn, Values: values},
			{Key: "canary", Operator: metav1.LabelSelectorOpDoesNotExist}}
	case 3:
		for i := range n(16) {
			d.Finalizers = append(d.Finalizers, fmt.Sprintf("example.com/f-%d", i))
		}
		if own {
			d.Finalizers = append(d.Finalizers, vocab.FinalizerRecord)
		}
	default:
		for i := range n(16) {
			d.OwnerReferences = append(d.OwnerReferences, metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap",
				Name: fmt.Sprintf("o-%d", i), UID: types.UID(fmt.Sprintf("o-%d", i))})
		}
	}
}

var deletedAt = metav1.NewTime(time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC))

func ptr[T any](v T) *T { return &v }

// A create so large that deployguard-selector's condition, evaluated in
// full, would pass the API server's cost limit per expression (and, the
// policy failing open, leave the create unlabelled for the refusals'
// binding) is labelled by the size clauses first.
func TestTheSelectorPolicyLabelsCreatesTooLargeToEvaluate(t *testing.T) {
	rules, err := native.Load()
	require.NoError(t, err)
	ctx := context.Background()
	huge := map[string]func(*appsv1.Deployment){
		"70,000 selector terms": func(d *appsv1.Deployment) {
			for i := range 70_000 {
				d.Spec.Selector.MatchExpressions = append(d.Spec.Selector.MatchExpressions,
					metav1.LabelSelectorRequirement{Key: fmt.Sprintf("k%d", i), Operator: metav1.LabelSelectorOpDoesNotExist})
			}
		},
		"200,000 finalizers": func(d *appsv1.Deployment) {
			for i := range 200_000 {
				d.Finalizers = append(d.Finalizers, fmt.Sprintf("a/%d", i))
			}
		},
	}
	for name, grow := range huge {
		d := varied(rand.New(rand.NewPCG(1, 1)), 0)
		d.Finalizers, d.Annotations = nil, nil
		grow(d)
		req := native.Request{Operation: admission.Create, Object: d, Namespace: "shop", Name: "huge",
			User: &user.DefaultInfo{Name: "alice"}, Params: native.Settings{}.ConfigMap("deployguard-system")}
		mutated, err := rules.Mutate(ctx, req, native.Settings{}.Params(), native.Selector)
		require.NoError(t, err, name)
		assert.Equal(t, native.DefaultingPending, mutated.Labels[native.LabelRefusals], "%s: labelled for the refusals", name)
	}
}
