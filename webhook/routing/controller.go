package routing

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
	"github.com/deployguard/deployguard/webhook/review"
)

// routeEvery is how often the leader checks the webhooks' routing when
// nothing changed: an apply of the static manifests puts the default routing
// back, which is wrong for an install that enforces more.
const routeEvery = time.Minute

// firstRetry is the wait after a failed write; it doubles up to routeEvery.
const firstRetry = 5 * time.Second

// leaderOnly makes a loop run in a leader term only: one replica writes, so
// that replicas of two versions in a rolling upgrade do not take turns.
type leaderOnly struct{}

var _ manager.LeaderElectionRunnable = leaderOnly{}

// NeedLeaderElection: one replica writes.
func (leaderOnly) NeedLeaderElection() bool { return true }

// ValidatingOptions are what the validating webhook's routing follows.
type ValidatingOptions struct {
	// Name is the guard's ValidatingWebhookConfiguration.
	Name string
	// Review is what the guard enforces; its Native says whether the API
	// server enforces the native refusals.
	Review *review.Options
	// Policies are the loaded Rego policies, and Loaded reports whether the
	// policy ConfigMaps are in them yet.
	Policies *policy.Engine
	Loaded   func() bool
}

// Validating keeps the validating webhook's Deployment entries routed by
// what the guard enforces (Route): once the policy ConfigMaps are loaded
// (before, an enforce-mode policy among them would be routed away), then
// whenever the active policy set changes or the API server starts or stops
// enforcing the native refusals, and every routeEvery.
type Validating struct {
	leaderOnly
	// Client reads from the API server (uncached) and writes: routing
	// never starts a write from a stale copy.
	Client  ReadWriter
	Options ValidatingOptions
}

// Start routes until ctx ends (the leader term, or the process).
func (v *Validating) Start(ctx context.Context) error {
	if err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(context.Context) (bool, error) { return v.Options.Loaded(), nil }); err != nil {
		return nil // the term ended first
	}
	v.keepRouting(ctx)
	return nil
}

func (v *Validating) keepRouting(ctx context.Context) {
	log := ctrl.LoggerFrom(ctx).WithName("routing")
	name, opts, eng := v.Options.Name, v.Options.Review, v.Options.Policies
	told := "" // the last state logged, so that a lasting one is said once
	say := func(state string, f func()) {
		if state != told {
			f()
			told = state
		}
	}
	retry := firstRetry
	for {
		// Before reading what they say: no change is missed.
		changed := eng.Changed()
		var nativeChanged <-chan struct{} // nil: never
		if opts.Native != nil {
			nativeChanged = opts.Native.Changed()
		}
		e := EnforcedOf(opts, LoadedPoliciesOf(eng.Active()))
		wrote, err := Route(ctx, v.Client, name, e)
		next := routeEvery
		switch {
		case ctx.Err() != nil:
			return
		case apierrors.IsNotFound(err):
			// Not installed (or being uninstalled): nothing to route.
			say("not found", func() {
				log.Info("The validating webhook configuration is not installed: nothing to route", "validatingWebhookConfiguration", name)
			})
		case errors.Is(err, ErrNotSplit):
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
				"validatingWebhookConfiguration", name, "webhook", EnforceWebhook,
				"operations", EnforceOperations(e), "objectSelector", selectorString(EnforceObjectSelector(e)), "condition", MustDecide(e),
				"advisedCreates", MayAdviseCreate(e), "advised", MayAdvise(e), "reason", "WebhookRouted")
		default:
			told = ""
		}
		if err == nil {
			retry = firstRetry
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

// selectorString is an objectSelector as kubectl writes it; every object
// for none.
func selectorString(s *metav1.LabelSelector) string {
	if s == nil {
		return "every object"
	}
	return metav1.FormatLabelSelector(s)
}

// MutatingOptions are what the mutating webhook's routing follows.
type MutatingOptions struct {
	// Name is the guard's MutatingWebhookConfiguration, and Namespace the
	// guard's own, where the native policies' params are.
	Name, Namespace string
	// Review is what the guard enforces; its Native says whether the API
	// server enforces the native refusals.
	Review *review.Options
	// ChangesEvery: the configuration changes every Deployment, so that
	// every create must reach the guard.
	ChangesEvery bool
	// SelectorRepairInstalled reports whether the API server repairs empty
	// selectors as this guard would, reading through r (the floor's
	// SelectorRepairInstalled: the floor's probe reads this package's entry
	// names, so this package does not import it).
	SelectorRepairInstalled func(ctx context.Context, r client.Reader, namespace string) (ok bool, why string, err error)
}

// Mutating keeps the mutating webhook's entry for Deployments routed by
// whether the API server labels the creates it has something to do for
// (CreatesLabelled): at the start of the leader term, whenever the API
// server starts or stops enforcing the native policies, and every
// routeEvery (deployguard-selector replaced by hand is found then).
type Mutating struct {
	leaderOnly
	// Client reads from the API server (uncached) and writes.
	Client  ReadWriter
	Options MutatingOptions
}

// Start routes until ctx ends (the leader term, or the process).
func (m *Mutating) Start(ctx context.Context) error {
	log := ctrl.LoggerFrom(ctx).WithName("routing")
	name, opts := m.Options.Name, m.Options.Review
	told := "" // the last failure logged, so that a lasting one is said once
	retry := firstRetry
	for {
		next := routeEvery
		var nativeChanged <-chan struct{} // nil: never
		if opts.Native != nil {
			nativeChanged = opts.Native.Changed()
		}
		installed, why, err := m.Options.SelectorRepairInstalled(ctx, m.Client, m.Options.Namespace)
		labelled := false
		if err == nil {
			labelled = CreatesLabelled(installed, opts.NativeEnforced(), m.Options.ChangesEvery)
			var wrote bool
			if wrote, err = RouteMutating(ctx, m.Client, name, labelled); wrote {
				log.Info("Mutating webhook routed", "mutatingWebhookConfiguration", name, "webhook", DefaultWebhook,
					"operations", DefaultOperations(labelled), "createsLabelled", labelled, "why", why, "reason", "MutatingWebhookRouted")
			}
		}
		switch {
		case ctx.Err() != nil:
			return nil
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
			retry = firstRetry
		}
		select {
		case <-ctx.Done():
			return nil
		case <-nativeChanged:
		case <-time.After(next):
		}
	}
}
