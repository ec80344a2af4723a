package reconciler

import (
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
		rollout.StripTemplate(&o.Spec.Template)
	case *appsv1.ReplicaSet:
		stripMeta(&o.ObjectMeta)
		rollout.StripTemplate(&o.Spec.Template)
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
