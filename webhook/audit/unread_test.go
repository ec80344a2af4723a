package audit

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/deployguard/deployguard/policy"
	"github.com/deployguard/deployguard/webhook/review"
)

// ownerPolicy is the policy a new set adds.
const ownerPolicy = `# METADATA
# custom:
#   mode: audit
package deployguard.owner

import rego.v1

deny contains "needs an owner label" if {
	not input.object.metadata.labels.owner
}
`

// TestAuditKeepsResultsOfUnreadDeployments: one Deployment the API server
// fails to return, in any pass, keeps its previous results, and every other
// Deployment keeps or gets its own: the reports and the results metric lose
// nothing. It is marked to be audited again, and the next pass reads it
// and reports what it is now. A full pass and a policies pass read in
// pages: the API server failing the list leaves every Deployment of the page
// unread, each with its previous results.
func TestAuditKeepsResultsOfUnreadDeployments(t *testing.T) {
	scheme, gvk := reportScheme(t)
	deployment := func(ns, name, image string) *appsv1.Deployment {
		return sound(func(d *appsv1.Deployment) {
			d.Namespace, d.Name, d.UID = ns, name, types.UID("uid-"+name)
			d.Spec.Template.Spec.Containers[0].Image = image
		})
	}
	apiKey := client.ObjectKey{Namespace: "shop", Name: "api"}
	tests := []struct {
		name     string
		dirty    map[client.ObjectKey]bool
		policies []policy.Source // the set loaded before the failing pass; nil: unchanged
		// The failures in shop's report, and deployguard.owner's in the
		// results metric, after the failing pass and after the retry; the
		// failures in tools' report after the failing pass.
		shopFails, shopFailsAfter   int64
		toolsFails                  int64
		ownerFails, ownerFailsAfter float64
		// unread: marked to be audited again; nil: api alone.
		unread []client.ObjectKey
	}{
		{name: "the period's full pass (its one page fails)", dirty: map[client.ObjectKey]bool{{}: true}, shopFails: 1, toolsFails: 1,
			unread: []client.ObjectKey{{Namespace: "shop", Name: "web"}, apiKey, {Namespace: "shop", Name: "db"}, {Namespace: "tools", Name: "ci"}}},
		{name: "a partial pass (the Deployment changed)", dirty: map[client.ObjectKey]bool{apiKey: true}, shopFails: 1, toolsFails: 1},
		// It reads in pages too: every Deployment keeps its old results (no
		// owner result yet). The retry judges each whole, by the new policy.
		{name: "a policies pass (a new policy set; its one page fails)", dirty: map[client.ObjectKey]bool{},
			policies:  []policy.Source{{Name: "notes.rego", Module: notesPolicy}, {Name: "owner.rego", Module: ownerPolicy}},
			shopFails: 1, shopFailsAfter: 3, toolsFails: 1, ownerFails: 0, ownerFailsAfter: 4,
			unread: []client.ObjectKey{{Namespace: "shop", Name: "web"}, apiKey, {Namespace: "shop", Name: "db"}, {Namespace: "tools", Name: "ci"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			eng, err := policy.New(policy.Options{})
			require.NoError(t, err)
			require.NoError(t, eng.Load(ctx, []policy.Source{{Name: "notes.rego", Module: notesPolicy}}))
			stored := []*appsv1.Deployment{
				deployment("shop", "web", "web:1.0"),
				deployment("shop", "api", "api:latest"),
				deployment("shop", "db", "db:1.0"),
				deployment("tools", "ci", "ci:latest"),
			}
			// The cache keeps no template: every Deployment is read whole.
			cb := fake.NewClientBuilder().WithScheme(scheme)
			ab := fake.NewClientBuilder().WithScheme(scheme)
			for _, d := range stored {
				cb = cb.WithObjects(cachedCopy(d))
				ab = ab.WithObjects(d.DeepCopy())
			}
			cached := cb.Build()
			var failing atomic.Bool
			var apiReads atomic.Int32
			api := ab.WithInterceptorFuncs(interceptor.Funcs{Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
				if key == apiKey {
					apiReads.Add(1)
					if failing.Load() {
						return errors.New("http2: client connection lost")
					}
				}
				return c.Get(ctx, key, obj, opts...)
			}, List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
				// One page, which holds api.
				apiReads.Add(1)
				if failing.Load() {
					return errors.New("http2: client connection lost")
				}
				return c.List(ctx, list, opts...)
			}}).Build()
			am, err := NewMetrics(prometheus.NewRegistry())
			require.NoError(t, err)
			r := &Runner{Client: cached, APIReader: api, Evaluator: &Evaluator{Options: &review.Options{}, Engine: eng}, Metrics: am,
				Options: Options{Format: FormatPolicyReport}, Log: logr.Discard(), Now: time.Now, known: map[string]map[string]entry{},
				// A failed List is not tried again here (TestPagesEach):
				// what is unread is.
				listRetry: &wait.Backoff{}}
			limiter := rate.NewLimiter(rate.Inf, 1)
			summary := func(ns string) map[string]any {
				t.Helper()
				u := &unstructured.Unstructured{}
				u.SetGroupVersionKind(gvk)
				require.NoError(t, cached.Get(ctx, client.ObjectKey{Namespace: ns, Name: ReportName}, u))
				s, _, _ := unstructured.NestedMap(u.Object, "summary")
				return s
			}
			fails := func(p string) float64 { return testutil.ToFloat64(am.results.WithLabelValues(p, ResultFail)) }

			require.NoError(t, r.pass(ctx, limiter, map[client.ObjectKey]bool{{}: true}, false), "the first full pass")
			require.Len(t, r.known["shop"], 3)
			before := r.known["shop"]["api"]
			require.Len(t, resultsOf(before, "deployguard.notes"), 1, "api's latest image fails")
			assert.Equal(t, int64(1), summary("shop")["fail"])
			assert.Equal(t, int64(1), summary("tools")["fail"])
			assert.Equal(t, 2.0, fails("deployguard.notes"))

			if tt.policies != nil {
				require.NoError(t, eng.Load(ctx, tt.policies))
			}
			failing.Store(true)
			reads := apiReads.Load()
			assert.NoError(t, r.pass(ctx, limiter, tt.dirty, tt.policies != nil), "one failed read does not fail the pass")
			assert.Equal(t, reads+1, apiReads.Load(), "api was read")
			assert.Equal(t, before, r.known["shop"]["api"], "api's previous results stand")
			assert.Len(t, r.known["shop"], 3, "shop's other Deployments keep their results")
			assert.Len(t, r.known["tools"], 1)
			assert.Equal(t, tt.shopFails, summary("shop")["fail"], "shop's report keeps api's failure")
			assert.Equal(t, tt.toolsFails, summary("tools")["fail"])
			assert.Equal(t, 2.0, fails("deployguard.notes"), "the results metric keeps every Deployment's")
			assert.Equal(t, tt.ownerFails, fails("deployguard.owner"))
			unread := map[client.ObjectKey]bool{apiKey: true}
			if tt.unread != nil {
				unread = map[client.ObjectKey]bool{}
				for _, key := range tt.unread {
					unread[key] = true
				}
			}
			assert.Equal(t, unread, r.dirty, "what was not read is marked to be audited again")
			assert.Equal(t, len(unread), r.unread)

			// api is fixed meanwhile, and the API server answers again: the
			// next pass (the run loop takes what is marked) reads it and
			// reports it as it is now.
			failing.Store(false)
			fixed := &appsv1.Deployment{}
			require.NoError(t, api.Get(ctx, apiKey, fixed))
			fixed.Spec.Template.Spec.Containers[0].Image = "api:2.0"
			require.NoError(t, api.Update(ctx, fixed))
			reads = apiReads.Load()
			dirty := r.dirty
			r.dirty = map[client.ObjectKey]bool{}
			require.NoError(t, r.pass(ctx, limiter, dirty, false))
			assert.Equal(t, reads+1, apiReads.Load(), "api was read again")
			assert.Empty(t, r.dirty)
			assert.Equal(t, 0, r.unread)
			assert.Empty(t, resultsOf(r.known["shop"]["api"], "deployguard.notes"), "api read whole: no failure left")
			assert.Equal(t, 1.0, fails("deployguard.notes"), "only tools/ci's latest image fails")
			assert.Equal(t, tt.ownerFailsAfter, fails("deployguard.owner"))
			assert.Equal(t, tt.shopFailsAfter, summary("shop")["fail"])
		})
	}
}

// resultsOf are e's results of one policy that are not a pass.
func resultsOf(e entry, policy string) []Result {
	var out []Result
	for _, r := range e.results {
		if r.Policy == policy {
			out = append(out, r)
		}
	}
	return out
}

// A new leader's first full pass whose listing fails keeps the reports of
// the namespaces it could not read: it has no results of its own for them
// yet, and they still hold Deployments. An emptied namespace's report goes.
func TestAuditFailedListingKeepsReportsOfUnreadNamespaces(t *testing.T) {
	ctx := context.Background()
	scheme, gvk := reportScheme(t)
	report := func(ns string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(gvk)
		u.SetNamespace(ns)
		u.SetName(ReportName)
		u.SetLabels(map[string]string{"app.kubernetes.io/managed-by": "deployguard"})
		return u
	}
	d := sound(func(d *appsv1.Deployment) { d.Namespace, d.Name = "shop", "web" })
	cached := fake.NewClientBuilder().WithScheme(scheme).WithObjects(cachedCopy(d), report("shop"), report("emptied")).Build()
	api := fake.NewClientBuilder().WithScheme(scheme).WithObjects(d).WithInterceptorFuncs(interceptor.Funcs{
		List: func(context.Context, client.WithWatch, client.ObjectList, ...client.ListOption) error {
			return errors.New("http2: client connection lost")
		}}).Build()
	eng, err := policy.New(policy.Options{})
	require.NoError(t, err)
	r := &Runner{Client: cached, APIReader: api, Evaluator: &Evaluator{Options: &review.Options{}, Engine: eng},
		Options: Options{Format: FormatPolicyReport}, Log: logr.Discard(), Now: time.Now, known: map[string]map[string]entry{}}

	require.NoError(t, r.pass(ctx, rate.NewLimiter(rate.Inf, 1), map[client.ObjectKey]bool{{}: true}, false))
	assert.Equal(t, map[client.ObjectKey]bool{client.ObjectKeyFromObject(d): true}, r.dirty, "shop/web is read again")
	assert.NoError(t, cached.Get(ctx, client.ObjectKeyFromObject(report("shop")), report("shop")), "shop's report stays")
	assert.True(t, apierrors.IsNotFound(cached.Get(ctx, client.ObjectKeyFromObject(report("emptied")), report("emptied"))), "the emptied namespace's report goes")
}

// reportScheme knows Deployments and the PolicyReports the audit writes, as
// unstructured objects of gvk.
func reportScheme(t *testing.T) (*runtime.Scheme, schema.GroupVersionKind) {
	t.Helper()
	scheme := runtime.NewScheme()
	require.NoError(t, appsv1.AddToScheme(scheme))
	gvk, err := GVK(FormatPolicyReport)
	require.NoError(t, err)
	scheme.AddKnownTypeWithName(gvk, &unstructured.Unstructured{})
	scheme.AddKnownTypeWithName(gvk.GroupVersion().WithKind(gvk.Kind+"List"), &unstructured.UnstructuredList{})
	return scheme, gvk
}
