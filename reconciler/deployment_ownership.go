package reconciler

import (
	"context"
	"encoding/json"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// FieldManager is the field manager of the guard's writes.
const FieldManager = "deployguard"

// A rollback restores the template with the guard's own write, and so makes
// the guard the owner of every template field it changed (the image, most
// often). The team's next server-side apply of a fixed template (Helm 4's
// default, `kubectl apply --server-side`) then fails on a conflict with
// "deployguard", though the team owned those fields and only the guard
// stepped in. So after a rollback the guard hands them back: it drops its
// claim on spec.template, and the appliers that owned them before own them
// again.

// WithoutTemplateOwnership returns the managed fields with manager's claim
// on spec.template removed from its (non-subresource) Update entries, an
// entry left with no field dropped, and whether anything changed. Entries it
// cannot read are kept as they are.
func WithoutTemplateOwnership(entries []metav1.ManagedFieldsEntry, manager string) ([]metav1.ManagedFieldsEntry, bool) {
	out := make([]metav1.ManagedFieldsEntry, 0, len(entries))
	changed := false
	for _, e := range entries {
		if e.Manager != manager || e.Operation != metav1.ManagedFieldsOperationUpdate || e.Subresource != "" || e.FieldsV1 == nil {
			out = append(out, e)
			continue
		}
		fields, dropped, ok := withoutTemplate(e.FieldsV1.GetRawBytes())
		if !ok || !dropped {
			out = append(out, e)
			continue
		}
		changed = true
		if fields == nil {
			continue
		}
		e = *e.DeepCopy()
		e.FieldsV1 = metav1.NewFieldsV1(string(fields))
		out = append(out, e)
	}
	return out, changed
}

// withoutTemplate removes "f:spec"."f:template" from a FieldsV1 set: the new
// set (nil when nothing is left), whether it held the template, and whether
// it could be read.
func withoutTemplate(raw []byte) ([]byte, bool, bool) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(raw, &top); err != nil {
		return nil, false, false
	}
	specRaw, ok := top["f:spec"]
	if !ok {
		return raw, false, true
	}
	var spec map[string]json.RawMessage
	if err := json.Unmarshal(specRaw, &spec); err != nil {
		return nil, false, false
	}
	if _, ok := spec["f:template"]; !ok {
		return raw, false, true
	}
	delete(spec, "f:template")
	if len(spec) == 0 {
		delete(top, "f:spec")
	} else {
		b, err := json.Marshal(spec)
		if err != nil {
			return nil, false, false
		}
		top["f:spec"] = b
	}
	if len(top) == 0 {
		return nil, true, true
	}
	b, err := json.Marshal(top)
	if err != nil {
		return nil, false, false
	}
	return b, true, true
}

// releaseTemplate hands the template fields the rollback wrote back to
// their earlier owners (WithoutTemplateOwnership), with a write of the
// managed fields alone, conditional on the version read. The Deployment
// controller writes the status right after a rollback, so the version read
// is often already old: on a conflict it reads the Deployment again from the
// API server and retries, with backoff. It is best effort: if it still
// fails, a later server-side apply of the template needs --force-conflicts,
// which the log says.
func (r *DeploymentReconciler) releaseTemplate(ctx context.Context, d *appsv1.Deployment) {
	cur := d
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		if cur == nil {
			cur = &appsv1.Deployment{}
			if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(d), cur); err != nil {
				return err
			}
		}
		fields, changed := WithoutTemplateOwnership(cur.ManagedFields, FieldManager)
		if !changed {
			return nil
		}
		patch := client.MergeFromWithOptions(cur.DeepCopy(), client.MergeFromWithOptimisticLock{})
		next := cur.DeepCopy()
		next.ManagedFields = fields
		if len(fields) == 0 {
			// An empty list leaves managedFields as they are; one empty entry
			// clears them (the API server's rule).
			next.ManagedFields = []metav1.ManagedFieldsEntry{{}}
		}
		err := r.Client.Patch(ctx, next, patch, client.FieldOwner(FieldManager))
		cur = nil // read again before a retry
		return err
	})
	if err != nil {
		ctrl.LoggerFrom(ctx).Info("Could not hand the rolled-back template's fields back to their owners; a server-side apply of the next template needs --force-conflicts",
			"reason", "OwnershipKept", "error", fmt.Sprint(err))
	}
}
