package rollout

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deployguard/deployguard/reconciler/vocab"
)

// The manager's cache keeps Deployments and ReplicaSets without their pod
// spec (reconciler.CacheOptions): a hash of the template stands in for it.

// CachedTemplateHash names what the cache keeps in place of a pod template:
// a stripped template's name is CachedTemplateHash, "=" and the
// vocab.TemplateHash of the template the cache transform dropped. In the
// name rather than in an annotation, it costs no map per object (about 300
// bytes, four per Deployment with its ReplicaSets). It lives in the guard's
// memory only: the guard writes Deployments and ReplicaSets with patches of
// the fields it changes, never whole cached objects, and reads an object from
// the API server whenever it needs its template (a rollback, a record). What
// tells a stripped template from one the API server sent is its containers:
// the API server never stores a pod template without one, so a name or an
// annotation a tenant wrote is never taken for the hash, and never keeps a
// pod spec in memory. Earlier releases kept it in an annotation of this name,
// which the guard ignores wherever it is written (reconciler.LegacyAnnotations).
const CachedTemplateHash = vocab.Domain + "/cached-template-hash"

// strippedPrefix starts a stripped template's name.
const strippedPrefix = CachedTemplateHash + "="

// StripTemplate replaces the pod spec and the template's metadata but its
// labels by the template's hash; its labels stay (selectors and the overlap
// check read them). Idempotent: a stripped template (no containers, see
// CachedTemplateHash) keeps the hash it has. Nothing in the object decides
// whether its template is kept.
func StripTemplate(t *corev1.PodTemplateSpec) {
	if Stripped(t) {
		return
	}
	h := vocab.TemplateHash(t)
	t.Spec = corev1.PodSpec{}
	t.ObjectMeta = metav1.ObjectMeta{Name: strippedPrefix + h, Labels: t.Labels}
}

// Stripped reports whether the cache transform has stripped t: no
// containers, which the API server never sends, and the hash in their place.
func Stripped(t *corev1.PodTemplateSpec) bool {
	return len(t.Spec.Containers) == 0 && strings.HasPrefix(t.Name, strippedPrefix)
}

// TemplateHash is the identity of an object's pod template, ignoring the
// pod-template-hash label (vocab.TemplateHash): the hash the cache left in
// place of a stripped template, or the hash of the template itself (an object
// read from the API server).
func TemplateHash(t *corev1.PodTemplateSpec) string {
	if Stripped(t) {
		return strings.TrimPrefix(t.Name, strippedPrefix)
	}
	return vocab.TemplateHash(t)
}
