// Package snapshot decides what the guard keeps of the config a known-good
// revision ran with, and how a rollback brings it back: which ConfigMaps (and
// Secrets, where the platform turns it on) a pod template references, the
// content-addressed name of an immutable snapshot of each, which references
// a rollback points at their snapshots, and the template it writes. Pure
// functions: the reconciler reads and writes the objects (design and
// trade-offs: reconciler/DESIGN.md, "Config snapshots").
package snapshot

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
)

// Kinds of config object a template references.
const (
	KindConfigMap = "ConfigMap"
	KindSecret    = "Secret"
)

// Ref is one config object a pod template references. Optional only when
// every reference to it is optional: one required reference makes a pod
// need it.
type Ref struct {
	Kind     string
	Name     string
	Optional bool
}

// Key is what tells two references apart: the kind and name.
type Key struct{ Kind, Name string }

// Key of the reference.
func (r Ref) Key() Key { return Key{r.Kind, r.Name} }

// Refs returns the config objects spec references, sorted by kind and name,
// each once: env valueFrom (configMapKeyRef, secretKeyRef), envFrom, volumes
// and projected volume sources, of containers, init containers and
// ephemeral containers. Secrets only with secrets. imagePullSecrets are not
// config the pods read, and are left out.
func Refs(spec *corev1.PodSpec, secrets bool) []Ref {
	seen := map[Key]*Ref{}
	var order []Key
	add := func(kind, name string, optional *bool) {
		if name == "" || (kind == KindSecret && !secrets) {
			return
		}
		opt := optional != nil && *optional
		k := Key{kind, name}
		if r, ok := seen[k]; ok {
			r.Optional = r.Optional && opt
			return
		}
		seen[k] = &Ref{Kind: kind, Name: name, Optional: opt}
		order = append(order, k)
	}
	forEachContainer(spec, func(env []corev1.EnvVar, envFrom []corev1.EnvFromSource) {
		for _, e := range env {
			if e.ValueFrom == nil {
				continue
			}
			if r := e.ValueFrom.ConfigMapKeyRef; r != nil {
				add(KindConfigMap, r.Name, r.Optional)
			}
			if r := e.ValueFrom.SecretKeyRef; r != nil {
				add(KindSecret, r.Name, r.Optional)
			}
		}
		for _, e := range envFrom {
			if r := e.ConfigMapRef; r != nil {
				add(KindConfigMap, r.Name, r.Optional)
			}
			if r := e.SecretRef; r != nil {
				add(KindSecret, r.Name, r.Optional)
			}
		}
	})
	for _, v := range spec.Volumes {
		if c := v.ConfigMap; c != nil {
			add(KindConfigMap, c.Name, c.Optional)
		}
		if s := v.Secret; s != nil {
			add(KindSecret, s.SecretName, s.Optional)
		}
		if p := v.Projected; p != nil {
			for _, src := range p.Sources {
				if c := src.ConfigMap; c != nil {
					add(KindConfigMap, c.Name, c.Optional)
				}
				if s := src.Secret; s != nil {
					add(KindSecret, s.Name, s.Optional)
				}
			}
		}
	}
	out := make([]Ref, 0, len(order))
	for _, k := range order {
		out = append(out, *seen[k])
	}
	slices.SortFunc(out, func(a, b Ref) int { return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Name, b.Name)) })
	return out
}

// forEachContainer calls f with the env and envFrom of every container,
// init container and ephemeral container of spec, as pointers into spec.
func forEachContainer(spec *corev1.PodSpec, f func(env []corev1.EnvVar, envFrom []corev1.EnvFromSource)) {
	for i := range spec.InitContainers {
		f(spec.InitContainers[i].Env, spec.InitContainers[i].EnvFrom)
	}
	for i := range spec.Containers {
		f(spec.Containers[i].Env, spec.Containers[i].EnvFrom)
	}
	for i := range spec.EphemeralContainers {
		f(spec.EphemeralContainers[i].Env, spec.EphemeralContainers[i].EnvFrom)
	}
}

// ContentHash identifies a config object's content: its data and binary
// data (a Secret's data is binary), hex of the first 16 bytes of a SHA-256.
// The guard recomputes it from a snapshot's data before trusting it, so a
// tenant that deletes a snapshot and creates another of the same name with
// other data is found out.
func ContentHash(data map[string]string, binary map[string][]byte) string {
	// encoding/json sorts map keys: equal content, equal bytes.
	b, err := json.Marshal(struct {
		Data   map[string]string `json:"data,omitempty"`
		Binary map[string][]byte `json:"binaryData,omitempty"`
	}{data, binary})
	if err != nil {
		return "" // maps of strings and bytes: never
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16])
}

// Size is the bytes of a config object's content, keys included: what a
// snapshot of it adds to etcd, roughly.
func Size(data map[string]string, binary map[string][]byte) int {
	n := 0
	for k, v := range data {
		n += len(k) + len(v)
	}
	for k, v := range binary {
		n += len(k) + len(v)
	}
	return n
}

// nameHashLen is how much of the content hash a snapshot's name carries:
// 40 bits tell one object's versions apart; the full hash is in the ledger.
const nameHashLen = 10

// Name is the snapshot of the object source with content hash: source-dg-
// and the hash's first ten characters, source cut so that the name fits a
// DNS subdomain (253 characters) and ends with an alphanumeric. Content
// addressed: the same data gives the same name, so revisions that ran with
// the same config share one snapshot.
func Name(source, hash string) string {
	suffix := "-dg-" + hash[:min(nameHashLen, len(hash))]
	if room := validation.DNS1123SubdomainMaxLength - len(suffix); len(source) > room {
		source = strings.TrimRight(source[:room], ".-")
	}
	return source + suffix
}

// IsSnapshot reports whether an object is a snapshot the guard made: its
// name is the content-addressed name of the object its annotation names,
// for the content hash computed from its data (hash), and it is immutable.
// Its label and annotation alone prove nothing (a tenant writes them); the
// name it could only have by holding that very content.
func IsSnapshot(name string, labels, annotations map[string]string, immutable bool, hash string) bool {
	of := annotations[vocab.AnnotationSnapshotOf]
	return immutable && labels[vocab.LabelSnapshot] == "true" && of != "" && name == Name(of, hash)
}

// OwnerRef is rs as a non-controller owner: the snapshot goes with the last
// ReplicaSet that ran with it, by garbage collection, and no controller
// adopts it. No blockOwnerDeletion: deleting a ReplicaSet never waits for
// its snapshots (and setting it would need rights on replicasets/finalizers).
func OwnerRef(rs *appsv1.ReplicaSet) metav1.OwnerReference {
	return metav1.OwnerReference{APIVersion: appsv1.SchemeGroupVersion.String(), Kind: "ReplicaSet", Name: rs.Name, UID: rs.UID}
}

// WithOwner returns refs with rs's OwnerRef added, and whether it was not
// there (by UID). The input is not modified.
func WithOwner(refs []metav1.OwnerReference, rs *appsv1.ReplicaSet) ([]metav1.OwnerReference, bool) {
	for _, r := range refs {
		if r.UID == rs.UID {
			return refs, false
		}
	}
	return append(slices.Clone(refs), OwnerRef(rs)), true
}

// Meta is the metadata of the snapshot of source with content hash, owned
// by rs. None of source's labels: a GitOps tool prunes what carries its
// own, and a snapshot must outlive the object it was taken of.
func Meta(source metav1.Object, hash string, rs *appsv1.ReplicaSet) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name:            Name(source.GetName(), hash),
		Namespace:       source.GetNamespace(),
		Labels:          map[string]string{vocab.LabelSnapshot: "true"},
		Annotations:     map[string]string{vocab.AnnotationSnapshotOf: source.GetName(), vocab.AnnotationSnapshotHash: hash},
		OwnerReferences: []metav1.OwnerReference{OwnerRef(rs)},
	}
}

// ConfigMapSnapshot is the immutable snapshot of cm owned by rs.
func ConfigMapSnapshot(cm *corev1.ConfigMap, rs *appsv1.ReplicaSet) *corev1.ConfigMap {
	immutable := true
	return &corev1.ConfigMap{
		ObjectMeta: Meta(cm, ContentHash(cm.Data, cm.BinaryData), rs),
		Immutable:  &immutable,
		Data:       cm.Data,
		BinaryData: cm.BinaryData,
	}
}

// SecretSnapshot is the immutable snapshot of s owned by rs, of the same
// type (a TLS Secret's snapshot is one too).
func SecretSnapshot(s *corev1.Secret, rs *appsv1.ReplicaSet) *corev1.Secret {
	immutable := true
	return &corev1.Secret{
		ObjectMeta: Meta(s, ContentHash(nil, s.Data), rs),
		Immutable:  &immutable,
		Type:       s.Type,
		Data:       s.Data,
	}
}

// Limits bound what the guard keeps per revision.
type Limits struct {
	// MaxObjects is the most config objects of one revision it keeps
	// snapshots of; a revision that references more keeps none.
	MaxObjects int
	// MaxBytes is the largest object it keeps a snapshot of (Size).
	MaxBytes int
	// MaxRevisionBytes bounds the snapshots of one revision together; the
	// objects past it (in Refs order) are not kept.
	MaxRevisionBytes int
}

// DefaultLimits: 16 objects, 256 KiB each, 1 MiB per revision.
func DefaultLimits() Limits {
	return Limits{MaxObjects: 16, MaxBytes: 256 << 10, MaxRevisionBytes: 1 << 20}
}

// Found is a referenced object as the guard read it when the rollout
// completed.
type Found struct {
	Ref Ref
	// Exists: the object was found; Hash and Size are its content's.
	Exists bool
	Hash   string
	Size   int
	// IsSnapshot: it is a snapshot of the guard already (IsSnapshot).
	IsSnapshot bool
	// NotKept says why the object cannot be copied (a service account
	// token Secret); empty when it can.
	NotKept string
}

// TooMany says why a revision that references n config objects keeps none;
// empty when n is within the bound. Nothing of it is recorded: the ledger
// lives in every Deployment the guard caches, and must not grow with what a
// template lists.
func (lim Limits) TooMany(n int) string {
	if lim.MaxObjects <= 0 || n <= lim.MaxObjects {
		return ""
	}
	return "the revision references " + itoa(n) + " config objects, more than " + itoa(lim.MaxObjects)
}

// Plan decides what the guard records of each referenced object of a
// revision that completed (found, in Refs order, within lim.MaxObjects: see
// TooMany): the snapshot to keep, the snapshot it is already, absent, or
// skipped and why.
func Plan(found []Found, lim Limits) []rollout.ConfigSnapshot {
	if lim.TooMany(len(found)) != "" {
		return nil
	}
	out := make([]rollout.ConfigSnapshot, 0, len(found))
	total := 0
	for _, f := range found {
		rec := rollout.ConfigSnapshot{Kind: f.Ref.Kind, Name: f.Ref.Name}
		if f.Exists {
			// Kept when skipped too: a rollback then tells drift from none.
			rec.Hash = f.Hash
		}
		switch {
		case !f.Exists:
			rec.Absent = true
		case f.IsSnapshot:
			rec.Snapshot = f.Ref.Name
		case f.NotKept != "":
			rec.Skipped = f.NotKept
		case lim.MaxBytes > 0 && f.Size > lim.MaxBytes:
			rec.Skipped = "larger than " + bytesString(lim.MaxBytes)
		case lim.MaxRevisionBytes > 0 && total+f.Size > lim.MaxRevisionBytes:
			rec.Skipped = "the revision's snapshots would exceed " + bytesString(lim.MaxRevisionBytes)
		default:
			total += f.Size
			rec.Snapshot = Name(f.Ref.Name, f.Hash)
		}
		out = append(out, rec)
	}
	return out
}
