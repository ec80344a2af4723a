package review

import (
	"context"
	"fmt"
	"slices"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/deployguard/deployguard/webhook/origin"
)

// An owner reference is a right to delete: once every owner of a Deployment
// is gone, the garbage collector deletes it, as
// system:serviceaccount:kube-system:generic-garbage-collector, which the
// webhooks exempt. So a write that adds an owner to a Deployment is judged,
// by the enforced Rego policies, as the DELETE of that Deployment by the
// same user: if they may not delete it, they may not give the garbage
// collector the means to. On a CREATE too: an enforced policy's refusal of
// the DELETE has no other net (the garbage collector's own DELETE is
// exempt), so a tenant may not create a Deployment it may not delete owned
// by something it may delete. Deletion protection holds the same way in
// the native policies (config/native, ownersAllowed), on UPDATEs only,
// since there the garbage collector's own DELETE of a protected Deployment
// is refused too.

// IsControlPlane reports whether username is one of the control plane's own
// controllers that the webhook configurations and the native policies
// exempt (config/webhook/manifests.yaml, config/native/policies.yaml): the
// controller manager's single identity, and the Deployment, namespace and
// garbage collector controllers' service accounts.
func IsControlPlane(username string) bool {
	switch username {
	case "system:kube-controller-manager",
		"system:serviceaccount:kube-system:deployment-controller",
		"system:serviceaccount:kube-system:namespace-controller",
		"system:serviceaccount:kube-system:generic-garbage-collector":
		return true
	}
	return false
}

// OwnersAdded are the owner references of d that old (nil on a CREATE:
// every owner is added) does not have: a reference counts as the same only
// if equal in uid, name, kind and apiVersion. The garbage collector looks
// an owner up by its apiVersion, kind and name, and takes one whose uid
// differs, or that is not found, as gone: a reference rewritten around a
// kept uid is an owner added.
func OwnersAdded(d, old *appsv1.Deployment) []metav1.OwnerReference {
	if d == nil {
		return nil
	}
	var added []metav1.OwnerReference
	for _, r := range d.OwnerReferences {
		if old == nil || !slices.ContainsFunc(old.OwnerReferences, func(o metav1.OwnerReference) bool { return sameOwner(o, r) }) {
			added = append(added, r)
		}
	}
	return added
}

// sameOwner: a and b name the same owner, as the garbage collector finds it
// (and as config/native's ownersAdded compares them).
func sameOwner(a, b metav1.OwnerReference) bool {
	return a.UID == b.UID && a.Name == b.Name && a.Kind == b.Kind && a.APIVersion == b.APIVersion
}

// ownersAsDeletion judges the owners that req adds to its Deployment as
// the DELETE of that Deployment by the same user, with the stage's
// policies, and adds a refusal for each policy that would refuse it. Only
// an enforced policy's denial refuses; warnings of the DELETE are not
// repeated on a write that deletes nothing. Not for the audit (Stored),
// nor for a manifest checked offline (no user), nor for the guard itself or
// the control plane (whose garbage collector removes owners, and adds
// none).
func (w *Reviewer) ownersAsDeletion(ctx context.Context, req Request, stage Stage, r *Result) {
	p := stage.With
	if p == nil {
		p = w.Policies
	}
	if !stage.Policies || p == nil || stage.Stored || r.Exempt != "" || req.UserInfo.Username == "" ||
		w.Options.isGuard(req.UserInfo) || IsControlPlane(req.UserInfo.Username) {
		return
	}
	added := OwnersAdded(req.Object, req.OldObject)
	if len(added) == 0 {
		return
	}
	// The Deployment as it will be stored is what the garbage collector
	// would delete.
	del := Request{Operation: admissionv1.Delete, OldObject: req.Object, OldObjectRaw: req.ObjectRaw,
		UserInfo: req.UserInfo, DryRun: req.DryRun}
	fs, _ := w.evaluatePolicies(ctx, p, del)
	owners := make([]string, len(added))
	for i, o := range added {
		owners[i] = o.Kind + " " + o.Name
	}
	path := field.NewPath("metadata", "ownerReferences")
	for _, f := range fs {
		if f.Severity != SeverityError {
			continue
		}
		what := f.Message
		if f.Policy != "" {
			what = fmt.Sprintf("[policy %s] %s", f.Policy, f.Message)
		}
		detail := fmt.Sprintf("an owner reference to %s lets the garbage collector delete this Deployment once that owner is deleted, "+
			"and you may not delete it: %s. Remove the owner reference, or have it added by someone who may delete the Deployment",
			strings.Join(owners, ", "), what)
		e := (&field.Error{Type: field.ErrorTypeForbidden, Field: path.String(), BadValue: "", Detail: detail}).WithOrigin(origin.Policy)
		f.Field, f.Message, f.Err = path.String(), detail, e
		r.Findings = append(r.Findings, f)
	}
}
