package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/test/bench/load"
)

// namespace is the i-th namespace: "scale" alone when there is one (as the
// bench's single-namespace figures were measured), scale-000 … otherwise.
func (b *bench) namespace(i int) string {
	if b.o.namespaces == 1 {
		return "scale"
	}
	return fmt.Sprintf("scale-%03d", i)
}

// key of the i-th Deployment of the fill: dealt round the namespaces, so that
// every size fills them evenly.
func (b *bench) key(i int) client.ObjectKey {
	return client.ObjectKey{Namespace: b.namespace(i % b.o.namespaces), Name: fmt.Sprintf("app-%05d", i)}
}

// parallel runs do for every i in [from, to) from clients goroutines and
// returns the first error.
func parallel(ctx context.Context, from, to, clients int, do func(ctx context.Context, i int) error) error {
	next := atomic.Int64{}
	next.Store(int64(from))
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= to || ctx.Err() != nil {
					return
				}
				if err := do(ctx, i); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	if firstErr == nil {
		firstErr = ctx.Err()
	}
	return firstErr
}

// fill creates Deployments up to n, each given its revisions, by concurrent
// clients; each client waits until the Deployment controller has synced its
// Deployment's last revision, so every ReplicaSet exists when fill returns.
func (b *bench) fill(ctx context.Context, n int) (time.Duration, error) {
	start := time.Now()
	if err := parallel(ctx, b.created, n, b.o.clients, b.createWithRevisions); err != nil {
		return 0, err
	}
	b.created = n
	return time.Since(start), nil
}

func (b *bench) createWithRevisions(ctx context.Context, i int) error {
	k := b.key(i)
	d := load.Deployment(k.Namespace, k.Name, 0, b.o.containers, b.o.envVars)
	if err := retry(ctx, func() error { return b.c.Create(ctx, d) }); err != nil {
		return fmt.Errorf("creating %s: %w", k, err)
	}
	for r := 2; r <= b.o.revisions+1; r++ {
		// A revision the Deployment controller has not seen would be folded
		// into the next one: one ReplicaSet fewer.
		if err := b.waitObserved(ctx, k); err != nil {
			return err
		}
		if r > b.o.revisions {
			return nil
		}
		// An image and an env var change, as a release makes.
		patch := []byte(fmt.Sprintf(`{"spec":{"template":{"spec":{"containers":[{"name":"c0","image":"registry.example.com/bench/c0:1.%d.0","env":[{"name":"RELEASE","value":"%d"}]}]}}}}`, r, r))
		if err := retry(ctx, func() error {
			return b.c.Patch(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: k.Namespace, Name: k.Name}}, client.RawPatch(types.StrategicMergePatchType, patch))
		}); err != nil {
			return fmt.Errorf("revision %d of %s: %w", r, k, err)
		}
	}
	return nil
}

// waitObserved waits until the Deployment controller has synced the
// Deployment's current generation (and so created its newRS).
func (b *bench) waitObserved(ctx context.Context, k client.ObjectKey) error {
	return wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		d := &appsv1.Deployment{}
		if err := b.c.Get(ctx, k, d); err != nil {
			return false, nil
		}
		return d.Status.ObservedGeneration >= d.Generation, nil
	})
}

// retry retries a write the API server throttled or timed out.
func retry(ctx context.Context, f func() error) error {
	var err error
	for attempt := range 5 {
		if err = f(); err == nil || ctx.Err() != nil {
			return err
		}
		if !strings.Contains(err.Error(), "timeout") && !strings.Contains(err.Error(), "TooManyRequests") && !strings.Contains(err.Error(), "connection") {
			return err
		}
		time.Sleep(time.Duration(attempt+1) * 200 * time.Millisecond)
	}
	return err
}

// count counts the objects of a list kind in every namespace, metadata only.
func (b *bench) count(ctx context.Context, gv string, listKind string, opts ...client.ListOption) (int, error) {
	l := &metav1.PartialObjectMetadataList{}
	l.APIVersion, l.Kind = gv, listKind
	if err := b.c.List(ctx, l, opts...); err != nil {
		return 0, err
	}
	return len(l.Items), nil
}
