// Package floor keeps the native floor in place and finds out whether it
// holds: it writes the params ConfigMap the guard's native policies read
// from the config file (ApplyParams), tells from the installed objects
// (PoliciesEnforced, SelectorRepairInstalled) and from the API server's own
// answer to a probe (Probe) whether kube-apiserver enforces the refusals as
// this guard would, and records that in the review's options, so that the
// webhook evaluates the refusals itself whenever the API server does not
// (Checker, on every replica).
package floor

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/wait"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nativeconfig "github.com/deployguard/deployguard/config/native"
	"github.com/deployguard/deployguard/reconciler/collectors"
	"github.com/deployguard/deployguard/webhook/native"
	"github.com/deployguard/deployguard/webhook/review"
)

// Options are the floor's settings.
type Options struct {
	// Namespace is the guard's own, where the params ConfigMap is.
	Namespace string
	// Review is what the guard enforces: the params are written from it,
	// and Setup sets its Native when the config says the API server has the
	// native policies (NativeInAPIServer).
	Review *review.Options
	// Every is how often a replica checks again (--native-check-period).
	Every time.Duration
	// Metrics registers the Checker's gauges.
	Metrics prometheus.Registerer
}

// Setup writes the native policies' params from the config file and
// decides who evaluates the refusals: the API server when it enforces them
// as this guard would, otherwise the webhook too, so that they are never
// left unchecked. It returns the Checker that keeps deciding, nil when the
// config says the policies are not installed. A policy file that does not
// compile stops the guard here, not at its first admission. r reads
// uncached (the caches have not started); w writes.
func Setup(ctx context.Context, r client.Reader, w client.Client, o Options) (*Checker, error) {
	if _, err := native.Load(); err != nil {
		return nil, fmt.Errorf("the native policies: %w", err)
	}
	log := ctrl.LoggerFrom(ctx).WithName("native")
	opts := o.Review
	// Written even when the config says they are not installed: an install
	// that has them anyway must not refuse with another file's params.
	if err := ApplyParams(ctx, w, o.Namespace, opts); err != nil {
		log.Error(err, "the native policies' params could not be written")
	}
	var checker *Checker
	if !opts.NativeInAPIServer {
		log.Info("nativePolicies.installed is false: the webhook evaluates the refusals")
	} else {
		opts.Native = review.NewNativeEnforcement(false)
		metrics := collectors.NewRegistration(o.Metrics, "native floor metrics")
		enforced := metrics.Gauge("deployguard_native_policies_enforced",
			"1 when kube-apiserver enforces deployguard's native refusals (config/native) as this replica would; 0 when it does not "+
				"(missing, edited, other params, or not readable), so that this replica's webhook evaluates them itself and, with the guard down, "+
				"nobody does. Checked every --native-check-period; absent when nativePolicies.installed is false.")
		conclusive := metrics.Gauge("deployguard_native_probe_conclusive",
			"1 when this replica's last floor probe (a dry-run create that deployguard-refusals refuses) told whether kube-apiserver "+
				"enforces the native refusals; 0 when it could not tell (RBAC, nativePolicies.probeNamespace, a webhook or policy answering "+
				"first), and the replica keeps its last conclusive finding. Absent when nativePolicies.installed is false.")
		if err := metrics.Err(); err != nil {
			return nil, err
		}
		opts.Native.OnChange(func(on bool) {
			if on {
				enforced.Set(1)
			} else {
				enforced.Set(0)
			}
		})
		checker = &Checker{r: r, w: w, namespace: o.Namespace, opts: opts, every: o.Every, log: log, conclusive: conclusive}
		checker.check(ctx, true)
	}
	switch ok, why, err := SelectorRepairInstalled(ctx, r, o.Namespace); {
	case err != nil:
		log.Error(err, "cannot tell whether the API server repairs empty selectors")
	case !ok && opts.NativeEnforced():
		log.Info("the API server does not repair empty selectors as this guard would: the webhook repairs them, but only while it is up; "+
			"with the guard down an empty selector is refused in the API server's words", "why", why, "reason", "SelectorRepairNotNative")
	case ok && !opts.NativeEnforced():
		// The repair marks an unrepairable selector for the refusals to
		// refuse: without them, that marker is admitted while the guard is
		// down. With the guard up, its webhook refuses it.
		log.Error(nil, "MutatingAdmissionPolicy "+native.Selector+" is installed but the API server does not enforce "+native.Refusals+
			": while the guard is down, a Deployment whose empty selector cannot be repaired is admitted selecting "+
			native.LabelEmptySelector+"="+native.EmptySelectorRefused+"; install config/native whole, or remove "+native.Selector+
			" (and then restart kube-apiserver: kubernetes/kubernetes#130887)",
			"reason", "SelectorRepairWithoutRefusals")
	}
	return checker, nil
}

// Checker finds out, every period, whether the API server enforces the
// native refusals as this guard would, and records it in the review's
// options. It runs on every replica (the process's manager elects no
// leader): each replica's webhook decides for itself whether it evaluates
// the refusals.
type Checker struct {
	r         client.Reader
	w         client.Client
	namespace string
	opts      *review.Options
	every     time.Duration
	log       logr.Logger
	erring    bool // the last check could not tell
	// lastProbe is the last conclusive verdict of the floor probe, and
	// probeMute says an inconclusive one was logged since.
	lastProbe  ProbeVerdict
	probeMute  bool
	conclusive prometheus.Gauge // whether the last probe could tell
}

// probeTimeout bounds one check's probes: a hung call must not stop the
// checks for good.
const probeTimeout = 20 * time.Second

// probeSettle is how long a probe that newly finds the refusals not
// enforced is tried again: the API server reads params written a moment
// ago (at the guard's start, or after they were deleted) a moment later.
const probeSettle = 3 * time.Second

// Start re-checks every period (four GETs and a dry-run create) while the
// guard runs, so that a policy or binding deleted or edited after the
// start, or one the API server stopped enforcing, makes the webhook
// evaluate the refusals itself (and the leader route them to the
// failing-closed entry), and an install completed after the start lets the
// API server have them again.
func (n *Checker) Start(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(n.every):
		}
		n.check(ctx, false)
	}
}

// check records one finding and says so at start and whenever it changes.
// A check that cannot tell keeps the last finding (at start: the webhook
// evaluates the refusals, which is only slower): a blip of the API server
// must not route every write to the failing-closed entry.
func (n *Checker) check(ctx context.Context, startup bool) {
	ok, why, err := PoliciesEnforced(ctx, n.r, n.namespace, n.opts)
	rewritten := false
	if err == nil && !ok && !startup && n.paramsDeleted(ctx) {
		if werr := ApplyParams(ctx, n.w, n.namespace, n.opts); werr != nil {
			n.log.Error(werr, "the native policies' params were deleted and could not be written again")
		} else {
			n.log.Info("the native policies' params were deleted: written again from the config file", "reason", "NativeParamsRewritten")
			ok, why, err = PoliciesEnforced(ctx, n.r, n.namespace, n.opts)
			rewritten = true
		}
	}
	switch {
	case err == nil && ok && rewritten:
		// kube-apiserver reads the new params a moment later, and its
		// policy allows everything meanwhile: the next check probes.
		ok, _ = Enforced(ProbeUnknown, n.lastProbe)
	case err == nil && ok:
		ok, why = n.probe(ctx, startup)
	case err == nil:
		// Objects missing or changed: when they are back (the very change
		// that trips kubernetes/kubernetes#130887), the API server must
		// prove it enforces them before it has the refusals again.
		n.lastProbe = ProbeNotEnforced
	}
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		if !startup {
			if !n.erring {
				n.log.Error(err, "cannot tell whether the API server enforces the native policies: keeping the last finding",
					"enforced", n.opts.Native.Enforced())
			}
			n.erring = true
			return
		}
		ok, why = false, "cannot tell: "+err.Error()
	}
	n.erring = false
	changed := n.opts.Native.Set(ok)
	switch {
	case ok && (changed || startup):
		n.log.Info("the API server enforces the native policies as this guard would: the webhook leaves the refusals to it",
			"reason", "NativePoliciesEnforced")
	case !ok && changed:
		// They were enforced: until this check, nobody refused what they
		// refuse.
		n.log.Error(nil, "the API server no longer enforces the native policies as this guard would: the webhook evaluates the refusals again",
			"why", why, "reason", "NativePoliciesNotEnforced")
	case !ok && startup:
		n.log.Info("the API server does not enforce the native policies as this guard would: the webhook evaluates the refusals",
			"why", why, "reason", "NativePoliciesNotEnforced")
	}
}

// probe asks the API server itself, once the objects say it enforces the
// refusals: they can all be in place while it does not (see Probe). A
// probe that finds them not enforced where the last did not is tried again
// for probeSettle, for the API server reads a policy's params a moment
// after they are written. Having found them not enforced, it needs
// ProbeConfirmations probes in a row to find them enforced again. A probe
// that cannot tell (RBAC without create in the probe namespace, another
// webhook refusing first) keeps the last conclusive verdict, or the
// objects' finding when there is none, says so once, and sets the
// conclusive gauge to 0.
func (n *Checker) probe(parent context.Context, startup bool) (bool, string) {
	ctx, cancel := context.WithTimeout(parent, probeTimeout)
	defer cancel()
	tries := 1
	if n.lastProbe == ProbeNotEnforced {
		tries = ProbeConfirmations
	}
	v, why := ProbeUnknown, ""
	for range tries {
		if v, why = Probe(ctx, n.r, n.w, n.opts); v != ProbeEnforced {
			break
		}
	}
	if v == ProbeNotEnforced && n.lastProbe != ProbeNotEnforced {
		_ = wait.PollUntilContextTimeout(ctx, probeSettle/10, probeSettle, false, func(ctx context.Context) (bool, error) {
			if again, _ := Probe(ctx, n.r, n.w, n.opts); again == ProbeEnforced {
				v = again
			}
			return v == ProbeEnforced, nil
		})
	}
	if n.conclusive != nil {
		n.conclusive.Set(map[bool]float64{true: 1, false: 0}[v != ProbeUnknown])
	}
	enforced, conclusive := Enforced(v, n.lastProbe)
	switch {
	case v != ProbeUnknown:
		n.probeMute = false
		if v == ProbeEnforced && why != "" {
			n.log.V(1).Info("the API server enforces the native refusals", "note", why)
		}
	case !n.probeMute && parent.Err() == nil:
		n.log.Info("cannot confirm by a dry run whether the API server enforces the native policies: keeping the last finding",
			"why", why, "enforced", enforced, "reason", "NativeProbeInconclusive")
		// At start the guard's own webhook is not serving yet: a later
		// probe may tell, and its failure must be said too.
		n.probeMute = !startup
	}
	n.lastProbe = conclusive
	if enforced {
		return true, ""
	}
	return false, why + ". If the refusals' binding or params were deleted and written again since kube-apiserver started, " +
		"kube-apiserver may no longer read the params (kubernetes/kubernetes#130887): restart kube-apiserver"
}

// paramsDeleted reports whether the params ConfigMap is gone from under
// this release's bound policy, which then allows everything: it is written
// again from the config file, the one place it is set. Not when the policy
// is gone too (an uninstall in progress is not undone), nor when the params
// only differ: during a rolling change of the config, replicas of the old and
// the new config would take turns, and the replicas whose config they do not
// match evaluate the refusals themselves meanwhile.
func (n *Checker) paramsDeleted(ctx context.Context) bool {
	err := n.r.Get(ctx, client.ObjectKey{Namespace: n.namespace, Name: nativeconfig.ParamsName}, &corev1.ConfigMap{})
	if !apierrors.IsNotFound(err) {
		return false
	}
	bound, _, err := RefusalsBound(ctx, n.r, n.namespace)
	return err == nil && bound
}
