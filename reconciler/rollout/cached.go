package rollout

import (
	appsv1 "k8s.io/api/apps/v1"

	"github.com/deployguard/deployguard/reconciler/vocab"
)

// CacheTrimmed marks a cached Deployment whose annotations the cache
// transform trimmed (reconciler.StripForCache): its value is a hash of what
// was dropped, so that a change of a dropped annotation is still a change of
// the cached copy. The transform strips it from every object it receives
// before it decides, so only the transform can set it: a tenant's
// annotation of that name never reaches the cache.
const CacheTrimmed = vocab.Domain + "/cache-trimmed"

// Incomplete reports whether d is a cached copy that lacks something a
// policy may read: its pod template (always stripped by the cache) or some
// of its annotations. Whoever judges d as stored reads it whole from the API
// server first.
func Incomplete(d *appsv1.Deployment) bool {
	_, trimmed := d.Annotations[CacheTrimmed]
	return trimmed || Stripped(&d.Spec.Template)
}
