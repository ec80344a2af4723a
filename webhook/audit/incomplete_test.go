package audit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/deployguard/deployguard/policy"
	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/webhook/review"
)

// notesPolicy reads what the cache does not keep: a 200 KB annotation's end
// and the template's image.
const notesPolicy = `# METADATA
# custom:
#   mode: audit
package deployguard.notes

import rego.v1

deny contains {"msg": "the notes say forbidden", "field": "metadata.annotations"} if {
	endswith(input.object.metadata.annotations["team.example/notes"], "forbidden")
}

deny contains {"msg": "no latest images", "field": "spec.template.spec.containers"} if {
	some c in input.object.spec.template.spec.containers
	endswith(c.image, ":latest")
}
`

// cachedCopy is what the manager's cache keeps of d (reconciler.StripForCache,
// which this package does not import): no pod template, the long annotation
// dropped and the transform's marker in its place.
func cachedCopy(d *appsv1.Deployment) *appsv1.Deployment {
	c := d.DeepCopy()
	rollout.StripTemplate(&c.Spec.Template)
	if _, ok := c.Annotations["team.example/notes"]; ok {
		delete(c.Annotations, "team.example/notes")
		c.Annotations[rollout.CacheTrimmed] = "0123456789abcdef"
	}
	return c
}

// TestAuditJudgesIncompleteCopiesWhole: a Deployment the cache keeps without
// its template or with trimmed annotations is judged as the API server
// stores it, read through the API reader at the audit's pace; a policy that
// reads a 200 KB annotation or an image judges what is there. Judged from the
// cached copy, both would pass.
func TestAuditJudgesIncompleteCopiesWhole(t *testing.T) {
	withNotes := func(notes, image string) *appsv1.Deployment {
		return sound(func(d *appsv1.Deployment) {
			d.Annotations = map[string]string{"team.example/notes": strings.Repeat("x", 200_000) + notes}
			d.Spec.Template.Spec.Containers[0].Image = image
		})
	}
	scheme := runtime.NewScheme()
	require.NoError(t, appsv1.AddToScheme(scheme))
	tests := []struct {
		name     string
		stored   *appsv1.Deployment // what the API server has; nil: gone
		readErr  error
		noReader bool
		want     map[string]string // rule message → result of deployguard.notes; nil: no results
		// unread: the read fails; the previous results stand and the
		// Deployment is marked to be read again.
		unread bool
	}{
		{name: "a forbidden note past what the cache keeps fails", stored: withNotes("forbidden", "web:1.0"),
			want: map[string]string{"metadata.annotations": ResultFail}},
		{name: "a latest image in the template the cache strips fails", stored: withNotes("fine", "web:latest"),
			want: map[string]string{"spec.template.spec.containers": ResultFail}},
		{name: "both read whole pass", stored: withNotes("fine", "web:1.0"),
			want: map[string]string{"": ResultPass}},
		{name: "gone from the API server: no results", stored: nil, want: nil},
		{name: "the API server fails: nothing judged from the copy, the previous results stand, read again",
			stored: withNotes("forbidden", "web:1.0"), readErr: errors.New("connection refused"), unread: true},
		{name: "without an API reader the cached copy is judged as it is", stored: withNotes("forbidden", "web:latest"), noReader: true,
			want: map[string]string{"": ResultPass}},
	}
	for _, scope := range []string{"full", "partial", "policies"} {
		for _, tt := range tests {
			t.Run(scope+", "+tt.name, func(t *testing.T) {
				ctx := context.Background()
				eng, err := policy.New(policy.Options{})
				require.NoError(t, err)
				require.NoError(t, eng.Load(ctx, []policy.Source{{Name: "notes.rego", Module: notesPolicy}}))
				// The cache still holds the copy of a Deployment the API
				// server no longer has (its deletion not yet delivered).
				cachedOf := tt.stored
				if cachedOf == nil {
					cachedOf = withNotes("forbidden", "web:latest")
				}
				cached := fake.NewClientBuilder().WithScheme(scheme).WithObjects(cachedCopy(cachedOf)).Build()
				api := fake.NewClientBuilder().WithScheme(scheme)
				if tt.stored != nil {
					api = api.WithObjects(tt.stored)
				}
				// A partial pass reads the Deployment (GET), a full pass and a
				// policies pass list the API server's (one page here): one
				// read each.
				reads := 0
				api = api.WithInterceptorFuncs(interceptor.Funcs{Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
					reads++
					if tt.readErr != nil {
						return tt.readErr
					}
					return c.Get(ctx, key, obj, opts...)
				}, List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
					reads++
					if tt.readErr != nil {
						return tt.readErr
					}
					return c.List(ctx, list, opts...)
				}})
				r := &Runner{Client: cached, APIReader: api.Build(), Evaluator: &Evaluator{Options: &review.Options{}, Engine: eng},
					Options: Options{Format: FormatPolicyReport}, Log: logr.Discard(), Now: time.Now, known: map[string]map[string]entry{},
					// A failed List is not tried again here (TestPagesEach).
					listRetry: &wait.Backoff{}}
				if tt.noReader {
					r.APIReader = nil
				}
				dirty := map[client.ObjectKey]bool{{}: true}
				switch scope {
				case "partial":
					dirty = map[client.ObjectKey]bool{{Namespace: "shop", Name: "web"}: true}
					// Audited before, as a partial pass finds it.
					r.known["shop"] = map[string]entry{"web": newEntry(nil)}
				case "policies":
					// Audited before, by a notes policy the new set changed.
					dirty = map[client.ObjectKey]bool{}
					r.known["shop"] = map[string]entry{"web": newEntry(nil)}
					r.judgedWith = map[string]string{"notes": "an older digest"}
				}
				previous, hadPrevious := r.known["shop"]["web"]
				err = r.pass(ctx, rate.NewLimiter(rate.Inf, 1), dirty, scope == "policies")
				require.NoError(t, err)
				if tt.unread {
					assert.Equal(t, 1, reads, "one read from the API server")
					e, ok := r.known["shop"]["web"]
					assert.Equal(t, hadPrevious, ok, "judged only if it was before")
					assert.Equal(t, previous, e, "the previous results stand")
					assert.Equal(t, map[client.ObjectKey]bool{{Namespace: "shop", Name: "web"}: true}, r.dirty, "read again")
					return
				}
				if !tt.noReader {
					assert.Equal(t, 1, reads, "one read from the API server")
				}
				e, ok := r.known["shop"]["web"]
				if tt.want == nil && scope == "policies" {
					// The informer's deletion audits it again.
					assert.Equal(t, previous, e, "a refresh leaves a Deployment that is gone as it was")
					return
				}
				if tt.want == nil {
					assert.False(t, ok, "no results for a Deployment that is gone")
					return
				}
				require.True(t, ok, "judged")
				got := map[string]string{}
				for _, res := range e.results {
					if res.Policy == "deployguard.notes" {
						got[res.Field] = res.Result
					}
				}
				if e.passes["deployguard.notes"] > 0 {
					got[""] = ResultPass
				}
				assert.Equal(t, tt.want, got, fmt.Sprintf("results: %+v", e.results))
			})
		}
	}
}

// TestWholeReadsOnlyIncompleteCopies: a cached copy with its template and
// no marker is judged as it is, without a read; a marker alone is enough
// to read (the transform sets it; a tenant's never reaches the cache).
func TestWholeReadsOnlyIncompleteCopies(t *testing.T) {
	scheme := runtime.NewScheme()
	require.NoError(t, appsv1.AddToScheme(scheme))
	stored := sound(func(d *appsv1.Deployment) { d.Annotations = map[string]string{"team.example/notes": "long"} })
	tests := []struct {
		name  string
		copy  *appsv1.Deployment
		reads int
	}{
		{name: "complete", copy: stored.DeepCopy(), reads: 0},
		{name: "marked trimmed", copy: sound(func(d *appsv1.Deployment) { d.Annotations = map[string]string{rollout.CacheTrimmed: "x"} }), reads: 1},
		{name: "template stripped", copy: cachedCopy(sound()), reads: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reads := 0
			api := fake.NewClientBuilder().WithScheme(scheme).WithObjects(stored.DeepCopy()).
				WithInterceptorFuncs(interceptor.Funcs{Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
					reads++
					return c.Get(ctx, key, obj, opts...)
				}}).Build()
			r := &Runner{APIReader: api}
			got, err := r.whole(context.Background(), tt.copy)
			require.NoError(t, err)
			assert.Equal(t, tt.reads, reads)
			if tt.reads > 0 {
				assert.Equal(t, "long", got.Annotations["team.example/notes"], "read whole")
			} else {
				assert.Same(t, tt.copy, got)
			}
		})
	}
}
