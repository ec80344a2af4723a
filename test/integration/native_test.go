package integration

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/authentication/user"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/test/harness"
	"github.com/deployguard/deployguard/webhook/native"
	"github.com/deployguard/deployguard/webhook/review"
)

// fuzzCount is how many generated Deployments the differential test adds to
// the corpora.
const fuzzCount = 400

// The API server and the guard's in-process evaluator (check, the audit)
// give the same verdict in the same words for the native policies, on every
// Deployment of the parity corpus, the charts and upstream corpora, and a
// seeded run of generated ones: the API server refuses with a message the
// guard's evaluation gives, or neither refuses; and what it admits carries
// the warnings policy's warnings (the webhook's).
func TestNativePoliciesAgreeWithTheAPIServer(t *testing.T) {
	ctx := context.Background()
	inputs, err := harness.CorpusDeployments()
	require.NoError(t, err)
	corpora := len(inputs)
	rng := rand.New(rand.NewPCG(25, 2026))
	for i := range fuzzCount {
		inputs = append(inputs, generated(rng, i))
	}
	rules, err := native.Load()
	require.NoError(t, err)
	opts := guardConfig().WebhookOptions(guardUser)
	params := opts.NativeSettings().Params()
	ns := harness.NewNamespace(t, k8s, kept)
	c, warnings := clientAsGroups(t, "native-diff-user", "system:masters")
	compared, refused, warned, skipped := 0, 0, 0, 0
	for i, d := range inputs {
		d = d.DeepCopy()
		d.Namespace = ns
		if i >= corpora || d.Name == "" {
			d.Name = fmt.Sprintf("gen-%d", i)
		}
		// The object the policies see: after the API server's defaults and
		// the guard's mutating webhook, as check computes it.
		s := d.DeepCopy()
		review.APIServerDefaults(s)
		if _, errs := review.Default(s, nil, opts, false); len(errs) > 0 {
			skipped++ // a selector that cannot be repaired: refused before any policy
			continue
		}
		req := native.Request{Operation: admission.Create, Object: s, Namespace: ns, Name: d.Name,
			User: &user.DefaultInfo{Name: "native-diff-user", Groups: []string{"system:masters", "system:authenticated"}}}
		var ownRefusals, ownWarnings []string
		for _, f := range rules.Evaluate(ctx, req, params, native.Refusals, native.Warnings) {
			require.False(t, f.Error, "%s: %s", d.Name, f.Message)
			if f.Policy == native.Refusals {
				ownRefusals = append(ownRefusals, f.Line())
			} else {
				ownWarnings = append(ownWarnings, f.Line())
			}
		}
		before := len(warnings.all())
		err := c.Create(ctx, d.DeepCopy(), client.DryRunAll)
		apiRefusal := ""
		if err != nil {
			msg := err.Error()
			i := strings.Index(msg, "ValidatingAdmissionPolicy 'deployguard-")
			if i < 0 {
				// Refused before the policies (the API server's validation)
				// or after them (the webhook, which the API server calls only
				// once every policy has admitted it).
				if strings.Contains(msg, "admission webhook") {
					assert.Empty(t, ownRefusals, "%s: the guard's evaluation refuses what the API server's policies admit", d.Name)
				}
				skipped++
				continue
			}
			apiRefusal = nativeLine.ReplaceAllString(msg[i:], "")
		}
		compared++
		if apiRefusal != "" {
			refused++
			assert.Contains(t, ownRefusals, apiRefusal, "%s: the API server refuses, the guard's evaluation does not say so", d.Name)
		} else {
			assert.Empty(t, ownRefusals, "%s: the guard's evaluation refuses what the API server admits", d.Name)
			// The warnings policy is the webhook's: what the API server
			// relays includes it, word for word.
			assert.Subset(t, warnings.all()[before:], ownWarnings, "%s: the warnings differ", d.Name)
		}
		if len(ownWarnings) > 0 {
			warned++
		}
	}
	t.Logf("%d Deployments compared (of %d from the corpora and %d generated; %d refused elsewhere: the API server's validation, an unrepairable selector, the webhook), %d refused by a native policy, %d warned",
		compared, corpora, fuzzCount, skipped, refused, warned)
	assert.Greater(t, refused, 20, "the generated Deployments exercise the refusals")
	assert.Greater(t, warned, 20, "and the warnings")
}

// generated is a Deployment whose strategy, replicas, deadline, finalizers
// and cleanup annotation are drawn from the values the rules turn on.
func generated(rng *rand.Rand, i int) *appsv1.Deployment {
	d := harness.Deployment("", fmt.Sprintf("gen-%d", i), appImage)
	pick := func(xs ...string) string { return xs[rng.IntN(len(xs))] }
	d.Spec.Replicas = ptr(int32(rng.IntN(6)))
	if rng.IntN(5) == 0 {
		d.Spec.Replicas = nil
	}
	ios := func() *intstr.IntOrString {
		v := pick("0", "1", "2", "3", "5", "0%", "10%", "25%", "50%", "99%", "100%")
		x := intstr.Parse(v)
		return &x
	}
	switch rng.IntN(4) {
	case 0:
		d.Spec.Strategy = appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType}
	default:
		d.Spec.Strategy = appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType,
			RollingUpdate: &appsv1.RollingUpdateDeployment{MaxSurge: ios(), MaxUnavailable: ios()}}
	}
	deadlines := []int32{5, 30, 60, 600, 10000, math.MaxInt32}
	d.Spec.ProgressDeadlineSeconds = &deadlines[rng.IntN(len(deadlines))]
	d.Spec.MinReadySeconds = int32(rng.IntN(3) * 10)
	if rng.IntN(3) == 0 {
		d.Finalizers = []string{pick(vocab.FinalizerRecord, vocab.FinalizerDrain, "deployguard.io/backup", "example.com/keep")}
	}
	if rng.IntN(3) == 0 {
		d.Annotations = map[string]string{vocab.AnnotationCleanup: pick("record", "drain,record", "none", "none,drain", "backup", " Record ", "")}
	}
	if rng.IntN(6) == 0 {
		oversized(rng, d)
	}
	return d
}

// oversized gives d one of the lists deployguard-refusals bounds at a size
// around its bound: labels on d or on its template (64), selector terms (64),
// finalizers or owner references (16).
func oversized(rng *rand.Rand, d *appsv1.Deployment) {
	n := func(bound int) int { return bound - 2 + rng.IntN(5) }
	switch rng.IntN(5) {
	case 0:
		d.Labels = map[string]string{}
		for i := range n(64) {
			d.Labels[fmt.Sprintf("team.example.com/l-%d", i)] = "v"
		}
	case 1:
		for i := range n(64) - len(d.Spec.Template.Labels) {
			d.Spec.Template.Labels[fmt.Sprintf("team.example.com/l-%d", i)] = "v"
		}
	case 2:
		values := make([]string, n(64)-len(d.Spec.Selector.MatchLabels)-1)
		for i := range values {
			values[i] = fmt.Sprintf("v-%d", i)
		}
		d.Spec.Selector.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: "tier", Operator: metav1.LabelSelectorOpNotIn, Values: values}}
	case 3:
		d.Finalizers = nil
		for i := range n(16) {
			d.Finalizers = append(d.Finalizers, fmt.Sprintf("team.example.com/f-%d", i))
		}
	default:
		for i := range n(16) {
			d.OwnerReferences = append(d.OwnerReferences, metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap",
				Name: fmt.Sprintf("o-%d", i), UID: types.UID(fmt.Sprintf("6b1a3c9e-0000-4000-8000-%012d", i))})
		}
	}
}
