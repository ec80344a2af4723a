package reconciler

import (
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/vocab"
)

// cachedTemplateHash holds, in the pod template of a cached Deployment or
// ReplicaSet, the vocab.TemplateHash of the pod spec the cache transform
// dropped. It lives in the guard's memory only: the guard writes Deployments
// and ReplicaSets with patches of the fields it changes, never whole cached
// objects, and reads an object from the API server whenever it needs its
// template (a rollback, a record). What tells a stripped template from one the
// API server sent is its containers: the API server never stores a pod
// template without one, so an annotation of this name sent by the API server
// (a tenant can write one) is never taken for the hash, and never keeps a pod
// spec in memory.
const cachedTemplateHash = vocab.Domain + "/cached-template-hash"

// CacheOptions returns what the manager's cache keeps of the objects the
// reconciler (and the webhook's overlap index) read: Deployments and
// ReplicaSets without their pod spec (a hash of the template stands for it),
// without managedFields and kubectl's last-applied configuration. A
// Deployment's decisions need its metadata, selector, template labels,
// strategy and status; the template itself only at rollback and record time,
// when it is read from the API server. This is what bounds the guard's memory
// by the number of objects, not by their size.
func CacheOptions() map[client.Object]cache.ByObject {
	return map[client.Object]cache.ByObject{
		&appsv1.Deployment{}: {Transform: StripForCache},
		&appsv1.ReplicaSet{}: {Transform: StripForCache},
	}
}

// StripForCache is the cache transform of Deployments and ReplicaSets (see
// CacheOptions); other objects only lose their managedFields.
func StripForCache(obj any) (any, error) {
	switch o := obj.(type) {
	case *appsv1.Deployment:
		stripMeta(&o.ObjectMeta)
		delete(o.Annotations, corev1.LastAppliedConfigAnnotation)
		stripTemplate(&o.ObjectMeta, &o.Spec.Template)
	case *appsv1.ReplicaSet:
		stripMeta(&o.ObjectMeta)
		stripTemplate(&o.ObjectMeta, &o.Spec.Template)
		// The reconciler reads a cached ReplicaSet's identity, owner, revision,
		// pod-template-hash and the guard's marks; a drain reads its
		// ReplicaSets from the API server. The rest is a third of what the
		// cache would hold at scale (30,000 ReplicaSets for 10,000
		// Deployments).
		o.Labels = keepOnly(o.Labels, func(k string) bool { return k == appsv1.DefaultDeploymentUniqueLabelKey })
		o.Annotations = keepOnly(o.Annotations, func(k string) bool {
			return k == vocab.RevisionAnnotation || strings.HasPrefix(k, vocab.Domain+"/")
		})
		o.Spec.Selector = nil
		o.Spec.Template.Labels = nil
		o.Status = appsv1.ReplicaSetStatus{}
	case metav1.Object:
		o.SetManagedFields(nil)
	}
	return obj, nil
}

func stripMeta(m *metav1.ObjectMeta) { m.ManagedFields = nil }

// keepOnly returns the entries of m whose key keep accepts, in a map of its
// own sized to them (nil when none).
func keepOnly(m map[string]string, keep func(string) bool) map[string]string {
	n := 0
	for k := range m {
		if keep(k) {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	out := make(map[string]string, n)
	for k, v := range m {
		if keep(k) {
			out[k] = v
		}
	}
	return out
}

// stripTemplate replaces the pod spec and the template's annotations by the
// template's hash; its labels stay (selectors and the overlap check read them).
// Idempotent: a stripped template (no containers, see cachedTemplateHash)
// keeps the hash it has. Nothing in the object decides whether its template is
// kept.
func stripTemplate(_ *metav1.ObjectMeta, t *corev1.PodTemplateSpec) {
	if stripped(t) {
		return
	}
	h := vocab.TemplateHash(t)
	t.Spec = corev1.PodSpec{}
	t.Annotations = map[string]string{cachedTemplateHash: h}
}

// stripped reports whether the cache transform has stripped t: no
// containers, which the API server never sends, and the hash in their place.
func stripped(t *corev1.PodTemplateSpec) bool {
	_, ok := t.Annotations[cachedTemplateHash]
	return ok && len(t.Spec.Containers) == 0
}

// templateHash is the identity of an object's pod template, ignoring the
// pod-template-hash label: the hash the cache left in place of a stripped
// template, or the hash of the template itself (an object read from the API
// server).
func templateHash(_ *metav1.ObjectMeta, t *corev1.PodTemplateSpec) string {
	if stripped(t) {
		return t.Annotations[cachedTemplateHash]
	}
	return vocab.TemplateHash(t)
}
