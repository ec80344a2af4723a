package audit

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// pageSize is how many whole Deployments a full pass reads from the API
// server in one List: 50,000 Deployments are 100 requests, not 50,000 GETs
// on the reader's client-side limit, and no more than one page is held.
const pageSize = 500

// pages reads the whole Deployments a full pass needs from the API server,
// cluster-wide, a page at a time: the cache keeps none whole.
type pages struct {
	reader client.Reader
	size   int64
}

// each hands fn, once each and a page at a time, the whole Deployment of
// every key in want that the API server lists, deleting the key from want
// first; fn must not keep d past its call. It stops with fn's error (err).
// When it returns with neither error, the listing was complete: what is
// left in want is gone from the API server. listErr says that the API server
// could not list what is left in want, which was not read.
//
// A continue token that expired (the API server compacted its revision
// during a long pass) restarts the listing from the start, skipping what
// was handed over already; only after a restart that handed fn something,
// so that it never loops.
func (p pages) each(ctx context.Context, want map[client.ObjectKey]bool, fn func(d *appsv1.Deployment) error) (listErr, err error) {
	token := ""
	progress := false // fn was handed a Deployment since the listing (re)started
	for len(want) > 0 {
		list := &appsv1.DeploymentList{}
		opts := []client.ListOption{client.Limit(p.size)}
		if token != "" {
			opts = append(opts, client.Continue(token))
		}
		if err := p.reader.List(ctx, list, opts...); err != nil {
			if restart(err, token, progress) {
				token, progress = "", false
				continue
			}
			return fmt.Errorf("listing Deployments from the API server: %w", err), nil
		}
		for i := range list.Items {
			d := &list.Items[i]
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
		if token = list.Continue; token == "" {
			return nil, nil
		}
	}
	return nil, nil
}

// restart: a List that failed only because its continue token expired is
// listed again from the start, when the listing since the last start made
// progress (else it would expire the same way for ever).
func restart(err error, token string, progress bool) bool {
	return token != "" && progress && (apierrors.IsResourceExpired(err) || apierrors.IsGone(err))
}
