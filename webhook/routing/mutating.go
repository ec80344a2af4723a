package routing

import (
	"context"
	"fmt"
	"slices"

	"github.com/go-logr/logr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The mutating webhook for Deployments is two entries of one configuration
// that call the same handler:
//
//   - DefaultWebhook takes the UPDATEs the guard may change (its
//     matchCondition guard-may-change-it) and, unless the API server labels
//     them for the other entry, the CREATEs too.
//   - DefaultCreateWebhook takes the CREATEs labelled native.LabelDefaulting:
//     the MutatingAdmissionPolicy deployguard-selector labels those the guard
//     has something to do for, so that an ordinary create costs the API
//     server no evaluation of DefaultWebhook's condition (on 1.36, a
//     conversion of the whole object). Its objectSelector costs nothing.
//
// Whether the API server labels them depends on the policy installed and on
// the configuration, so the guard's leader writes DefaultWebhook's
// operations (RouteMutating).
const (
	DefaultWebhook       = "default.deployments.deployguard.io"
	DefaultCreateWebhook = "default-create.deployments.deployguard.io"
)

// CreatesLabelled says whether the API server labels, for
// DefaultCreateWebhook, every create the guard's mutating webhook has
// something to do for: deployguard-selector is this release's and reads the
// params (selectorInstalled), the params are the guard's (paramsCurrent:
// without them the policy does nothing), and the configuration changes no
// Deployment but those (a configuration that changes every Deployment,
// changesEvery, needs every create).
func CreatesLabelled(selectorInstalled, paramsCurrent, changesEvery bool) bool {
	return selectorInstalled && paramsCurrent && !changesEvery
}

// DefaultOperations are the operations of DefaultWebhook's rules: UPDATE
// alone when the creates it would take come labelled to DefaultCreateWebhook.
func DefaultOperations(labelled bool) []admissionregistrationv1.OperationType {
	if labelled {
		return []admissionregistrationv1.OperationType{admissionregistrationv1.Update}
	}
	return []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update}
}

// RouteMutating writes DefaultWebhook's operations into the mutating
// webhook configuration name, for creates labelled or not, when they
// differ, and reports whether it wrote. A configuration without
// DefaultCreateWebhook (an earlier release's) is left as it is: there
// DefaultWebhook takes every create. The read goes to the API server.
func RouteMutating(ctx context.Context, c ReadWriter, name string, labelled bool) (bool, error) {
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{}
	if err := c.Get(ctx, client.ObjectKey{Name: name}, mwc); err != nil {
		return false, fmt.Errorf("reading MutatingWebhookConfiguration %s: %w", name, err)
	}
	has := func(name string) int {
		return slices.IndexFunc(mwc.Webhooks, func(w admissionregistrationv1.MutatingWebhook) bool { return w.Name == name })
	}
	i := has(DefaultWebhook)
	if i < 0 || has(DefaultCreateWebhook) < 0 {
		return false, nil
	}
	before := mwc.DeepCopy()
	ops := DefaultOperations(labelled)
	changed := false
	for j := range mwc.Webhooks[i].Rules {
		if r := &mwc.Webhooks[i].Rules[j]; !slices.Equal(r.Operations, ops) {
			r.Operations = slices.Clone(ops)
			changed = true
		}
	}
	if !changed {
		return false, nil
	}
	if err := c.Patch(ctx, mwc, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		return false, fmt.Errorf("routing MutatingWebhookConfiguration %s: %w", name, err)
	}
	return true, nil
}

// mayChangeCondition is the matchCondition of config/webhook that spares
// DefaultWebhook the Deployments the default configuration never changes.
const mayChangeCondition = "guard-may-change-it"

// CheckMutatingScope says, through log, when the installed mutating webhook
// configuration name does not send the guard every Deployment: to be called
// once at start when the configuration changes every Deployment, whose
// defaults (or cleanup steps) would then not be applied on the way in. The
// reconciler still brings every Deployment's cleanup finalizers in line;
// the platform defaults have no such safety net.
func CheckMutatingScope(ctx context.Context, r client.Reader, name string, log logr.Logger) {
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{}
	if err := r.Get(ctx, client.ObjectKey{Name: name}, mwc); err != nil {
		log.Info("Could not read the mutating webhook configuration to check which Deployments it sends", "name", name, "error", err.Error())
		return
	}
	for _, wh := range mwc.Webhooks {
		for _, mc := range wh.MatchConditions {
			if mc.Name == mayChangeCondition {
				log.Error(nil, "The configuration sets defaults or cleanup steps for every Deployment, but the mutating webhook configuration only sends the guard Deployments the default configuration changes: remove its matchCondition "+mayChangeCondition+" (config/webhook, or the Helm value) so that they are applied",
					"mutatingWebhookConfiguration", name, "webhook", wh.Name, "reason", "MutatingScopeTooNarrow")
				return
			}
		}
	}
}
