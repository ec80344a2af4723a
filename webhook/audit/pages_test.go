package audit

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/deployguard/deployguard/policy"
	"github.com/deployguard/deployguard/webhook/review"
)

// pagedLists lists Deployments as the API server does, in pages of the
// Limit asked for, ordered by namespace and name (the fake client ignores
// Limit and Continue); its continue token is the offset. fault, when set,
// may fail the nth List (from 1), given its token.
type pagedLists struct {
	calls, gets int
	fault       func(call int, token string) error
	tokens      []string // each List's continue token
}

func (p *pagedLists) funcs() interceptor.Funcs {
	return interceptor.Funcs{
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			page, ok := list.(*appsv1.DeploymentList)
			if !ok {
				return c.List(ctx, list, opts...)
			}
			p.calls++
			o := (&client.ListOptions{}).ApplyOptions(opts)
			p.tokens = append(p.tokens, o.Continue)
			if p.fault != nil {
				if err := p.fault(p.calls, o.Continue); err != nil {
					return err
				}
			}
			var all appsv1.DeploymentList
			if err := c.List(ctx, &all, client.InNamespace(o.Namespace)); err != nil {
				return err
			}
			slices.SortFunc(all.Items, func(a, b appsv1.Deployment) int {
				return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
			})
			start := 0
			if o.Continue != "" {
				start, _ = strconv.Atoi(o.Continue)
			}
			end := len(all.Items)
			page.ListMeta = all.ListMeta
			page.Continue = ""
			if o.Limit > 0 && start+int(o.Limit) < end {
				end = start + int(o.Limit)
				page.Continue = strconv.Itoa(end)
			}
			page.Items = all.Items[start:end]
			return nil
		},
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			p.gets++
			return c.Get(ctx, key, obj, opts...)
		},
	}
}

// expired is the API server's answer to a continue token whose revision it
// compacted.
var expired = apierrors.NewResourceExpired("The provided continue parameter is too old to display a consistent list result.")

// expiredResuming is the same answer carrying the token of the rest of the
// listing from the latest revision, as the API server gives it.
func expiredResuming(token string) error {
	err := apierrors.NewResourceExpired("The provided continue parameter is too old to display a consistent list result.")
	err.ErrStatus.Continue = token
	return err
}

// TestPagesEach: each hands over every wanted Deployment the API server
// lists, once, a page at a time, and says what it could not read.
func TestPagesEach(t *testing.T) {
	scheme := runtime.NewScheme()
	require.NoError(t, appsv1.AddToScheme(scheme))
	key := func(s string) client.ObjectKey {
		ns, name, _ := strings.Cut(s, "/")
		return client.ObjectKey{Namespace: ns, Name: name}
	}
	// Pages of two: a/1 a/2 | a/3 b/1 | b/2.
	stored := []string{"a/1", "a/2", "a/3", "b/1", "b/2"}
	errStop := errors.New("stopped")
	tests := []struct {
		name   string
		want   []string
		fault  func(call int, token string) error
		stopAt string // fn fails on this one
		// retries: how many times a failed List may be sent again.
		retries int
		handed  []string
		left    []string // not handed over
		lists   int
		tokens  []string // each List's continue token, when set
		// listErr: the API server could not list what is left; else what
		// is left is gone.
		listErr func(error) bool
		err     error
	}{
		{name: "every wanted one once, in pages", want: []string{"a/1", "a/3", "b/2"},
			handed: []string{"a/1", "a/3", "b/2"}, lists: 3},
		{name: "listing stops once every wanted one is read", want: []string{"a/2"},
			handed: []string{"a/2"}, lists: 1},
		{name: "one the API server does not list is left, gone", want: []string{"a/2", "c/9"},
			handed: []string{"a/2"}, left: []string{"c/9"}, lists: 3},
		{name: "nothing wanted: no request", lists: 0},
		{name: "an expired token restarts the listing without it, handing none twice", want: stored,
			fault: func(call int, token string) error {
				if call == 2 {
					return expired
				}
				return nil
			},
			handed: stored, lists: 5},
		{name: "an expired token carrying one to resume with: the listing goes on from there", want: stored,
			fault: func(call int, token string) error {
				if call == 2 {
					return expiredResuming(token)
				}
				return nil
			},
			handed: stored, lists: 4},
		{name: "a token that keeps expiring: restarted once, then what is left is not read", want: stored,
			fault: func(_ int, token string) error {
				if token != "" {
					return expired
				}
				return nil
			},
			handed: []string{"a/1", "a/2"}, left: []string{"a/3", "b/1", "b/2"}, lists: 4, listErr: apierrors.IsResourceExpired},
		{name: "a List error: what is left is not read", want: stored,
			fault: func(call int, _ string) error {
				if call == 2 {
					return errors.New("connection refused")
				}
				return nil
			},
			handed: []string{"a/1", "a/2"}, left: []string{"a/3", "b/1", "b/2"}, lists: 2,
			listErr: func(err error) bool { return strings.Contains(err.Error(), "connection refused") }},
		{name: "a List error that passes: the same page is listed again, nothing left", want: stored, retries: 3,
			fault: func(call int, _ string) error {
				if call == 2 {
					return errors.New("http2: client connection lost")
				}
				return nil
			},
			handed: stored, lists: 4, tokens: []string{"", "2", "2", "4"}},
		{name: "the API server busy, then not: listed again", want: stored, retries: 3,
			fault: func(call int, _ string) error {
				if call <= 3 {
					return apierrors.NewTooManyRequests("the server is busy", 1)
				}
				return nil
			},
			handed: stored, lists: 6},
		{name: "a List error that persists: tried again, then what is left is not read", want: stored, retries: 3,
			fault: func(_ int, token string) error {
				if token != "" {
					return errors.New("connection refused")
				}
				return nil
			},
			handed: []string{"a/1", "a/2"}, left: []string{"a/3", "b/1", "b/2"}, lists: 5,
			listErr: func(err error) bool { return strings.Contains(err.Error(), "connection refused") }},
		{name: "a List the API server forbids is not tried again", want: stored, retries: 3,
			fault: func(call int, _ string) error {
				if call == 2 {
					return apierrors.NewForbidden(appsv1.Resource("deployments"), "", errors.New("no list"))
				}
				return nil
			},
			handed: []string{"a/1", "a/2"}, left: []string{"a/3", "b/1", "b/2"}, lists: 2, listErr: apierrors.IsForbidden},
		{name: "fn's error stops the listing", want: stored, stopAt: "a/2",
			handed: []string{"a/1", "a/2"}, left: []string{"a/3", "b/1", "b/2"}, lists: 1, err: errStop},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := fake.NewClientBuilder().WithScheme(scheme)
			for _, s := range stored {
				k := key(s)
				b = b.WithObjects(sound(func(d *appsv1.Deployment) { d.Namespace, d.Name = k.Namespace, k.Name }))
			}
			lists := &pagedLists{fault: tt.fault}
			want := map[client.ObjectKey]bool{}
			for _, s := range tt.want {
				want[key(s)] = true
			}
			var handed []string
			p := pages{reader: b.WithInterceptorFuncs(lists.funcs()).Build(), size: 2, retry: wait.Backoff{Steps: tt.retries}}
			listErr, err := p.each(context.Background(), want,
				func(d *appsv1.Deployment) error {
					handed = append(handed, d.Namespace+"/"+d.Name)
					assert.NotEmpty(t, d.Spec.Template.Spec.Containers, "whole")
					if d.Namespace+"/"+d.Name == tt.stopAt {
						return errStop
					}
					return nil
				})
			assert.Equal(t, tt.handed, handed)
			left := map[client.ObjectKey]bool{}
			for _, s := range tt.left {
				left[key(s)] = true
			}
			assert.Equal(t, left, want, "left in want")
			assert.Equal(t, tt.lists, lists.calls, "List requests")
			if tt.tokens != nil {
				assert.Equal(t, tt.tokens, lists.tokens, "continue tokens")
			}
			assert.Zero(t, lists.gets, "no GET")
			assert.ErrorIs(t, err, tt.err)
			if tt.listErr == nil {
				assert.NoError(t, listErr)
			} else if assert.Error(t, listErr) {
				assert.True(t, tt.listErr(listErr), listErr.Error())
			}
		})
	}
}

// TestPagesStopWaitingToListAgainWhenCancelled: a pass whose context ends
// while a failed List waits to be sent again ends then, with the List's
// error, not after the wait.
func TestPagesStopWaitingToListAgainWhenCancelled(t *testing.T) {
	scheme := runtime.NewScheme()
	require.NoError(t, appsv1.AddToScheme(scheme))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lists := &pagedLists{fault: func(int, string) error {
		// Cancelled once the List has failed, during the wait.
		time.AfterFunc(10*time.Millisecond, cancel)
		return errors.New("http2: client connection lost")
	}}
	reader := fake.NewClientBuilder().WithScheme(scheme).WithObjects(sound(func(d *appsv1.Deployment) { d.Namespace, d.Name = "a", "1" })).
		WithInterceptorFuncs(lists.funcs()).Build()
	p := pages{reader: reader, size: 2, retry: wait.Backoff{Duration: time.Hour, Steps: 3}}
	listErr, err := p.each(ctx, map[client.ObjectKey]bool{{Namespace: "a", Name: "1"}: true}, func(*appsv1.Deployment) error { return nil })
	require.NoError(t, err)
	require.ErrorContains(t, listErr, "client connection lost")
	assert.Equal(t, 1, lists.calls, "not sent again")
}

// TestNextLimit: a page holds as many Deployments as pageBytes does of the
// largest seen yet, at least one, at most the page size.
func TestNextLimit(t *testing.T) {
	tests := []struct {
		largest int
		size    int64
		want    int64
	}{
		{largest: 0, size: 50, want: 50},
		{largest: 7 << 10, size: 50, want: 50},
		{largest: 512 << 10, size: 50, want: 16},
		{largest: 1536 << 10, size: 50, want: 5},
		{largest: 64 << 20, size: 50, want: 1},
		{largest: 7 << 10, size: 500, want: 500},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, nextLimit(tt.largest, tt.size), "largest %d, size %d", tt.largest, tt.size)
	}
}

// A tenant's large Deployments make the next pages smaller: after a page
// that held one of just over 1 MiB, pages hold 7 (8 MiB's worth), whatever
// the page size.
func TestPagesShrinkAfterALargeDeployment(t *testing.T) {
	scheme := runtime.NewScheme()
	require.NoError(t, appsv1.AddToScheme(scheme))
	b := fake.NewClientBuilder().WithScheme(scheme)
	want := map[client.ObjectKey]bool{}
	for i := range 40 {
		d := sound(func(d *appsv1.Deployment) {
			d.Namespace, d.Name = "team", fmt.Sprintf("d-%02d", i)
			if i == 0 {
				d.Annotations = map[string]string{"notes": strings.Repeat("x", 1<<20)}
			}
		})
		b = b.WithObjects(d)
		want[client.ObjectKeyFromObject(d)] = true
	}
	var limits []int64
	reader := b.WithInterceptorFuncs(interceptor.Funcs{List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
		limits = append(limits, (&client.ListOptions{}).ApplyOptions(opts).Limit)
		return (&pagedLists{}).funcs().List(ctx, c, list, opts...)
	}}).Build()
	n := 0
	_, err := pages{reader: reader, size: 10}.each(context.Background(), want, func(*appsv1.Deployment) error { n++; return nil })
	require.NoError(t, err)
	assert.Equal(t, 40, n)
	assert.Equal(t, []int64{10, 7, 7, 7, 7, 7}, limits)
}

// TestRestart: only an expired continue token, after progress, lists again.
func TestRestart(t *testing.T) {
	// What API servers before ResourceExpired answered (NewGone, deprecated).
	gone := &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: http.StatusGone,
		Reason: metav1.StatusReasonGone, Message: "too old"}}
	tests := []struct {
		name     string
		err      error
		token    string
		progress bool
		want     bool
	}{
		{name: "expired after progress", err: expired, token: "t", progress: true, want: true},
		{name: "gone after progress", err: gone, token: "t", progress: true, want: true},
		{name: "expired without progress would expire again", err: expired, token: "t"},
		{name: "expired without a token is no token's fault", err: expired, progress: true},
		{name: "another error", err: errors.New("connection refused"), token: "t", progress: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, restart(tt.err, tt.token, tt.progress))
		})
	}
}

// pageFault is one way the API server's listing goes for the paged passes'
// tests: a fault on some List calls (the call's number from 1, and the
// continue token it carries), the Lists it takes, and which Deployments the
// pass judges anew.
type pageFault struct {
	name  string
	fault func(call int, token string) error
	lists int
	anew  func(client.ObjectKey) bool
}

// pageFaults are the listings both paged passes are tested under, over
// three pages: everyPage and onPage1 say which Deployments those are.
func pageFaults(everyPage, onPage1 func(client.ObjectKey) bool) []pageFault {
	return []pageFault{
		{name: "every page read", lists: 3, anew: everyPage},
		{name: "an expired token on the second page: listed again, none judged twice", lists: 5, anew: everyPage,
			fault: func(call int, _ string) error {
				if call == 2 {
					return expired
				}
				return nil
			}},
		{name: "a token that keeps expiring: the first page judged, the rest read again later", lists: 4, anew: onPage1,
			fault: func(_ int, token string) error {
				if token != "" {
					return expired
				}
				return nil
			}},
		{name: "a List error on the second page that passes: listed again, every page judged", lists: 4, anew: everyPage,
			fault: func(call int, _ string) error {
				if call == 2 {
					return errors.New("http2: client connection lost")
				}
				return nil
			}},
		{name: "List errors from the second page on: the first page judged, the rest read again later", lists: 5, anew: onPage1,
			fault: func(_ int, token string) error {
				if token != "" {
					return errors.New("http2: client connection lost")
				}
				return nil
			}},
		{name: "every List fails: every Deployment keeps its results", lists: 4, anew: func(client.ObjectKey) bool { return false },
			fault: func(int, string) error { return errors.New("http2: client connection lost") }},
	}
}

// imaged is a sound Deployment by key, running image.
func imaged(key client.ObjectKey, image string) *appsv1.Deployment {
	return sound(func(d *appsv1.Deployment) {
		d.Namespace, d.Name = key.Namespace, key.Name
		d.Spec.Template.Spec.Containers[0].Image = image
	})
}

// pagedCluster is the paged passes' tests' cluster: counts Deployments per
// namespace (d-000, d-001...) running web:1.0, in the cache without their
// templates and whole in the API server; the caller adds its own to either
// builder.
func pagedCluster(scheme *runtime.Scheme, counts map[string]int) (cache, api *fake.ClientBuilder) {
	cache = fake.NewClientBuilder().WithScheme(scheme)
	api = fake.NewClientBuilder().WithScheme(scheme)
	for ns, n := range counts {
		for i := range n {
			d := imaged(client.ObjectKey{Namespace: ns, Name: fmt.Sprintf("d-%03d", i)}, "web:1.0")
			cache = cache.WithObjects(cachedCopy(d))
			api = api.WithObjects(d)
		}
	}
	return cache, api
}

// pagedRunner audits the cache's Deployments with the notes policy, reading
// whole ones from api in pages of 500 (a failed List tried 3 more times, at
// once), kube-system ignored.
func pagedRunner(ctx context.Context, t *testing.T, cache client.Client, api client.Reader) *Runner {
	t.Helper()
	eng, err := policy.New(policy.Options{})
	require.NoError(t, err)
	require.NoError(t, eng.Load(ctx, []policy.Source{{Name: "notes.rego", Module: notesPolicy}}))
	return &Runner{Client: cache, APIReader: api, Evaluator: &Evaluator{Options: &review.Options{}, Engine: eng},
		Options: Options{Format: FormatPolicyReport, IgnoredNamespaces: []string{"kube-system"}, PageSize: 500}, Log: logr.Discard(), Now: time.Now,
		known: map[string]map[string]entry{}, listRetry: &wait.Backoff{Steps: 3}}
}

// TestAuditFullPassReadsInPages: a full pass over 1,050 Deployments the
// cache keeps without their templates judges every one whole from 3 Lists of
// the API server (500 each), not 1,050 GETs, spending one audit.rate token
// on each and none twice: a List restarted after an expired continue token
// judges none again. One the API server does not list is not judged; when
// it fails the listing, what it did not list keeps its previous results and
// is read again.
func TestAuditFullPassReadsInPages(t *testing.T) {
	scheme := runtime.NewScheme()
	require.NoError(t, appsv1.AddToScheme(scheme))
	// Sorted, the API server's 1,071 fill three pages:
	//   1: kube-system d-000..d-019, shop d-000..d-479
	//   2: shop d-480..d-599, tools d-000..d-379
	//   3: tools d-380..d-449, tools/new
	// The cache also lists shop/gone (deleted, not yet delivered) and not
	// tools/new (created, not yet delivered); kube-system is ignored.
	counts := map[string]int{"kube-system": 20, "shop": 600, "tools": 450}
	const judged, firstPage = 1050, 480
	onPage1 := func(key client.ObjectKey) bool {
		return key.Namespace == "shop" && key.Name < fmt.Sprintf("d-%03d", firstPage)
	}
	everyPage := func(client.ObjectKey) bool { return true }
	// anew: judged in the second pass; the others keep the first pass's
	// results and are marked unread (shop/gone too, unless the listing was
	// complete).
	tests := pageFaults(everyPage, onPage1)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cb, ab := pagedCluster(scheme, counts)
			cb = cb.WithObjects(cachedCopy(imaged(client.ObjectKey{Namespace: "shop", Name: "gone"}, "web:latest")))
			ab = ab.WithObjects(imaged(client.ObjectKey{Namespace: "tools", Name: "new"}, "web:latest"))
			lists := &pagedLists{}
			api := ab.WithInterceptorFuncs(lists.funcs()).Build()
			r := pagedRunner(ctx, t, cb.Build(), api)
			// audit.rate's tokens, no more: one Deployment judged twice
			// would fail the pass.
			limiter := rate.NewLimiter(0, judged)
			require.NoError(t, r.pass(ctx, limiter, map[client.ObjectKey]bool{{}: true}, false), "the first full pass")
			assert.Equal(t, 3, lists.calls, "3 Lists of 500")
			assert.Zero(t, lists.gets, "no GET")
			assert.Zero(t, limiter.Tokens(), "one token per Deployment judged")
			assert.Equal(t, map[string]int{"shop": 600, "tools": 450}, sizes(r.known), "shop/gone and tools/new not judged")
			previous := r.known

			// Every image turns latest, which only the template the cache
			// strips shows; then the second pass meets the case's fault.
			var all appsv1.DeploymentList
			require.NoError(t, api.List(ctx, &all))
			for i := range all.Items {
				d := &all.Items[i]
				d.Spec.Template.Spec.Containers[0].Image = "web:latest"
				require.NoError(t, api.Update(ctx, d))
			}
			anew := 0
			for ns, n := range counts {
				for i := range n {
					if key := (client.ObjectKey{Namespace: ns, Name: fmt.Sprintf("d-%03d", i)}); ns != "kube-system" && tt.anew(key) {
						anew++
					}
				}
			}
			*lists = pagedLists{fault: tt.fault}
			limiter = rate.NewLimiter(0, anew)
			require.NoError(t, r.pass(ctx, limiter, map[client.ObjectKey]bool{{}: true}, false))
			assert.Equal(t, tt.lists, lists.calls, "List requests")
			assert.Zero(t, lists.gets, "no GET")
			assert.Zero(t, limiter.Tokens(), "one token per Deployment judged, none twice")
			assert.Equal(t, map[string]int{"shop": 600, "tools": 450}, sizes(r.known), "no Deployment lost its results")
			unread := map[client.ObjectKey]bool{}
			for ns, byName := range r.known {
				for name, e := range byName {
					key := client.ObjectKey{Namespace: ns, Name: name}
					if tt.anew(key) {
						assert.Len(t, resultsOf(e, "deployguard.notes"), 1, "%s judged whole anew: its latest image fails", key)
						continue
					}
					assert.Equal(t, previous[ns][name], e, "%s keeps its previous results", key)
					unread[key] = true
				}
			}
			if anew < judged {
				unread[client.ObjectKey{Namespace: "shop", Name: "gone"}] = true
			}
			assert.Equal(t, len(unread), r.unread)
			if len(unread) == 0 {
				unread = nil
			}
			assert.Equal(t, unread, r.dirty, "what was not read is read again")
		})
	}
}

// sizes counts the Deployments known in each namespace.
func sizes(known map[string]map[string]entry) map[string]int {
	out := map[string]int{}
	for ns, byName := range known {
		out[ns] = len(byName)
	}
	return out
}

// TestAuditPolicyRefreshReadsInPages: after a policy-set change, the pass
// over 1,051 Deployments the cache keeps without their templates reads them
// whole from 3 Lists of the API server (500 each), not 1,051 GETs, and
// spends one audit.rate token on each it judges, none twice (a List
// restarted after an expired continue token judges none again). It judges
// only the policy the set added, but a Deployment never audited whole; one in
// dirty is left to the evaluation that follows (its own GET). One the API
// server does not list is not judged; when it fails the listing, what it did
// not list keeps its previous results and is read again.
func TestAuditPolicyRefreshReadsInPages(t *testing.T) {
	scheme := runtime.NewScheme()
	require.NoError(t, appsv1.AddToScheme(scheme))
	// Sorted, the API server's 1,071 fill three pages:
	//   1: kube-system d-000..d-019, shop d-000..d-479
	//   2: shop d-480..d-599, tools d-000..d-379
	//   3: tools d-380..d-449, tools/new
	// tools/new is created after the first full pass and never audited; the
	// cache also lists shop/gone (deleted, not yet delivered); kube-system
	// is ignored.
	counts := map[string]int{"kube-system": 20, "shop": 600, "tools": 450}
	newKey := client.ObjectKey{Namespace: "tools", Name: "new"}
	goneKey := client.ObjectKey{Namespace: "shop", Name: "gone"}
	var keys []client.ObjectKey // what the refresh may judge: the cache's, outside kube-system, but shop/gone
	for ns, n := range counts {
		for i := range n {
			if ns != "kube-system" {
				keys = append(keys, client.ObjectKey{Namespace: ns, Name: fmt.Sprintf("d-%03d", i)})
			}
		}
	}
	keys = append(keys, newKey)
	onPage1 := func(key client.ObjectKey) bool { return key.Namespace == "shop" && key.Name < "d-480" }
	everyPage := func(client.ObjectKey) bool { return true }
	dirtyKey := client.ObjectKey{Namespace: "shop", Name: "d-100"}
	// anew: judged by the refresh; the others keep their results and are
	// marked unread (shop/gone too, unless the listing was complete).
	type refreshCase struct {
		pageFault
		dirty []client.ObjectKey
	}
	tests := []refreshCase{{pageFault: pageFault{name: "a Deployment in dirty: left to the evaluation that follows, judged whole once", lists: 3, anew: everyPage},
		dirty: []client.ObjectKey{dirtyKey}}}
	for _, f := range pageFaults(everyPage, onPage1) {
		tests = append(tests, refreshCase{pageFault: f})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cb, ab := pagedCluster(scheme, counts)
			cached := cb.WithObjects(cachedCopy(imaged(goneKey, "web:1.0"))).Build()
			lists := &pagedLists{}
			api := ab.WithInterceptorFuncs(lists.funcs()).Build()
			r := pagedRunner(ctx, t, cached, api)
			require.NoError(t, r.pass(ctx, rate.NewLimiter(rate.Inf, 1), map[client.ObjectKey]bool{{}: true}, false), "the first full pass")
			require.Equal(t, map[string]int{"shop": 600, "tools": 450}, sizes(r.known))
			previous := map[string]map[string]entry{}
			for ns, byName := range r.known {
				previous[ns] = maps.Clone(byName)
			}

			// tools/new is created; every image turns latest, which only the
			// template the cache strips shows and only a whole evaluation
			// judges (the notes policy is unchanged); the new set adds the
			// owner policy, which every Deployment fails.
			newOne := imaged(newKey, "web:latest")
			require.NoError(t, api.Create(ctx, newOne.DeepCopy()))
			require.NoError(t, cached.Create(ctx, cachedCopy(newOne)))
			var all appsv1.DeploymentList
			require.NoError(t, api.List(ctx, &all))
			for i := range all.Items {
				d := &all.Items[i]
				d.Spec.Template.Spec.Containers[0].Image = "web:latest"
				require.NoError(t, api.Update(ctx, d))
			}
			require.NoError(t, r.Evaluator.Engine.Load(ctx, []policy.Source{{Name: "notes.rego", Module: notesPolicy}, {Name: "owner.rego", Module: ownerPolicy}}))
			dirty := map[client.ObjectKey]bool{}
			for _, key := range tt.dirty {
				dirty[key] = true
			}
			judged := len(dirty)
			for _, key := range keys {
				if !dirty[key] && tt.anew(key) {
					judged++
				}
			}
			*lists = pagedLists{fault: tt.fault}
			// audit.rate's tokens, no more: one Deployment judged twice
			// would fail the pass.
			limiter := rate.NewLimiter(0, judged)
			require.NoError(t, r.pass(ctx, limiter, dirty, true))
			assert.Equal(t, tt.lists, lists.calls, "List requests")
			assert.Equal(t, len(dirty), lists.gets, "a GET only for the Deployment in dirty")
			assert.Zero(t, limiter.Tokens(), "one token per Deployment judged, none twice")

			unread := map[client.ObjectKey]bool{}
			for _, key := range keys {
				e, ok := r.known[key.Namespace][key.Name]
				switch {
				case dirty[key] || key == newKey && tt.anew(key):
					require.True(t, ok, "%s judged", key)
					assert.Len(t, resultsOf(e, "deployguard.notes"), 1, "%s judged whole: its latest image fails", key)
					assert.Len(t, resultsOf(e, "deployguard.owner"), 1, "%s judged by the new policy", key)
				case tt.anew(key):
					require.True(t, ok, "%s judged", key)
					assert.Empty(t, resultsOf(e, "deployguard.notes"), "%s: the unchanged policy's results stand", key)
					others := maps.Clone(e.passes)
					delete(others, "deployguard.owner")
					assert.Equal(t, previous[key.Namespace][key.Name].passes, others, "%s keeps its other passes", key)
					assert.Len(t, resultsOf(e, "deployguard.owner"), 1, "%s judged by the new policy", key)
				default:
					p, had := previous[key.Namespace][key.Name]
					assert.Equal(t, had, ok, "%s keeps its results, or has none", key)
					assert.Equal(t, p, e, "%s keeps its previous results", key)
					unread[key] = true
				}
			}
			_, ok := r.known[goneKey.Namespace][goneKey.Name]
			assert.False(t, ok, "shop/gone not judged")
			if len(unread) > 0 {
				unread[goneKey] = true
			}
			assert.Equal(t, len(unread), r.unread)
			if len(unread) == 0 {
				unread = nil
			}
			assert.Equal(t, unread, r.dirty, "what was not read is read again")
		})
	}
}
