package main

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
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	nativeconfig "github.com/deployguard/deployguard/config/native"
	guardwebhook "github.com/deployguard/deployguard/webhook"
	"github.com/deployguard/deployguard/webhook/native"
	"github.com/deployguard/deployguard/webhook/review"
)

// setupNative writes the native policies' params from the config file and
// decides who evaluates the refusals: the API server when it enforces them
// as this guard would, otherwise the webhook too, so that they are never
// left unchecked. A policy file that does not compile stops the guard here,
// not at its first admission.
func setupNative(ctx context.Context, mgr ctrl.Manager, namespace string, opts *review.Options, every time.Duration) error {
	if _, err := native.Load(); err != nil {
		return fmt.Errorf("the native policies: %w", err)
	}
	log := ctrl.Log.WithName("native")
	// Written even when the config says they are not installed: an install
	// that has them anyway must not refuse with another file's params.
	if err := guardwebhook.ApplyNativeParams(ctx, mgr.GetClient(), namespace, opts); err != nil {
		log.Error(err, "the native policies' params could not be written")
	}
	if !opts.NativeInAPIServer {
		log.Info("nativePolicies.installed is false: the webhook evaluates the refusals")
	} else {
		opts.Native = review.NewNativeEnforcement(false)
		gauge, err := registeredGauge("deployguard_native_policies_enforced",
			"1 when kube-apiserver enforces deployguard's native refusals (config/native) as this replica would; 0 when it does not "+
				"(missing, edited, other params, or not readable), so that this replica's webhook evaluates them itself and, with the guard down, "+
				"nobody does. Checked every --native-check-period; absent when nativePolicies.installed is false.")
		if err != nil {
			return err
		}
		opts.Native.OnChange(func(on bool) {
			if on {
				gauge.Set(1)
			} else {
				gauge.Set(0)
			}
		})
		conclusive, err := registeredGauge("deployguard_native_probe_conclusive",
			"1 when this replica's last floor probe (a dry-run create that deployguard-refusals refuses) told whether kube-apiserver "+
				"enforces the native refusals; 0 when it could not tell (RBAC, nativePolicies.probeNamespace, a webhook or policy answering "+
				"first), and the replica keeps its last conclusive finding. Absent when nativePolicies.installed is false.")
		if err != nil {
			return err
		}
		nc := &nativeChecker{r: mgr.GetAPIReader(), w: mgr.GetClient(), namespace: namespace, opts: opts, log: log, conclusive: conclusive}
		nc.check(ctx, true)
		if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
			nc.keepChecking(ctx, every)
			return nil
		})); err != nil {
			return err
		}
	}
	switch ok, why, err := guardwebhook.NativeSelectorRepairInstalled(ctx, mgr.GetAPIReader(), namespace); {
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
	return nil
}

// nativeChecker finds out whether the API server enforces the native
// refusals as this guard would, and records it in opts.Native.
type nativeChecker struct {
	r         client.Reader
	w         client.Client
	namespace string
	opts      *review.Options
	log       logr.Logger
	erring    bool // the last check could not tell
	// lastProbe is the last conclusive verdict of the floor probe, and
	// probeMute says an inconclusive one was logged since.
	lastProbe  guardwebhook.ProbeVerdict
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

// keepChecking re-checks every period (four GETs and a dry-run create)
// while the guard runs, so that a policy or binding deleted or edited after
// the start, or one the API server stopped enforcing, makes the
// webhook evaluate the refusals itself (and the leader route them to the
// failing-closed entry), and an install completed after the start lets the
// API server have them again.
func (n *nativeChecker) keepChecking(ctx context.Context, every time.Duration) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
		n.check(ctx, false)
	}
}

// check records one finding and says so at start and whenever it changes.
// A check that cannot tell keeps the last finding (at start: the webhook
// evaluates the refusals, which is only slower): a blip of the API server
// must not route every write to the failing-closed entry.
func (n *nativeChecker) check(ctx context.Context, startup bool) {
	ok, why, err := guardwebhook.NativePoliciesEnforced(ctx, n.r, n.namespace, n.opts)
	rewritten := false
	if err == nil && !ok && !startup && n.paramsDeleted(ctx) {
		if werr := guardwebhook.ApplyNativeParams(ctx, n.w, n.namespace, n.opts); werr != nil {
			n.log.Error(werr, "the native policies' params were deleted and could not be written again")
		} else {
			n.log.Info("the native policies' params were deleted: written again from the config file", "reason", "NativeParamsRewritten")
			ok, why, err = guardwebhook.NativePoliciesEnforced(ctx, n.r, n.namespace, n.opts)
			rewritten = true
		}
	}
	switch {
	case err == nil && ok && rewritten:
		// kube-apiserver reads the new params a moment later, and its
		// policy allows everything meanwhile: the next check probes.
		ok, _ = guardwebhook.FloorEnforced(guardwebhook.ProbeUnknown, n.lastProbe)
	case err == nil && ok:
		ok, why = n.probe(ctx, startup)
	case err == nil:
		// Objects missing or changed: when they are back (the very change
		// that trips kubernetes/kubernetes#130887), the API server must
		// prove it enforces them before it has the refusals again.
		n.lastProbe = guardwebhook.ProbeNotEnforced
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
// refusals: they can all be in place while it does not (see
// guardwebhook.FloorProbe). A probe that finds them not enforced where the
// last did not is tried again for probeSettle, for the API server reads a
// policy's params a moment after they are written. Having found them not
// enforced, it needs FloorProbeConfirmations probes in a row to find them
// enforced again. A probe that cannot tell (RBAC without create in the
// probe namespace, another webhook refusing first) keeps the last
// conclusive verdict, or the objects' finding when there is none, says so
// once, and sets the conclusive gauge to 0.
func (n *nativeChecker) probe(parent context.Context, startup bool) (bool, string) {
	ctx, cancel := context.WithTimeout(parent, probeTimeout)
	defer cancel()
	tries := 1
	if n.lastProbe == guardwebhook.ProbeNotEnforced {
		tries = guardwebhook.FloorProbeConfirmations
	}
	v, why := guardwebhook.ProbeUnknown, ""
	for range tries {
		if v, why = guardwebhook.NativeFloorProbe(ctx, n.r, n.w, n.opts); v != guardwebhook.ProbeEnforced {
			break
		}
	}
	if v == guardwebhook.ProbeNotEnforced && n.lastProbe != guardwebhook.ProbeNotEnforced {
		_ = wait.PollUntilContextTimeout(ctx, probeSettle/10, probeSettle, false, func(ctx context.Context) (bool, error) {
			if again, _ := guardwebhook.NativeFloorProbe(ctx, n.r, n.w, n.opts); again == guardwebhook.ProbeEnforced {
				v = again
			}
			return v == guardwebhook.ProbeEnforced, nil
		})
	}
	if n.conclusive != nil {
		n.conclusive.Set(map[bool]float64{true: 1, false: 0}[v != guardwebhook.ProbeUnknown])
	}
	enforced, conclusive := guardwebhook.FloorEnforced(v, n.lastProbe)
	switch {
	case v != guardwebhook.ProbeUnknown:
		n.probeMute = false
		if v == guardwebhook.ProbeEnforced && why != "" {
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
func (n *nativeChecker) paramsDeleted(ctx context.Context) bool {
	err := n.r.Get(ctx, client.ObjectKey{Namespace: n.namespace, Name: nativeconfig.ParamsName}, &corev1.ConfigMap{})
	if !apierrors.IsNotFound(err) {
		return false
	}
	bound, _, err := guardwebhook.NativeRefusalsBound(ctx, n.r, n.namespace)
	return err == nil && bound
}

// registeredGauge is a gauge registered with the manager's metrics.
func registeredGauge(name, help string) (prometheus.Gauge, error) {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
	return g, metrics.Registry.Register(g)
}
