package reconciler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/snapshot"
	"github.com/deployguard/deployguard/reconciler/vocab"
)

// SnapshotOptions say what the guard keeps of the config a known-good
// revision ran with (package snapshot; its README).
type SnapshotOptions struct {
	// ConfigMaps: keep snapshots of the ConfigMaps a known-good revision
	// references, and restore them on rollback. Needs get, create and patch
	// on ConfigMaps in every namespace the guard watches.
	ConfigMaps bool
	// Secrets: the same for Secrets. Off unless the platform team turns it
	// on: it gives the guard get, create and patch on every Secret.
	Secrets bool
	// Limits bound what one revision keeps; zero fields are unbounded.
	Limits snapshot.Limits
}

// DefaultSnapshotOptions: ConfigMaps only, within snapshot.DefaultLimits.
func DefaultSnapshotOptions() SnapshotOptions {
	return SnapshotOptions{ConfigMaps: true, Limits: snapshot.DefaultLimits()}
}

// configObject is one referenced config object as read from the API server.
type configObject struct {
	obj       client.Object
	hash      string
	size      int
	immutable bool
}

// readConfig reads the object of kind and name in namespace from the API
// server (never a cache: the guard keeps no ConfigMap or Secret of its
// tenants in memory); nil when it does not exist.
func (r *DeploymentReconciler) readConfig(ctx context.Context, namespace, kind, name string) (*configObject, error) {
	key := client.ObjectKey{Namespace: namespace, Name: name}
	switch kind {
	case snapshot.KindSecret:
		s := &corev1.Secret{}
		if err := r.APIReader.Get(ctx, key, s); err != nil {
			return nil, client.IgnoreNotFound(err)
		}
		return &configObject{obj: s, hash: snapshot.ContentHash(nil, s.Data), size: snapshot.Size(nil, s.Data), immutable: s.Immutable != nil && *s.Immutable}, nil
	default:
		cm := &corev1.ConfigMap{}
		if err := r.APIReader.Get(ctx, key, cm); err != nil {
			return nil, client.IgnoreNotFound(err)
		}
		return &configObject{obj: cm, hash: snapshot.ContentHash(cm.Data, cm.BinaryData), size: snapshot.Size(cm.Data, cm.BinaryData),
			immutable: cm.Immutable != nil && *cm.Immutable}, nil
	}
}

// isSnapshot reports whether o is a snapshot the guard made (snapshot.IsSnapshot).
func (o *configObject) isSnapshot() bool {
	return snapshot.IsSnapshot(o.obj.GetName(), o.obj.GetLabels(), o.obj.GetAnnotations(), o.immutable, o.hash)
}

// snapshotConfig keeps the config a known-good newRS ran with: for each
// object its template references (whole: read from the API server, the
// cache strips templates), an immutable snapshot in its namespace owned by
// newRS (created, or newRS added to the owners of the one with the same
// content), and returns what the ledger records of them. A transient error
// is returned, and the marking waits for it; an object the API server
// refuses to copy (quota, rights, size) is recorded as skipped, and the
// revision is marked known-good all the same.
func (r *DeploymentReconciler) snapshotConfig(ctx context.Context, newRS *appsv1.ReplicaSet) ([]rollout.ConfigSnapshot, error) {
	opts := r.Options.Snapshots
	if !opts.ConfigMaps && !opts.Secrets {
		return nil, nil
	}
	whole := &appsv1.ReplicaSet{}
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(newRS), whole); err != nil {
		return nil, fmt.Errorf("reading ReplicaSet %s: %w", newRS.Name, err)
	}
	if whole.UID != newRS.UID || rollout.TemplateHash(&whole.Spec.Template) != rollout.TemplateHash(&newRS.Spec.Template) {
		return nil, apierrors.NewConflict(appsv1.Resource("replicasets"), newRS.Name, fmt.Errorf("changed since it was read"))
	}
	var refs []snapshot.Ref
	for _, ref := range snapshot.Refs(&whole.Spec.Template.Spec, opts.Secrets) {
		if ref.Kind == snapshot.KindConfigMap && !opts.ConfigMaps {
			continue
		}
		refs = append(refs, ref)
	}
	if len(refs) == 0 {
		return nil, nil
	}
	if why := opts.Limits.TooMany(len(refs)); why != "" {
		// Nothing read, nothing recorded: the bound is on the guard's own
		// work and on the ledger every cached Deployment carries.
		return nil, &tooManyConfig{why: why}
	}
	found := make([]snapshot.Found, 0, len(refs))
	objs := map[snapshot.Key]*configObject{}
	for _, ref := range refs {
		o, err := r.readConfig(ctx, whole.Namespace, ref.Kind, ref.Name)
		if err != nil {
			return nil, fmt.Errorf("reading %s %s: %w", ref.Kind, ref.Name, err)
		}
		f := snapshot.Found{Ref: ref}
		if o != nil {
			objs[ref.Key()] = o
			f.Exists, f.Hash, f.Size, f.IsSnapshot = true, o.hash, o.size, o.isSnapshot()
			if s, ok := o.obj.(*corev1.Secret); ok && s.Type == corev1.SecretTypeServiceAccountToken {
				f.NotKept = "a service account token, which the API server issues"
			}
		}
		found = append(found, f)
	}
	recs := snapshot.Plan(found, opts.Limits)
	for i := range recs {
		rec := &recs[i]
		if rec.Snapshot == "" {
			continue
		}
		skipped, err := r.ensureSnapshot(ctx, objs[snapshot.Key{Kind: rec.Kind, Name: rec.Name}], rec, whole)
		if err != nil {
			return nil, err
		}
		if skipped != "" {
			rec.Snapshot, rec.Skipped = "", truncate(skipped, 200)
		}
	}
	return recs, nil
}

// ensureSnapshot makes sure rec's snapshot of src exists, owned by rs among
// others: created, or rs added to the owners of the snapshot that holds the
// same content already (another revision ran with it). A snapshot that is
// src itself (the template references a snapshot already) gets rs as an
// owner too, so that it stays while rs does. It returns why no snapshot
// could be kept, or an error worth retrying.
func (r *DeploymentReconciler) ensureSnapshot(ctx context.Context, src *configObject, rec *rollout.ConfigSnapshot, rs *appsv1.ReplicaSet) (string, error) {
	existing := src
	if rec.Snapshot != rec.Name {
		var want client.Object
		switch o := src.obj.(type) {
		case *corev1.ConfigMap:
			want = snapshot.ConfigMapSnapshot(o, rs)
		case *corev1.Secret:
			want = snapshot.SecretSnapshot(o, rs)
		}
		err := r.Client.Create(ctx, want)
		switch {
		case err == nil:
			ctrl.LoggerFrom(ctx).V(1).Info("Kept a snapshot of the revision's config", "kind", rec.Kind, "source", rec.Name, "snapshot", rec.Snapshot)
			return "", nil
		case apierrors.IsAlreadyExists(err):
		case refusedForGood(err):
			return "the API server refused the snapshot: " + err.Error(), nil
		default:
			return "", fmt.Errorf("creating snapshot %s of %s %s: %w", rec.Snapshot, rec.Kind, rec.Name, err)
		}
		existing, err = r.readConfig(ctx, rs.Namespace, rec.Kind, rec.Snapshot)
		switch {
		case err != nil:
			return "", fmt.Errorf("reading snapshot %s: %w", rec.Snapshot, err)
		case existing == nil:
			// Deleted in between: the next pass creates it.
			return "", apierrors.NewConflict(corev1.Resource("configmaps"), rec.Snapshot, errors.New("snapshot deleted while it was read"))
		}
	}
	if !existing.isSnapshot() || existing.hash != rec.Hash {
		// A tenant's object by that name, or one whose data is not the
		// name's: never taken for the guard's.
		return fmt.Sprintf("%s %s exists and is not the guard's snapshot of %s", rec.Kind, rec.Snapshot, rec.Name), nil
	}
	owners, added := snapshot.WithOwner(existing.obj.GetOwnerReferences(), rs)
	if !added {
		return "", nil
	}
	patch := client.MergeFromWithOptions(existing.obj.DeepCopyObject().(client.Object), client.MergeFromWithOptimisticLock{})
	existing.obj.SetOwnerReferences(owners)
	if err := r.Client.Patch(ctx, existing.obj, patch, client.FieldOwner(FieldManager)); err != nil {
		if refusedForGood(err) {
			return "the API server refused to add the ReplicaSet to the snapshot's owners: " + err.Error(), nil
		}
		return "", fmt.Errorf("adding ReplicaSet %s to the owners of snapshot %s: %w", rs.Name, rec.Snapshot, err)
	}
	return "", nil
}

// tooManyConfig: a revision references more config objects than the bound;
// it is recorded known-good without config, and said so.
type tooManyConfig struct{ why string }

func (e *tooManyConfig) Error() string { return e.why }

// truncate cuts s to n bytes: what the ledger keeps of an API server's
// refusal.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// refusedForGood reports an answer after which trying again changes
// nothing soon: no right, a quota, an invalid or too large object, a
// namespace being deleted.
func refusedForGood(err error) bool {
	return apierrors.IsForbidden(err) || apierrors.IsInvalid(err) || apierrors.IsRequestEntityTooLargeError(err) || apierrors.IsBadRequest(err)
}

// tellConfigNotKept says, once a revision is recorded, which of its config
// objects the guard kept no snapshot of, and why: a rollback to it restores
// the template alone for those.
func (r *DeploymentReconciler) tellConfigNotKept(d *appsv1.Deployment, rs *appsv1.ReplicaSet, revision int64, recs []rollout.ConfigSnapshot, tooMany string) {
	if tooMany != "" {
		r.Recorder.Eventf(d, rs, corev1.EventTypeWarning, vocab.ReasonConfigNotKept, actionMarkKnownGood,
			"Revision %d (ReplicaSet %s): no snapshot kept of its config: %s; a rollback to it restores the template alone.", revision, rs.Name, tooMany)
		return
	}
	var parts []string
	for _, rec := range recs {
		if rec.Skipped != "" {
			parts = append(parts, fmt.Sprintf("%s %s (%s)", rec.Kind, rec.Name, rec.Skipped))
		}
	}
	if len(parts) == 0 {
		return
	}
	r.Recorder.Eventf(d, rs, corev1.EventTypeWarning, vocab.ReasonConfigNotKept, actionMarkKnownGood,
		"Revision %d (ReplicaSet %s): no snapshot kept of %s; a rollback to it restores the template alone for these.", revision, rs.Name, strings.Join(parts, ", "))
}

// restoredTemplate is the template a rollback to target writes: the
// known-good template, with each reference whose config drifted since the
// revision ran (changed, deleted, pruned) pointing at the snapshot kept
// then, once that snapshot is read again and its data hashes to what the
// ledger recorded (a tenant may have replaced it). Where nothing drifted it
// is the known-good template exactly, and the Deployment controller brings
// the old ReplicaSet back.
func (r *DeploymentReconciler) restoredTemplate(ctx context.Context, d *appsv1.Deployment, target *appsv1.ReplicaSet) (*corev1.PodTemplateSpec, snapshot.RestorePlan, error) {
	tmpl := RollbackTemplate(target)
	l, _ := rollout.ReadLedger(d)
	e := l.KnownGoodEntryOf(target)
	if e == nil || len(e.Config) == 0 {
		return tmpl, snapshot.RestorePlan{}, nil
	}
	now := map[snapshot.Key]snapshot.Now{}
	// Config the guard may not read (its rights narrowed, a Secret kept
	// before Secrets were turned off) is left as the template names it: a
	// rollback never waits on config it cannot restore.
	var unreadable []snapshot.Lost
	for _, rec := range e.Config {
		cur, err := r.readConfig(ctx, d.Namespace, rec.Kind, rec.Name)
		if apierrors.IsForbidden(err) {
			unreadable = append(unreadable, snapshot.Lost{Kind: rec.Kind, Name: rec.Name, Why: "the guard may not read it"})
			continue
		}
		if err != nil {
			return nil, snapshot.RestorePlan{}, fmt.Errorf("reading %s %s: %w", rec.Kind, rec.Name, err)
		}
		var n snapshot.Now
		if cur != nil {
			n.Exists, n.Hash = true, cur.hash
		}
		if drifted := cur == nil || cur.hash != rec.Hash; drifted && rec.Snapshot != "" && rec.Snapshot != rec.Name {
			snap, err := r.readConfig(ctx, d.Namespace, rec.Kind, rec.Snapshot)
			if apierrors.IsForbidden(err) {
				snap, err = nil, nil // not OK: the plan says it is lost
			}
			if err != nil {
				return nil, snapshot.RestorePlan{}, fmt.Errorf("reading snapshot %s: %w", rec.Snapshot, err)
			}
			n.SnapshotOK = snap != nil && snap.isSnapshot() && snap.hash == rec.Hash
		}
		now[snapshot.Key{Kind: rec.Kind, Name: rec.Name}] = n
	}
	readable := slices.DeleteFunc(slices.Clone(e.Config), func(rec rollout.ConfigSnapshot) bool {
		_, read := now[snapshot.Key{Kind: rec.Kind, Name: rec.Name}]
		return !read
	})
	plan := snapshot.PlanRestore(readable, now)
	plan.Lost = append(plan.Lost, unreadable...)
	if len(plan.Restore) > 0 {
		ctrl.LoggerFrom(ctx).Info("Restoring the config the known-good revision ran with", "target", klog.KObj(target), "restore", len(plan.Restore), "lost", len(plan.Lost))
	}
	return snapshot.Rewrite(tmpl, plan.Restore), plan, nil
}
