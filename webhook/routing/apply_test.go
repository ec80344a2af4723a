package routing

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/deployguard/deployguard/test/harness"
)

// shippedValidating is the validating webhook configuration as shipped.
func shippedValidating(t *testing.T) *admissionregistrationv1.ValidatingWebhookConfiguration {
	t.Helper()
	_, vwc, err := harness.WebhookConfigurations()
	require.NoError(t, err)
	return vwc
}

// routed is what Route left in the configuration: the enforce entry's
// operations and each entry's routing condition ("" none).
type routed struct {
	ops                     []admissionregistrationv1.OperationType
	selector                *metav1.LabelSelector // nil: every object
	decide, advise, creates string
}

func readRouting(t *testing.T, c client.Client, advised string) routed {
	t.Helper()
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	require.NoError(t, c.Get(context.Background(), client.ObjectKey{Name: "deployguard-validating"}, vwc))
	var r routed
	cond := func(w admissionregistrationv1.ValidatingWebhook, name string) string {
		for _, mc := range w.MatchConditions {
			if mc.Name == name {
				return mc.Expression
			}
		}
		return ""
	}
	for _, w := range vwc.Webhooks {
		switch w.Name {
		case EnforceWebhook:
			r.ops, r.decide = w.Rules[0].Operations, cond(w, MustDecideCondition)
			if s := w.ObjectSelector; s != nil && (len(s.MatchLabels) > 0 || len(s.MatchExpressions) > 0) {
				r.selector = s
			}
		case advised:
			r.advise = cond(w, MayAdviseCondition)
		case CreateWebhook:
			r.creates = cond(w, MayAdviseCondition)
		}
	}
	return r
}

func TestRouteWritesOperationsAndConditions(t *testing.T) {
	ctx := context.Background()
	scheme := runtime.NewScheme()
	require.NoError(t, admissionregistrationv1.AddToScheme(scheme))
	def := Enforced{Quarantine: true}
	enforcing := Enforced{Quarantine: true, Policies: true}
	deleting := Enforced{Quarantine: true, Policies: true, PoliciesOnDelete: true}
	ops := func(o ...admissionregistrationv1.OperationType) []admissionregistrationv1.OperationType { return o }
	const (
		create = admissionregistrationv1.Create
		update = admissionregistrationv1.Update
		del    = admissionregistrationv1.Delete
	)

	t.Run("this release's layout", func(t *testing.T) {
		c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(shippedValidating(t)).Build()
		wrote, err := Route(ctx, c, "deployguard-validating", def)
		require.NoError(t, err)
		assert.True(t, wrote, "the shipped operations and conditions are the default configuration's, the selector is the leader's to add")
		assert.Equal(t, routed{ops: ops(update), selector: EnforceObjectSelector(def), decide: MustDecide(def), advise: MayAdvise(def)},
			readRouting(t, c, UpdateWebhook))
		wrote, err = Route(ctx, c, "deployguard-validating", def)
		require.NoError(t, err)
		assert.False(t, wrote, "once routed, nothing to write")

		wrote, err = Route(ctx, c, "deployguard-validating", enforcing)
		require.NoError(t, err)
		assert.True(t, wrote)
		assert.Equal(t, routed{ops: ops(create, update), selector: nil, decide: MustDecide(enforcing), advise: MayAdvise(enforcing), creates: "!(" + MustDecide(enforcing) + ")"},
			readRouting(t, c, UpdateWebhook), "an enforced policy takes the creates it may refuse")

		wrote, err = Route(ctx, c, "deployguard-validating", deleting)
		require.NoError(t, err)
		assert.True(t, wrote)
		assert.Equal(t, routed{ops: ops(create, update, del), selector: nil, decide: MustDecide(deleting), advise: MayAdvise(deleting), creates: "!(" + MustDecide(deleting) + ")"},
			readRouting(t, c, UpdateWebhook), "an enforced policy that judges deletions takes the DELETEs too")

		wrote, err = Route(ctx, c, "deployguard-validating", Enforced{})
		require.NoError(t, err)
		assert.True(t, wrote)
		assert.Equal(t, routed{ops: ops(del), decide: "false", advise: MayAdvise(Enforced{})}, readRouting(t, c, UpdateWebhook),
			"nothing enforced: the create entry's condition is removed")

		wrote, err = Route(ctx, c, "deployguard-validating", Enforced{Refusals: true})
		require.NoError(t, err)
		assert.True(t, wrote)
		assert.Equal(t, routed{ops: ops(create, update, del), decide: "true", advise: "!(true)", creates: "!(true)"},
			readRouting(t, c, UpdateWebhook), "native refusals not enforced: every request to the enforce entry")

		_, err = Route(ctx, c, "deployguard-validating", def)
		require.NoError(t, err)
		vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{}
		require.NoError(t, c.Get(ctx, client.ObjectKey{Name: "deployguard-validating"}, vwc))
		shipped := shippedValidating(t)
		for i := range shipped.Webhooks {
			assert.Equal(t, shipped.Webhooks[i].Rules, vwc.Webhooks[i].Rules, shipped.Webhooks[i].Name)
			assert.Equal(t, shipped.Webhooks[i].MatchConditions, vwc.Webhooks[i].MatchConditions, shipped.Webhooks[i].Name)
		}
		assert.Equal(t, EnforceObjectSelector(def), vwc.Webhooks[0].ObjectSelector)
	})

	t.Run("the previous release's layout: no selector", func(t *testing.T) {
		vwc := shippedValidating(t)
		for i := range vwc.Webhooks {
			if vwc.Webhooks[i].Name == UpdateWebhook {
				vwc.Webhooks[i].Name = PreviousUpdateWebhook
				setCondition(&vwc.Webhooks[i], MayAdviseCondition, mayAdvise(def, false))
			}
		}
		c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(vwc).Build()
		wrote, err := Route(ctx, c, "deployguard-validating", def)
		require.NoError(t, err)
		assert.False(t, wrote, "as that release routed the default configuration")

		// With this release's selector left on it (manifests taken back
		// by a tool that kept it): removed, since that layout's update
		// entry does not take what the selector leaves out.
		stale := &admissionregistrationv1.ValidatingWebhookConfiguration{}
		require.NoError(t, c.Get(ctx, client.ObjectKey{Name: "deployguard-validating"}, stale))
		stale.Webhooks[0].ObjectSelector = EnforceObjectSelector(def)
		require.NoError(t, c.Update(ctx, stale))
		wrote, err = Route(ctx, c, "deployguard-validating", def)
		require.NoError(t, err)
		assert.True(t, wrote)
		assert.Equal(t, routed{ops: ops(update), decide: MustDecide(def), advise: mayAdvise(def, false)}, readRouting(t, c, PreviousUpdateWebhook),
			"the selector removed")
		wrote, err = Route(ctx, c, "deployguard-validating", enforcing)
		require.NoError(t, err)
		assert.True(t, wrote)
		assert.Equal(t, routed{ops: ops(create, update), decide: MustDecide(enforcing), advise: MayAdvise(enforcing), creates: "!(" + MustDecide(enforcing) + ")"},
			readRouting(t, c, PreviousUpdateWebhook))
		_, err = Route(ctx, c, "deployguard-validating", def)
		require.NoError(t, err)
		assert.Equal(t, routed{ops: ops(update), decide: MustDecide(def), advise: mayAdvise(def, false)}, readRouting(t, c, PreviousUpdateWebhook),
			"the default configuration without the selector")
	})

	t.Run("the layout before: conditions only", func(t *testing.T) {
		vwc := shippedValidating(t)
		var hooks []admissionregistrationv1.ValidatingWebhook
		for _, w := range vwc.Webhooks {
			switch w.Name {
			case EnforceWebhook:
				// As this release left it, before a partial downgrade.
				w.Rules[0].Operations = ops(update)
			case CreateWebhook:
				continue
			case UpdateWebhook:
				w.Name = ValidateWebhook
				w.Rules[0].Operations = ops(create, update)
			}
			if w.Name == EnforceWebhook {
				w.ObjectSelector = EnforceObjectSelector(def)
			}
			hooks = append(hooks, w)
		}
		vwc.Webhooks = hooks
		c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(vwc).Build()
		wrote, err := Route(ctx, c, "deployguard-validating", enforcing)
		require.NoError(t, err)
		assert.True(t, wrote)
		assert.Equal(t, routed{ops: ops(create, update, del), decide: MustDecide(enforcing), advise: MayAdvise(enforcing)},
			readRouting(t, c, ValidateWebhook), "the enforce entry takes every operation again, of every Deployment")
		_, err = Route(ctx, c, "deployguard-validating", def)
		require.NoError(t, err)
		assert.Equal(t, routed{ops: ops(create, update, del), decide: MustDecide(def), advise: mayAdvise(def, false)},
			readRouting(t, c, ValidateWebhook), "every Deployment, whatever its labels: the validate entry does not take what a selector would leave out")
	})

	t.Run("two layouts at once", func(t *testing.T) {
		for _, tc := range []struct {
			name   string
			add    []string
			remove string
		}{
			{"this release's and the previous one's", []string{PreviousUpdateWebhook}, PreviousUpdateWebhook},
			{"this release's and the one before", []string{ValidateWebhook}, ValidateWebhook},
			{"all three", []string{PreviousUpdateWebhook, ValidateWebhook}, PreviousUpdateWebhook + " and " + ValidateWebhook},
		} {
			t.Run(tc.name, func(t *testing.T) {
				vwc := shippedValidating(t)
				for _, n := range tc.add {
					w := vwc.Webhooks[1].DeepCopy()
					w.Name = n
					vwc.Webhooks = append(vwc.Webhooks, *w)
				}
				c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(vwc).Build()
				_, err := Route(ctx, c, "deployguard-validating", enforcing)
				require.ErrorIs(t, err, ErrNotSplit)
				assert.Contains(t, err.Error(), "it has "+tc.remove+" of an earlier layout")
			})
		}
		t.Run("the previous one's and the one before", func(t *testing.T) {
			vwc := shippedValidating(t)
			for i := range vwc.Webhooks {
				if vwc.Webhooks[i].Name == UpdateWebhook {
					vwc.Webhooks[i].Name = PreviousUpdateWebhook
				}
			}
			w := vwc.Webhooks[1].DeepCopy()
			w.Name = ValidateWebhook
			vwc.Webhooks = append(vwc.Webhooks, *w)
			c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(vwc).Build()
			_, err := Route(ctx, c, "deployguard-validating", enforcing)
			require.ErrorIs(t, err, ErrNotSplit)
			assert.Contains(t, err.Error(), "it has "+ValidateWebhook+" of an earlier layout")
		})
		vwc := shippedValidating(t)
		validate := vwc.Webhooks[1].DeepCopy()
		validate.Name = ValidateWebhook
		vwc.Webhooks = append(vwc.Webhooks, *validate)
		c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(vwc).Build()
		_, err := Route(ctx, c, "deployguard-validating", enforcing)
		require.ErrorIs(t, err, ErrNotSplit)
		assert.Contains(t, err.Error(), "remove them")
		assert.Equal(t, routed{ops: ops(update), decide: MustDecide(def), advise: MayAdvise(def)}, readRouting(t, c, UpdateWebhook), "left as it is")
	})

	t.Run("neither layout", func(t *testing.T) {
		vwc := shippedValidating(t)
		vwc.Webhooks = vwc.Webhooks[:1] // enforce alone
		c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(vwc).Build()
		_, err := Route(ctx, c, "deployguard-validating", enforcing)
		require.ErrorIs(t, err, ErrNotSplit)
		assert.Equal(t, routed{ops: ops(update), decide: MustDecide(def)}, readRouting(t, c, UpdateWebhook), "left as it is")
	})
}

// shippedMutating is the mutating webhook configuration as shipped.
func shippedMutating(t *testing.T) *admissionregistrationv1.MutatingWebhookConfiguration {
	t.Helper()
	mwc, _, err := harness.WebhookConfigurations()
	require.NoError(t, err)
	return mwc
}

func TestRouteMutatingWritesTheDefaultEntrysOperations(t *testing.T) {
	ctx := context.Background()
	scheme := runtime.NewScheme()
	require.NoError(t, admissionregistrationv1.AddToScheme(scheme))
	ops := func(c client.Client) map[string][]admissionregistrationv1.OperationType {
		mwc := &admissionregistrationv1.MutatingWebhookConfiguration{}
		require.NoError(t, c.Get(ctx, client.ObjectKey{Name: "deployguard-mutating"}, mwc))
		out := map[string][]admissionregistrationv1.OperationType{}
		for _, w := range mwc.Webhooks {
			out[w.Name] = w.Rules[0].Operations
		}
		return out
	}
	const (
		create = admissionregistrationv1.Create
		update = admissionregistrationv1.Update
	)

	t.Run("this release's layout", func(t *testing.T) {
		shipped := shippedMutating(t)
		c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(shipped).Build()
		wrote, err := RouteMutating(ctx, c, "deployguard-mutating", true)
		require.NoError(t, err)
		assert.False(t, wrote, "shipped for creates labelled by deployguard-selector")

		wrote, err = RouteMutating(ctx, c, "deployguard-mutating", false)
		require.NoError(t, err)
		assert.True(t, wrote)
		got := ops(c)
		assert.Equal(t, []admissionregistrationv1.OperationType{create, update}, got[DefaultWebhook], "every create the guard may change, by its condition")
		assert.Equal(t, []admissionregistrationv1.OperationType{create}, got[DefaultCreateWebhook], "the other entry is left as it is")

		wrote, err = RouteMutating(ctx, c, "deployguard-mutating", true)
		require.NoError(t, err)
		assert.True(t, wrote)
		mwc := &admissionregistrationv1.MutatingWebhookConfiguration{}
		require.NoError(t, c.Get(ctx, client.ObjectKey{Name: "deployguard-mutating"}, mwc))
		for i := range shipped.Webhooks {
			assert.Equal(t, shipped.Webhooks[i].Rules, mwc.Webhooks[i].Rules, shipped.Webhooks[i].Name)
		}
	})

	t.Run("the previous layout is left as it is", func(t *testing.T) {
		mwc := shippedMutating(t)
		var hooks []admissionregistrationv1.MutatingWebhook
		for _, w := range mwc.Webhooks {
			if w.Name == DefaultCreateWebhook {
				continue
			}
			if w.Name == DefaultWebhook {
				w.Rules[0].Operations = []admissionregistrationv1.OperationType{create, update}
			}
			hooks = append(hooks, w)
		}
		mwc.Webhooks = hooks
		c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(mwc).Build()
		wrote, err := RouteMutating(ctx, c, "deployguard-mutating", true)
		require.NoError(t, err)
		assert.False(t, wrote, "without the entry for labelled creates, the default entry keeps every create")
		assert.Equal(t, []admissionregistrationv1.OperationType{create, update}, ops(c)[DefaultWebhook])
	})

	t.Run("not installed", func(t *testing.T) {
		c := fake.NewClientBuilder().WithScheme(scheme).Build()
		_, err := RouteMutating(ctx, c, "deployguard-mutating", true)
		require.True(t, apierrors.IsNotFound(errors.Unwrap(err)), "%v", err)
	})
}

func TestCreatesLabelled(t *testing.T) {
	for _, tc := range []struct {
		installed, params, every, want bool
	}{
		{true, true, false, true},
		{false, true, false, false},
		{true, false, false, false},
		{true, true, true, false},
	} {
		assert.Equal(t, tc.want, CreatesLabelled(tc.installed, tc.params, tc.every), "%+v", tc)
	}
}
