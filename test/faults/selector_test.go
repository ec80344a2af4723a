package faults

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/authentication/user"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nativeconfig "github.com/deployguard/deployguard/config/native"
	"github.com/deployguard/deployguard/test/harness"
	"github.com/deployguard/deployguard/webhook/native"
)

// stableLabelKeys are the default config's (selector.stableLabelKeys).
var stableLabelKeys = []string{"app.kubernetes.io/name", "app.kubernetes.io/instance", "app"}

// selectorGenerated is how many generated label sets selectorRepairsAgree
// adds to the corpora.
const selectorGenerated = 200

// selectorRepairsAgree asserts that, with every guard replica down, the API
// server repairs or refuses an empty selector exactly as the guard's
// in-process evaluation of deployguard-selector and deployguard-refusals
// says (check, and the webhook where the API server has not): the same
// selector, labels and marker, or the same refusal. The inputs are the
// Deployments of the integration tier's corpora (parity, charts, upstream)
// with their selector removed, and a seeded run of generated template
// labels, dry-run created in ns.
func selectorRepairsAgree(ctx context.Context, t *testing.T, c client.Client, ns string) {
	t.Helper()
	cm := &corev1.ConfigMap{}
	require.NoError(t, c.Get(ctx, client.ObjectKey{Namespace: harness.GuardNamespace, Name: nativeconfig.ParamsName}, cm))
	require.Equal(t, strings.Join(stableLabelKeys, ","), cm.Data["stableLabelKeys"], "the guard wrote its config's keys into the params")
	params := native.Settings{StableLabelKeys: stableLabelKeys}.Params()
	rules, err := native.Load()
	require.NoError(t, err)

	inputs, err := harness.CorpusDeployments()
	require.NoError(t, err)
	corpora := len(inputs)
	require.Greater(t, corpora, 100, "the corpora are there")
	rng := rand.New(rand.NewPCG(25, 1124))
	for range selectorGenerated {
		inputs = append(inputs, withLabels(generatedLabels(rng)))
	}

	// Each dry run waits for the webhooks the API server cannot reach:
	// several at once.
	var repaired, refused, elsewhere atomic.Int32
	someone := &user.DefaultInfo{Name: "kubernetes-admin", Groups: []string{"system:masters", "system:authenticated"}}
	var g errgroup.Group
	g.SetLimit(8)
	for i, d := range inputs {
		d = d.DeepCopy()
		d.Namespace, d.Name, d.GenerateName, d.ResourceVersion = ns, fmt.Sprintf("selector-%d", i), "", ""
		d.Spec.Selector = nil
		g.Go(func() error {
			switch compareSelectorRepair(ctx, t, c, rules, params, someone, d) {
			case "repaired":
				repaired.Add(1)
			case "refused":
				refused.Add(1)
			case "elsewhere":
				elsewhere.Add(1)
			}
			return nil
		})
	}
	require.NoError(t, g.Wait())
	t.Logf("empty selectors: %d compared (%d from the corpora, %d generated): %d repaired alike, %d refused alike, %d refused for something else",
		len(inputs), corpora, selectorGenerated, repaired.Load(), refused.Load(), elsewhere.Load())
	assert.Positive(t, repaired.Load())
	assert.Positive(t, refused.Load())
}

// compareSelectorRepair dry-run creates d, whose selector is empty, and
// compares the API server's answer with the in-process one; it says which
// it was. Only assert: it runs off the test's goroutine.
func compareSelectorRepair(ctx context.Context, t *testing.T, c client.Client, rules *native.Rules, params *native.Params, u user.Info, d *appsv1.Deployment) string {
	req := native.Request{Operation: admission.Create, Object: d, Namespace: d.Namespace, Name: d.Name, User: u}
	want, err := rules.Mutate(ctx, req, params, native.Selector)
	if !assert.NoError(t, err, "%s: evaluating deployguard-selector", d.Name) || !assert.NotSame(t, d, want, "%s: an empty selector is always the policy's", d.Name) {
		return ""
	}
	got := d.DeepCopy()
	err = c.Create(ctx, got, client.DryRunAll)
	if want.Spec.Selector.MatchLabels[native.LabelEmptySelector] == native.EmptySelectorRefused {
		req.Object = want
		var msg string
		for _, f := range rules.Evaluate(ctx, req, params, native.Refusals) {
			if f.Field == "spec.selector" {
				msg = f.Line()
			}
		}
		assert.NotEmpty(t, msg, "%s: marked, and refused in process", d.Name)
		if assert.Error(t, err, "%s: refused by the API server", d.Name) {
			assert.Contains(t, err.Error(), "ValidatingAdmissionPolicy '"+native.Refusals+"'", d.Name)
			assert.Contains(t, err.Error(), msg, d.Name)
		}
		return "refused"
	}
	if err != nil {
		// Refused for the rest of the object (the API server's validation,
		// another of the guard's refusals), never for the selector the
		// policy set.
		assert.NotContains(t, err.Error(), "spec.selector", "%s: the repaired selector refused", d.Name)
		return "elsewhere"
	}
	assert.Equal(t, want.Spec.Selector, got.Spec.Selector, d.Name)
	assert.Equal(t, want.Spec.Template.Labels, got.Spec.Template.Labels, d.Name)
	assert.Equal(t, want.Labels, got.Labels, "%s: labelled for the guard's webhook, which is down", d.Name)
	assert.Equal(t, "true", got.Annotations[native.AnnotationSelectorRepaired], d.Name)
	return "repaired"
}

// generatedLabels draws template labels from keys the repair reads and keys
// it must not, with empty values among them; nil (no labels at all) too.
func generatedLabels(rng *rand.Rand) map[string]string {
	keys := append([]string{"version", "app.kubernetes.io/version", "tier", "example.com/app", "pod-template-hash"}, stableLabelKeys...)
	values := []string{"", "web", "v1", "a.b-c_d", "0"}
	n := rng.IntN(5)
	if n == 0 {
		return nil
	}
	out := map[string]string{}
	for range n {
		out[keys[rng.IntN(len(keys))]] = values[rng.IntN(len(values))]
	}
	return out
}

func withLabels(labels map[string]string) *appsv1.Deployment {
	d := harness.Deployment("shop", "generated", "app:1", harness.ProgressDeadline(deadline))
	d.Spec.Template.Labels = labels
	return d
}
