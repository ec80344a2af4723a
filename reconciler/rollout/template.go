package rollout

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/deployguard/deployguard/reconciler/vocab"
)

// The manager's cache keeps Deployments and ReplicaSets without their pod
// spec (reconciler.CacheOptions): a hash of the template stands in for it.

// CachedTemplateHash holds, in the pod template of a cached Deployment or
// ReplicaSet, the vocab.TemplateHash of the pod spec the cache transform
// dropped. It lives in the guard's memory only: the guard writes Deployments
// and ReplicaSets with patches of the fields it changes, never whole cached
// objects, and reads an object from the API server whenever it needs its
// template (a rollback, a record). What tells a stripped template from one the
// API server sent is its containers: the API server never stores a pod
// template without one, so an annotation of this name sent by the API server
// (a tenant can write one) is never taken for the hash, and never keeps a pod
// spec in memory.
const CachedTemplateHash = vocab.Domain + "/cached-template-hash"

// StripTemplate replaces the pod spec and the template's annotations by the
// template's hash; its labels stay (selectors and the overlap check read them).
// Idempotent: a stripped template (no containers, see CachedTemplateHash)
// keeps the hash it has. Nothing in the object decides whether its template is
// kept.
func StripTemplate(t *corev1.PodTemplateSpec) {
	if Stripped(t) {
		return
	}
	h := vocab.TemplateHash(t)
	t.Spec = corev1.PodSpec{}
	t.Annotations = map[string]string{CachedTemplateHash: h}
}

// Stripped reports whether the cache transform has stripped t: no
// containers, which the API server never sends, and the hash in their place.
func Stripped(t *corev1.PodTemplateSpec) bool {
	_, ok := t.Annotations[CachedTemplateHash]
	return ok && len(t.Spec.Containers) == 0
}

// TemplateHash is the identity of an object's pod template, ignoring the
// pod-template-hash label (vocab.TemplateHash): the hash the cache left in
// place of a stripped template, or the hash of the template itself (an object
// read from the API server).
func TemplateHash(t *corev1.PodTemplateSpec) string {
	if Stripped(t) {
		return t.Annotations[CachedTemplateHash]
	}
	return vocab.TemplateHash(t)
}
