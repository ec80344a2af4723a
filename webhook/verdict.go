package webhook

import (
	"context"
	"fmt"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
)

// VerdictPath is where the status webhook is served; config/webhook uses the
// same.
const VerdictPath = "/mutate-apps-v1-deployment-status"

// verdict serves the mutating webhook of Deployment status writes. It ends
// the guard's rollback verdict (the Stalled condition) inside the write that
// records a new spec as observed, when that spec ends it (rollout.DecideVerdict,
// the reconciler's own decision), so that no client ever
// reads the new generation as observed with the old verdict on it. The
// reconciler ends it too, after the Deployment controller has recorded the
// newRS; this write is the one the controller makes right after, and a
// reconciler a moment late lost it to the controller: Helm 4 then aborted
// the deploy of a fix as failed.
//
// The API server sends it only the status writes of Deployments labelled
// vocab.LabelRolledBack (the entry's objectSelector, which costs it no
// conversion), and of those only the writes rollout.VerdictDue names (the entry's
// matchCondition): a few per rollback. It decides from the request alone
// (the ledger in the status names the restored template), and calls nothing:
// whoever reaches the webhook port, no request makes the guard read from the
// API server. It never refuses: a status write it cannot decide goes through
// unchanged, and the reconciler decides later.
type verdict struct{}

func (v verdict) handle(ctx context.Context, req admission.Request) (admission.Response, string) {
	if req.Operation != admissionv1.Update || req.SubResource != "status" {
		return admission.Allowed(""), reasonNone
	}
	r, _, resp, reason := decodeRequest(req)
	if r.Object == nil {
		return resp, reason
	}
	if r.Object.ResourceVersion != "" && r.Object.ResourceVersion != r.OldObject.ResourceVersion {
		// The write will conflict; the API server admits its retry again.
		return admission.Allowed(""), reasonNone
	}
	// A status write stores the status and the annotations it carries, and
	// leaves the rest as stored: the verdict is decided on that, whatever
	// copy of the spec, generation or identity the writer sent.
	d := *r.OldObject
	d.Status, d.Annotations = r.Object.Status, r.Object.Annotations
	selfContained, due := rollout.VerdictDue(r.OldObject, &d)
	if !due {
		return admission.Allowed(""), reasonNone
	}
	log := ctrl.LoggerFrom(ctx).WithValues("deployment", klog.KObj(&d), "user", req.UserInfo.Username)
	if !selfContained {
		// A rollback adopted from an earlier release names only the restored
		// ReplicaSet: the reconciler decides it. The webhook reads nothing
		// from the API server on any caller's word.
		return admission.Allowed(""), reasonNone
	}
	var rss []*appsv1.ReplicaSet
	decided := rollout.DecideVerdict(&d, rss)
	if decided.Stalled {
		return admission.Allowed(""), reasonNone
	}
	if !r.DryRun {
		log.Info("Rollback no longer reported, in the write that observes the new generation", "why", decided.Why,
			"generation", d.Generation, "failedRevision", d.Labels[vocab.LabelRolledBack])
	}
	// The index is into the very list the API server patches: the
	// request's object, decoded from the same bytes.
	return admission.Patched("", jsonpatch.NewOperation("remove", fmt.Sprintf("/status/conditions/%d", rollout.StalledIndex(&d.Status)), nil)), reasonNone
}
