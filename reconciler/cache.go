package reconciler

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
)

// CacheOptions returns what the manager's cache keeps of the objects the
// reconciler (and the webhook's overlap index) read: Deployments and
// ReplicaSets without their pod spec (a hash of the template stands for it),
// without managedFields and kubectl's last-applied configuration. A
// Deployment's decisions need its metadata, selector, template labels,
// strategy and status; the template itself only at rollback and record time,
// when it is read from the API server. This is what bounds the guard's memory
// by the number of objects, not by their size. A Deployment's labels, its
// template's, its selector, finalizers and owner references are kept whole
// (the overlap index and the checks' selection need them exactly):
// deployguard-refusals bounds their number at admission
// (test/bench/scale/README.md, "What a tenant sizes").
func CacheOptions() map[client.Object]cache.ByObject {
	return map[client.Object]cache.ByObject{
		&appsv1.Deployment{}: {Transform: StripForCache},
		&appsv1.ReplicaSet{}: {Transform: StripForCache},
	}
}

// MaxCachedAnnotationBytes is the longest annotation value of the guard's
// domain (and, on ReplicaSets, of any annotation kept) that the cache keeps;
// a longer one is dropped, as if absent. Every value the guard reads is far
// shorter: the longest it writes, rollback-status, is a few sentences;
// quarantined-templates holds at most QuarantineLimit hashes; the others are
// a word, a number, a time or a hash. 4 KiB is ten times the longest of them,
// and bounds what a tenant's annotation costs on each of the ReplicaSets the
// Deployment controller copies it to (one per revision kept).
//
// Dropping one never lets a tenant steer the guard: what the guard acts on
// lives in its ledger (a status condition), not in annotations; the
// annotations it reads are the user's own choices about their Deployment
// (an opt-out, a window, cleanup steps), whose absence is the platform's
// default, or the guard's own words, which it writes again; an earlier
// release's marks that are dropped are not adopted, which is the safe side.
const MaxCachedAnnotationBytes = 4 << 10

// cachedGuardAnnotations are the annotations of the guard's domain that the
// cache keeps: those this release reads (vocab), and the ones it reads once,
// or tells are ignored (LegacyAnnotations). Any other deployguard.io/* key is
// read by nothing, and not kept.
var cachedGuardAnnotations = func() map[string]bool {
	m := map[string]bool{}
	for _, k := range []string{
		vocab.AnnotationDefaulted, vocab.AnnotationAutoRollback, vocab.AnnotationRollbackStatus,
		vocab.AnnotationQuarantinedTemplates, vocab.AnnotationAllowTemplate, vocab.AnnotationProtected,
		vocab.AnnotationFailFast, vocab.AnnotationCleanup, vocab.AnnotationSkipCleanup,
		vocab.AnnotationDrainStarted, vocab.AnnotationDrainReplicas, vocab.AnnotationAcceptRollback,
	} {
		m[k] = true
	}
	for _, k := range LegacyAnnotations {
		m[k] = true
	}
	return m
}()

// keepGuardAnnotation: a key of the guard's domain is kept when this release
// reads it, and its value is short.
func keepGuardAnnotation(k, v string) bool {
	return cachedGuardAnnotations[k] && len(v) <= MaxCachedAnnotationBytes
}

// cachedReadAnnotations are the annotations outside the guard's domain that
// the guard itself reads from a cached Deployment or ReplicaSet: the
// Deployment controller's revision (rollout.Revision, ReadRollout). Nothing
// else outside deployguard.io/* is read from the cache (a rollback and a
// record read the ReplicaSet's other annotations from the API server).
var cachedReadAnnotations = map[string]bool{vocab.RevisionAnnotation: true}

// keepReadAnnotation: an annotation outside the guard's domain that the
// guard reads is kept when its value is short, whatever else the object
// carries: it never competes with the others for their total.
func keepReadAnnotation(k, v string) bool {
	return cachedReadAnnotations[k] && len(v) <= MaxCachedAnnotationBytes
}

// StripForCache is the cache transform of Deployments and ReplicaSets (see
// CacheOptions); other objects only lose their managedFields.
func StripForCache(obj any) (any, error) {
	switch o := obj.(type) {
	case *appsv1.Deployment:
		stripMeta(&o.ObjectMeta)
		rollout.StripTemplate(&o.Spec.Template)
		o.Annotations = trimDeploymentAnnotations(o.Annotations)
	case *appsv1.ReplicaSet:
		stripMeta(&o.ObjectMeta)
		rollout.StripTemplate(&o.Spec.Template)
		// The reconciler reads a cached ReplicaSet's identity, owner, revision,
		// pod-template-hash and an earlier release's marks; a drain reads its
		// ReplicaSets from the API server. The rest is a third of what the
		// cache would hold at scale (30,000 ReplicaSets for 10,000
		// Deployments), and every annotation of a Deployment, whatever its
		// size, is copied onto each of its new ReplicaSets.
		o.Labels = keepOnly(o.Labels, func(k string) bool { return k == appsv1.DefaultDeploymentUniqueLabelKey })
		o.Annotations = keepOnlyKV(o.Annotations, func(k, v string) bool {
			return keepReadAnnotation(k, v) || keepGuardAnnotation(k, v)
		})
		o.Spec.Selector = nil
		o.Spec.Template.Labels = nil
		// Of its owners, the controller: the index and the watch find a
		// ReplicaSet's Deployment by it (GetControllerOf), and nothing reads
		// the others or its finalizers. Tenants may write ReplicaSets, and
		// the API server bounds neither list but by the object's size.
		switch ref := metav1.GetControllerOfNoCopy(o); {
		case ref == nil:
			o.OwnerReferences = nil
		case len(o.OwnerReferences) > 1:
			// A slice of its own: the others are not held.
			o.OwnerReferences = []metav1.OwnerReference{*ref}
		}
		o.Finalizers = nil
		// Of the status, only whether a new pod is Ready: the metric checks
		// start measuring a revision then. A stalled scale-up reads the
		// ReplicaFailure condition from the API server (replicaFailure).
		o.Status = appsv1.ReplicaSetStatus{ReadyReplicas: o.Status.ReadyReplicas}
	case metav1.Object:
		o.SetManagedFields(nil)
	}
	return obj, nil
}

func stripMeta(m *metav1.ObjectMeta) { m.ManagedFields = nil }

// MaxCachedOtherAnnotationBytes bounds what a cached Deployment keeps of the
// annotations outside the guard's domain, keys and values together; each
// value is also at most MaxCachedAnnotationBytes. The guard reads none of
// them (those it reads, cachedReadAnnotations, are kept apart and not
// counted): only the audit's policies may, and the audit reads a Deployment
// the cache trimmed from the API server (rollout.CacheTrimmed). The annotations
// tools write (the Deployment controller's revision, Helm's release, Argo
// CD's tracking id, change-cause) take a few hundred bytes; 8 KiB keeps them
// whole and bounds 10,000 Deployments to 80 MiB, where the API server's
// 256 KiB an object would be 2.5 GiB.
const MaxCachedOtherAnnotationBytes = 8 << 10

// trimDeploymentAnnotations returns what the cache keeps of a Deployment's
// annotations: of the guard's domain those this release reads, short; the
// revision (cachedReadAnnotations), short, whatever sorts before it; of the
// others, short ones in key order up to MaxCachedOtherAnnotationBytes;
// never kubectl's last-applied configuration (a copy of the whole object).
// When it drops anything, it sets rollout.CacheTrimmed to a hash of what it
// dropped. An incoming rollout.CacheTrimmed is dropped first, whoever wrote
// it, and is not part of the hash: only this function sets it.
func trimDeploymentAnnotations(m map[string]string) map[string]string {
	keys := make([]string, 0, len(m))
	for k := range m {
		if k != rollout.CacheTrimmed {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	keep := make(map[string]bool, len(keys))
	dropped := sha256.New()
	trimmed := false
	other := 0
	for _, k := range keys {
		v := m[k]
		ok := false
		switch {
		case k == corev1.LastAppliedConfigAnnotation:
		case strings.HasPrefix(k, vocab.Domain+"/"):
			ok = keepGuardAnnotation(k, v)
		case cachedReadAnnotations[k]:
			ok = keepReadAnnotation(k, v)
		case len(v) <= MaxCachedAnnotationBytes && other+len(k)+len(v) <= MaxCachedOtherAnnotationBytes:
			ok = true
			other += len(k) + len(v)
		}
		if ok {
			keep[k] = true
			continue
		}
		trimmed = true
		// Length-prefixed: no two sets of dropped annotations hash alike by
		// moving bytes between a key and a value.
		_, _ = fmt.Fprintf(dropped, "%d:%s%d:%s", len(k), k, len(v), v)
	}
	out := keepOnlyKV(m, func(k, _ string) bool { return keep[k] })
	if trimmed {
		if out == nil {
			out = map[string]string{}
		}
		out[rollout.CacheTrimmed] = hex.EncodeToString(dropped.Sum(nil)[:8])
	}
	return out
}

// keepOnly returns the entries of m whose key keep accepts, in a map of its
// own sized to them (nil when none).
func keepOnly(m map[string]string, keep func(string) bool) map[string]string {
	return keepOnlyKV(m, func(k, _ string) bool { return keep(k) })
}

// keepOnlyKV returns the entries of m that keep accepts, in a map of its own
// sized to them (nil when none): the values dropped are not held by the map
// the informer keeps.
func keepOnlyKV(m map[string]string, keep func(k, v string) bool) map[string]string {
	n := 0
	for k, v := range m {
		if keep(k, v) {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	out := make(map[string]string, n)
	for k, v := range m {
		if keep(k, v) {
			out[k] = v
		}
	}
	return out
}
