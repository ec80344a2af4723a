package main

import (
	"context"
	"errors"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/deployguard/deployguard/policy"
	guardwebhook "github.com/deployguard/deployguard/webhook"
	"github.com/deployguard/deployguard/webhook/review"
)

// routeEvery is how often the leader checks the validating webhook's routing
// when nothing changed: an apply of the static manifests puts the default
// routing back, which is wrong for an install that enforces more.
const routeEvery = time.Minute

// setupRouting keeps, in each leader term, the validating webhook's
// Deployment entries routed by what the guard enforces (webhook/routing.go):
// once the policy ConfigMaps are loaded (before, an enforce-mode policy among
// them would be routed away), then whenever the active policy set changes or
// the API server starts or stops enforcing the native refusals, and every
// routeEvery. One replica writes, so that replicas of two versions
// in a rolling upgrade do not take turns.
func setupRouting(leader *leaderTerms, name string, opts *review.Options, eng *policy.Engine, loaded func() bool) {
	leader.setup = append(leader.setup, func(_ context.Context, lm ctrl.Manager) error {
		rw := uncached(lm)
		return lm.Add(manager.RunnableFunc(func(ctx context.Context) error {
			if err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(context.Context) (bool, error) { return loaded(), nil }); err != nil {
				return nil // the term ended first
			}
			keepRouting(ctx, rw, name, opts, eng)
			return nil
		}))
	})
}

func keepRouting(ctx context.Context, rw guardwebhook.ReadWriter, name string, opts *review.Options, eng *policy.Engine) {
	log := ctrl.Log.WithName("routing")
	told := "" // the last state logged, so that a lasting one is said once
	say := func(state string, f func()) {
		if state != told {
			f()
			told = state
		}
	}
	retry := 5 * time.Second
	for {
		// Before reading what they say: no change is missed.
		changed := eng.Changed()
		var nativeChanged <-chan struct{} // nil: never
		if opts.Native != nil {
			nativeChanged = opts.Native.Changed()
		}
		e := guardwebhook.EnforcedOf(opts, loadedPolicies(eng.Active()))
		wrote, err := guardwebhook.Route(ctx, rw, name, e)
		next := routeEvery
		switch {
		case ctx.Err() != nil:
			return
		case apierrors.IsNotFound(err):
			// Not installed (or being uninstalled): nothing to route.
			say("not found", func() {
				log.Info("The validating webhook configuration is not installed: nothing to route", "validatingWebhookConfiguration", name)
			})
		case errors.Is(err, guardwebhook.ErrNotSplit):
			say("not split", func() {
				log.Info("The validating webhook is not routed by what the guard enforces: install this release's webhook configuration",
					"validatingWebhookConfiguration", name, "why", err.Error(), "reason", "WebhookNotSplit")
			})
		case err != nil:
			say("error: "+err.Error(), func() {
				log.Error(err, "Could not route the validating webhook; trying again", "validatingWebhookConfiguration", name)
			})
			next, retry = retry, min(2*retry, routeEvery)
		case wrote:
			told = ""
			log.Info("Validating webhook routed: with the guard down, these requests are refused and the others admitted",
				"validatingWebhookConfiguration", name, "webhook", guardwebhook.EnforceWebhook,
				"operations", guardwebhook.EnforceOperations(e), "objectSelector", selectorString(guardwebhook.EnforceObjectSelector(e)), "condition", guardwebhook.MustDecide(e),
				"advisedCreates", guardwebhook.MayAdviseCreate(e), "advised", guardwebhook.MayAdvise(e), "reason", "WebhookRouted")
		default:
			told = ""
		}
		if err == nil {
			retry = 5 * time.Second
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-nativeChanged:
		case <-time.After(next):
		}
	}
}

// loadedPolicies is what the routing needs to know of the set s: whether a
// policy is enforced, whether one reads beyond the spec, and whether an
// enforced one judges deletions.
func loadedPolicies(s policy.Set) guardwebhook.LoadedPolicies {
	return guardwebhook.LoadedPoliciesOf(s)
}

// uncached reads from the API server and writes through lm: routing never
// starts a write from a stale copy.
func uncached(lm ctrl.Manager) guardwebhook.ReadWriter {
	return struct {
		client.Reader
		client.Writer
	}{lm.GetAPIReader(), lm.GetClient()}
}

// selectorString is an objectSelector as kubectl writes it; every object
// for none.
func selectorString(s *metav1.LabelSelector) string {
	if s == nil {
		return "every object"
	}
	return metav1.FormatLabelSelector(s)
}

// setupMutatingRouting keeps, in each leader term, the mutating webhook's
// entry for Deployments routed by whether the API server labels the creates
// it has something to do for (guardwebhook.CreatesLabelled): at the start
// of the term, whenever the API server starts or stops enforcing the native
// policies, and every routeEvery (deployguard-selector replaced by hand is
// found then).
func setupMutatingRouting(leader *leaderTerms, name, namespace string, opts *review.Options, changesEvery bool) {
	leader.setup = append(leader.setup, func(_ context.Context, lm ctrl.Manager) error {
		rw := uncached(lm)
		return lm.Add(manager.RunnableFunc(func(ctx context.Context) error {
			keepRoutingMutating(ctx, rw, name, namespace, opts, changesEvery)
			return nil
		}))
	})
}

func keepRoutingMutating(ctx context.Context, rw guardwebhook.ReadWriter, name, namespace string, opts *review.Options, changesEvery bool) {
	log := ctrl.Log.WithName("routing")
	told := "" // the last failure logged, so that a lasting one is said once
	retry := 5 * time.Second
	for {
		next := routeEvery
		var nativeChanged <-chan struct{} // nil: never
		if opts.Native != nil {
			nativeChanged = opts.Native.Changed()
		}
		installed, why, err := guardwebhook.NativeSelectorRepairInstalled(ctx, rw, namespace)
		labelled := false
		if err == nil {
			labelled = guardwebhook.CreatesLabelled(installed, opts.NativeEnforced(), changesEvery)
			var wrote bool
			if wrote, err = guardwebhook.RouteMutating(ctx, rw, name, labelled); wrote {
				log.Info("Mutating webhook routed", "mutatingWebhookConfiguration", name, "webhook", guardwebhook.DefaultWebhook,
					"operations", guardwebhook.DefaultOperations(labelled), "createsLabelled", labelled, "why", why, "reason", "MutatingWebhookRouted")
			}
		}
		switch {
		case ctx.Err() != nil:
			return
		case apierrors.IsNotFound(err):
			// Not installed (or being uninstalled): nothing to route.
		case err != nil:
			// A conflict with the CA injection at the start of a term,
			// say: soon again, then less often.
			if err.Error() != told {
				log.Error(err, "Could not route the mutating webhook; trying again", "mutatingWebhookConfiguration", name)
				told = err.Error()
			}
			next, retry = retry, min(2*retry, routeEvery)
		default:
			told = ""
			retry = 5 * time.Second
		}
		select {
		case <-ctx.Done():
			return
		case <-nativeChanged:
		case <-time.After(next):
		}
	}
}
