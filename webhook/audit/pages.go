package audit

import (
	"context"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/rollout"
)

// pageSize is how many whole Deployments a full pass, or the refresh after a
// policy-set change, reads from the API server in one List at most: 50,000
// Deployments are 1,000 requests, not 50,000 GETs on the reader's
// client-side limit, and no more than one page is held. A Deployment can
// be 1.5 MiB, and a tenant can own the next 50 in the API server's order:
// a page holds 75 MiB at worst, before pageBytes brings the next one down.
const pageSize = 50

// pageBytes is what the pages after the first should hold at most: the
// next page's limit is pageBytes over the largest Deployment seen yet.
const pageBytes = 8 << 20

// listRetry is how a List that failed for a reason that may pass (a lost
// connection, a timeout, an API server busy or restarting) is tried again
// before what it did not list is left unread: 1, 2, 4 and 8 s. The unread
// are retried a Deployment at a time by GET at the reader's request rate,
// so one lost connection in a pass of 1,000 pages must not send the rest of
// the cluster there.
var listRetry = wait.Backoff{Duration: time.Second, Factor: 2, Jitter: 0.1, Steps: 4}

// pages reads the whole Deployments a full pass or a policy refresh needs
// from the API server, cluster-wide, a page at a time: the cache keeps none
// whole.
type pages struct {
	reader client.Reader
	size   int64 // the most a page holds
	retry  wait.Backoff
}

// nextLimit is the limit of the next List: as many Deployments as
// pageBytes holds of the largest one seen yet (its protobuf size), between 1
// and size.
func nextLimit(largest int, size int64) int64 {
	if largest <= 0 {
		return size
	}
	return max(1, min(size, int64(pageBytes/largest)))
}

// resumeToken is the continue token a 410 Gone for an expired one carries:
// the rest of the listing from the latest revision (not a consistent
// snapshot with the pages before it, which the pass does not need: what it
// was handed is off its list, what is new since is the informer's to mark).
// Empty when the error carries none.
func resumeToken(err error) string {
	if s, ok := err.(apierrors.APIStatus); ok {
		return s.Status().Continue
	}
	return ""
}

// each hands fn, once each and a page at a time, the whole Deployment of
// every key in want that the API server lists, deleting the key from want
// first; fn must not keep d past its call. It stops with fn's error (err).
// When it returns with neither error, the listing was complete: what is
// left in want is gone from the API server. listErr says that the API server
// could not list what is left in want, which was not read, even tried again
// (list).
//
// A continue token that expired (the API server compacted its revision
// during a long pass) goes on with the token the API server's refusal
// carries (resumeToken), or else restarts the listing from the start,
// skipping what was handed over already; either only after a listing that
// handed fn something, so that it never loops.
func (p pages) each(ctx context.Context, want map[client.ObjectKey]bool, fn func(d *appsv1.Deployment) error) (listErr, err error) {
	token := ""
	progress := false // fn was handed a Deployment since the listing (re)started
	limit, largest := p.size, 0
	for len(want) > 0 {
		list := &appsv1.DeploymentList{}
		opts := []client.ListOption{client.Limit(limit)}
		if token != "" {
			opts = append(opts, client.Continue(token))
		}
		if err := p.list(ctx, list, opts); err != nil {
			if restart(err, token, progress) {
				token, progress = resumeToken(err), false
				continue
			}
			return fmt.Errorf("listing Deployments from the API server: %w", err), nil
		}
		for i := range list.Items {
			d := &list.Items[i]
			largest = max(largest, d.Size())
			key := client.ObjectKeyFromObject(d)
			if !want[key] {
				continue
			}
			delete(want, key)
			progress = true
			if err := fn(d); err != nil {
				return nil, err
			}
		}
		limit = nextLimit(largest, p.size)
		if token = list.Continue; token == "" {
			return nil, nil
		}
	}
	return nil, nil
}

// list is one List, tried again on the same continue token while its
// error may pass (transient), p.retry's steps at most; it returns the last
// error.
func (p pages) list(ctx context.Context, list *appsv1.DeploymentList, opts []client.ListOption) error {
	b := p.retry
	for {
		*list = appsv1.DeploymentList{} // nothing of a failed attempt's
		err := p.reader.List(ctx, list, opts...)
		if err == nil || b.Steps <= 0 || !transient(err) || ctx.Err() != nil {
			return err
		}
		t := time.NewTimer(b.Step())
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

// transient: err may not recur if the same List is sent again. The API
// server's answers about the request itself (forbidden, invalid, not found,
// an expired continue token, which restart handles) would, and so would a
// type the client's scheme lacks. client-go itself sends a request again
// only on an answer carrying Retry-After; a lost connection or a timeout
// comes here.
func transient(err error) bool {
	for _, permanent := range []func(error) bool{
		apierrors.IsForbidden, apierrors.IsUnauthorized, apierrors.IsBadRequest, apierrors.IsInvalid,
		apierrors.IsNotFound, apierrors.IsMethodNotSupported, apierrors.IsNotAcceptable,
		apierrors.IsUnsupportedMediaType, apierrors.IsResourceExpired, apierrors.IsGone,
		runtime.IsNotRegisteredError,
	} {
		if permanent(err) {
			return false
		}
	}
	return true
}

// restart: a List that failed only because its continue token expired is
// listed again (resumed, or from the start), when the listing since the
// last (re)start made progress (else it would expire the same way for ever).
func restart(err error, token string, progress bool) bool {
	return token != "" && progress && (apierrors.IsResourceExpired(err) || apierrors.IsGone(err))
}

// eachWhole hands judge, once each, every Deployment of list (the cache's)
// that skip does not skip, as policies may read it: the cached copy when it
// is complete (or there is no API reader), else the API server's, read in
// pages (each), not one GET each, so that audit.rate, not the reader's
// request rate, sets the pace. One the API server no longer lists is not
// handed over. Those a List failed to return are handed to unread, in the
// cache's order (so that the log names the same first one), with its error.
// It stops with judge's error, or ctx's when ctx ended a List.
func (r *Runner) eachWhole(ctx context.Context, list []appsv1.Deployment, skip func(client.ObjectKey) bool,
	judge func(d *appsv1.Deployment) error, unread func(client.ObjectKey, error)) error {
	want := map[client.ObjectKey]bool{} // to be read whole
	for i := range list {
		d := &list[i]
		key := client.ObjectKeyFromObject(d)
		switch {
		case skip(key):
		case r.APIReader != nil && rollout.Incomplete(d):
			want[key] = true
		default:
			if err := judge(d); err != nil {
				return err
			}
		}
	}
	size := r.Options.PageSize
	if size <= 0 {
		size = pageSize
	}
	retry := listRetry
	if r.listRetry != nil {
		retry = *r.listRetry
	}
	listErr, err := pages{reader: r.APIReader, size: size, retry: retry}.each(ctx, want, judge)
	switch {
	case err != nil:
		return err
	case listErr != nil && ctx.Err() != nil:
		return ctx.Err()
	case listErr != nil:
		for i := range list {
			if key := client.ObjectKeyFromObject(&list[i]); want[key] {
				unread(key, listErr)
			}
		}
	}
	return nil
}
