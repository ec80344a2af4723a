package snapshot

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
)

var yes, no = ptr(true), ptr(false)

func ptr[T any](v T) *T { return &v }

func cmKeyRef(name string, optional *bool) corev1.EnvVar {
	return corev1.EnvVar{Name: "X", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: name}, Key: "k", Optional: optional}}}
}

func secretKeyRef(name string) corev1.EnvVar {
	return corev1.EnvVar{Name: "S", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: name}, Key: "k"}}}
}

func cmEnvFrom(name string, optional *bool) corev1.EnvFromSource {
	return corev1.EnvFromSource{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: name}, Optional: optional}}
}

func cmVolume(name string, optional *bool) corev1.Volume {
	return corev1.Volume{Name: "v-" + name, VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
		LocalObjectReference: corev1.LocalObjectReference{Name: name}, Optional: optional}}}
}

func projected(cm, secret string) corev1.Volume {
	return corev1.Volume{Name: "p", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
		{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: cm}}},
		{Secret: &corev1.SecretProjection{LocalObjectReference: corev1.LocalObjectReference{Name: secret}}},
		{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token"}},
	}}}}
}

func TestRefs(t *testing.T) {
	tests := []struct {
		name    string
		spec    corev1.PodSpec
		secrets bool
		want    []Ref
	}{
		{name: "no config", spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app"}}}, want: []Ref{}},
		{
			name: "every kind of reference, sorted, each once",
			spec: corev1.PodSpec{
				InitContainers: []corev1.Container{{Name: "init", EnvFrom: []corev1.EnvFromSource{cmEnvFrom("init-cfg", nil)}}},
				Containers: []corev1.Container{{Name: "app",
					Env:     []corev1.EnvVar{cmKeyRef("env-cfg", nil), {Name: "PLAIN", Value: "v"}, secretKeyRef("creds")},
					EnvFrom: []corev1.EnvFromSource{cmEnvFrom("env-cfg", nil)}}},
				EphemeralContainers: []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debug",
					Env: []corev1.EnvVar{cmKeyRef("debug-cfg", nil)}}}},
				Volumes: []corev1.Volume{cmVolume("vol-cfg", nil), projected("proj-cfg", "proj-secret"), {Name: "e", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
			},
			want: []Ref{{Kind: KindConfigMap, Name: "debug-cfg"}, {Kind: KindConfigMap, Name: "env-cfg"}, {Kind: KindConfigMap, Name: "init-cfg"},
				{Kind: KindConfigMap, Name: "proj-cfg"}, {Kind: KindConfigMap, Name: "vol-cfg"}},
		},
		{
			name:    "secrets only when turned on",
			spec:    corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Env: []corev1.EnvVar{secretKeyRef("creds")}}}, Volumes: []corev1.Volume{projected("p", "proj-secret")}, ImagePullSecrets: []corev1.LocalObjectReference{{Name: "pull"}}},
			secrets: true,
			want:    []Ref{{Kind: KindConfigMap, Name: "p"}, {Kind: KindSecret, Name: "creds"}, {Kind: KindSecret, Name: "proj-secret"}},
		},
		{
			name: "optional only when every reference is",
			spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app",
				Env: []corev1.EnvVar{cmKeyRef("both", yes), cmKeyRef("opt", yes)}, EnvFrom: []corev1.EnvFromSource{cmEnvFrom("both", no)}}},
				Volumes: []corev1.Volume{cmVolume("opt", yes)}},
			want: []Ref{{Kind: KindConfigMap, Name: "both"}, {Kind: KindConfigMap, Name: "opt", Optional: true}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, Refs(&tt.spec, tt.secrets))
		})
	}
}

func TestContentHash(t *testing.T) {
	a := ContentHash(map[string]string{"a": "1", "b": "2"}, nil)
	assert.Equal(t, a, ContentHash(map[string]string{"b": "2", "a": "1"}, nil), "order of keys does not matter")
	assert.Len(t, a, 32)
	for name, other := range map[string]string{
		"a value":           ContentHash(map[string]string{"a": "1", "b": "3"}, nil),
		"a key":             ContentHash(map[string]string{"a": "1", "c": "2"}, nil),
		"data as binary":    ContentHash(nil, map[string][]byte{"a": []byte("1"), "b": []byte("2")}),
		"nothing":           ContentHash(nil, nil),
		"binary data added": ContentHash(map[string]string{"a": "1", "b": "2"}, map[string][]byte{"x": {0}}),
	} {
		assert.NotEqual(t, a, other, name)
	}
}

func TestName(t *testing.T) {
	hash := ContentHash(map[string]string{"a": "1"}, nil)
	tests := []struct {
		name, source, want string
	}{
		{name: "short", source: "cfg", want: "cfg-dg-" + hash[:10]},
		{name: "a name with dots", source: "app.cfg", want: "app.cfg-dg-" + hash[:10]},
		{name: "longest possible", source: strings.Repeat("a", 253), want: strings.Repeat("a", 253-14) + "-dg-" + hash[:10]},
		{name: "cut at a dot or dash", source: strings.Repeat("a", 238) + ".-b" + strings.Repeat("c", 12), want: strings.Repeat("a", 238) + "-dg-" + hash[:10]},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Name(tt.source, hash)
			assert.Equal(t, tt.want, got)
			assert.Empty(t, validation.IsDNS1123Subdomain(got), "a valid ConfigMap and Secret name")
		})
	}
}

func TestIsSnapshot(t *testing.T) {
	hash := ContentHash(map[string]string{"a": "1"}, nil)
	labels := map[string]string{vocab.LabelSnapshot: "true"}
	of := map[string]string{vocab.AnnotationSnapshotOf: "cfg"}
	tests := []struct {
		name        string
		objName     string
		labels, ann map[string]string
		immutable   bool
		hash        string
		want        bool
	}{
		{name: "the guard's snapshot", objName: Name("cfg", hash), labels: labels, ann: of, immutable: true, hash: hash, want: true},
		{name: "mutable", objName: Name("cfg", hash), labels: labels, ann: of, hash: hash},
		{name: "data that is not the name's", objName: Name("cfg", hash), labels: labels, ann: of, immutable: true, hash: ContentHash(map[string]string{"a": "2"}, nil)},
		{name: "a tenant's labels on another name", objName: "cfg", labels: labels, ann: of, immutable: true, hash: hash},
		{name: "no label", objName: Name("cfg", hash), ann: of, immutable: true, hash: hash},
		{name: "no source", objName: Name("cfg", hash), labels: labels, immutable: true, hash: hash},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, IsSnapshot(tt.objName, tt.labels, tt.ann, tt.immutable, tt.hash))
		})
	}
}

func TestConfigMapSnapshot(t *testing.T) {
	rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "web-1", UID: "u1"}}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cfg", Namespace: "shop",
		Labels: map[string]string{"kustomize.toolkit.fluxcd.io/name": "shop"}}, Data: map[string]string{"a": "1"}, BinaryData: map[string][]byte{"b": {1}}}
	s := ConfigMapSnapshot(cm, rs)
	hash := ContentHash(cm.Data, cm.BinaryData)
	assert.Equal(t, Name("cfg", hash), s.Name)
	assert.Equal(t, "shop", s.Namespace)
	assert.Equal(t, map[string]string{vocab.LabelSnapshot: "true"}, s.Labels, "none of the source's labels: a GitOps tool would prune it")
	assert.Equal(t, "cfg", s.Annotations[vocab.AnnotationSnapshotOf])
	require.Len(t, s.OwnerReferences, 1)
	assert.Equal(t, metav1.OwnerReference{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-1", UID: "u1"}, s.OwnerReferences[0], "not the controller, no blockOwnerDeletion")
	assert.True(t, *s.Immutable)
	assert.True(t, IsSnapshot(s.Name, s.Labels, s.Annotations, true, ContentHash(s.Data, s.BinaryData)))

	sec := SecretSnapshot(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "tls", Namespace: "shop"}, Type: corev1.SecretTypeTLS, Data: map[string][]byte{"tls.crt": {1}}}, rs)
	assert.Equal(t, corev1.SecretTypeTLS, sec.Type)
	assert.True(t, *sec.Immutable)

	refs, added := WithOwner(s.OwnerReferences, rs)
	assert.False(t, added)
	assert.Len(t, refs, 1)
	rs2 := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "web-2", UID: "u2"}}
	refs, added = WithOwner(s.OwnerReferences, rs2)
	assert.True(t, added)
	assert.Len(t, refs, 2)
	assert.Len(t, s.OwnerReferences, 1, "input not modified")
}

func TestPlan(t *testing.T) {
	cm := func(name string) Ref { return Ref{Kind: KindConfigMap, Name: name} }
	lim := Limits{MaxObjects: 3, MaxBytes: 100, MaxRevisionBytes: 150}
	tests := []struct {
		name  string
		found []Found
		want  []rollout.ConfigSnapshot
	}{
		{
			name:  "a snapshot of each",
			found: []Found{{Ref: cm("a"), Exists: true, Hash: "aaaaaaaaaaaa", Size: 10}, {Ref: cm("b"), Exists: true, Hash: "bbbbbbbbbbbb", Size: 10}},
			want: []rollout.ConfigSnapshot{{Kind: KindConfigMap, Name: "a", Snapshot: "a-dg-aaaaaaaaaa", Hash: "aaaaaaaaaaaa"},
				{Kind: KindConfigMap, Name: "b", Snapshot: "b-dg-bbbbbbbbbb", Hash: "bbbbbbbbbbbb"}},
		},
		{
			name:  "a missing optional reference is absent, not an error",
			found: []Found{{Ref: Ref{Kind: KindConfigMap, Name: "opt", Optional: true}}},
			want:  []rollout.ConfigSnapshot{{Kind: KindConfigMap, Name: "opt", Absent: true}},
		},
		{
			name:  "a snapshot is not snapshotted again",
			found: []Found{{Ref: cm("a-dg-aaaaaaaaaa"), Exists: true, Hash: "aaaaaaaaaaaa", Size: 10, IsSnapshot: true}},
			want:  []rollout.ConfigSnapshot{{Kind: KindConfigMap, Name: "a-dg-aaaaaaaaaa", Snapshot: "a-dg-aaaaaaaaaa", Hash: "aaaaaaaaaaaa"}},
		},
		{
			name:  "too large alone; the others kept until the revision's bound",
			found: []Found{{Ref: cm("a"), Exists: true, Hash: "a1", Size: 101}, {Ref: cm("b"), Exists: true, Hash: "b1", Size: 100}, {Ref: cm("c"), Exists: true, Hash: "c1", Size: 60}},
			want: []rollout.ConfigSnapshot{{Kind: KindConfigMap, Name: "a", Hash: "a1", Skipped: "larger than 100 bytes"},
				{Kind: KindConfigMap, Name: "b", Snapshot: "b-dg-b1", Hash: "b1"},
				{Kind: KindConfigMap, Name: "c", Hash: "c1", Skipped: "the revision's snapshots would exceed 150 bytes"}},
		},
		{
			name:  "too many: none kept, nothing recorded",
			found: []Found{{Ref: cm("a"), Exists: true, Hash: "a1"}, {Ref: cm("b"), Exists: true, Hash: "b1"}, {Ref: cm("c"), Exists: true, Hash: "c1"}, {Ref: cm("d")}},
			want:  nil,
		},
		{
			name:  "cannot be copied",
			found: []Found{{Ref: Ref{Kind: KindSecret, Name: "tok"}, Exists: true, Hash: "t1", NotKept: "a service account token"}},
			want:  []rollout.ConfigSnapshot{{Kind: KindSecret, Name: "tok", Hash: "t1", Skipped: "a service account token"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, Plan(tt.found, lim))
		})
	}
}

func TestTooMany(t *testing.T) {
	assert.Empty(t, Limits{MaxObjects: 2}.TooMany(2))
	assert.Equal(t, "the revision references 3 config objects, more than 2", Limits{MaxObjects: 2}.TooMany(3))
	assert.Empty(t, Limits{}.TooMany(1000), "unbounded")
}

func TestPlanRestore(t *testing.T) {
	kept := rollout.ConfigSnapshot{Kind: KindConfigMap, Name: "cfg", Snapshot: "cfg-dg-1111111111", Hash: "11111111111111"}
	key := Key{KindConfigMap, "cfg"}
	tests := []struct {
		name string
		recs []rollout.ConfigSnapshot
		now  map[Key]Now
		want RestorePlan
	}{
		{name: "nothing drifted: the template as it ran", recs: []rollout.ConfigSnapshot{kept},
			now: map[Key]Now{key: {Exists: true, Hash: kept.Hash, SnapshotOK: true}}},
		{name: "changed: pointed at the snapshot", recs: []rollout.ConfigSnapshot{kept},
			now:  map[Key]Now{key: {Exists: true, Hash: "2222", SnapshotOK: true}},
			want: RestorePlan{Restore: []Restore{{Kind: KindConfigMap, Name: "cfg", Snapshot: kept.Snapshot}}}},
		{name: "deleted or pruned: pointed at the snapshot", recs: []rollout.ConfigSnapshot{kept},
			now:  map[Key]Now{key: {SnapshotOK: true}},
			want: RestorePlan{Restore: []Restore{{Kind: KindConfigMap, Name: "cfg", Snapshot: kept.Snapshot, Gone: true}}}},
		{name: "a snapshot replaced by a tenant is not used", recs: []rollout.ConfigSnapshot{kept},
			now:  map[Key]Now{key: {Exists: true, Hash: "2222"}},
			want: RestorePlan{Lost: []Lost{{Kind: KindConfigMap, Name: "cfg", Why: "changed since and its snapshot cfg-dg-1111111111 is gone or no longer holds the recorded data"}}}},
		{name: "nothing read is gone", recs: []rollout.ConfigSnapshot{kept},
			want: RestorePlan{Lost: []Lost{{Kind: KindConfigMap, Name: "cfg", Why: "was deleted since and its snapshot cfg-dg-1111111111 is gone or no longer holds the recorded data"}}}},
		{name: "skipped and changed", recs: []rollout.ConfigSnapshot{{Kind: KindConfigMap, Name: "cfg", Hash: "1", Skipped: "larger than 256 KiB"}},
			now:  map[Key]Now{key: {Exists: true, Hash: "2"}},
			want: RestorePlan{Lost: []Lost{{Kind: KindConfigMap, Name: "cfg", Why: "changed since and no snapshot was kept (larger than 256 KiB)"}}}},
		{name: "skipped, unchanged: nothing to say", recs: []rollout.ConfigSnapshot{{Kind: KindConfigMap, Name: "cfg", Hash: "1", Skipped: "larger than 256 KiB"}},
			now: map[Key]Now{key: {Exists: true, Hash: "1"}}},
		{name: "absent then and now", recs: []rollout.ConfigSnapshot{{Kind: KindConfigMap, Name: "cfg", Absent: true}}},
		{name: "absent then, there now", recs: []rollout.ConfigSnapshot{{Kind: KindConfigMap, Name: "cfg", Absent: true}},
			now:  map[Key]Now{key: {Exists: true, Hash: "1"}},
			want: RestorePlan{Lost: []Lost{{Kind: KindConfigMap, Name: "cfg", Why: "it did not exist when the revision ran; the restored pods read it as it is now"}}}},
		{name: "the template references a snapshot already, intact",
			recs: []rollout.ConfigSnapshot{{Kind: KindConfigMap, Name: "cfg-dg-1111111111", Snapshot: "cfg-dg-1111111111", Hash: "1"}},
			now:  map[Key]Now{{KindConfigMap, "cfg-dg-1111111111"}: {Exists: true, Hash: "1", SnapshotOK: true}}},
		{name: "the template references a snapshot already, gone",
			recs: []rollout.ConfigSnapshot{{Kind: KindConfigMap, Name: "cfg-dg-1111111111", Snapshot: "cfg-dg-1111111111", Hash: "1"}},
			want: RestorePlan{Lost: []Lost{{Kind: KindConfigMap, Name: "cfg-dg-1111111111", Why: "the snapshot it is was deleted since"}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, PlanRestore(tt.recs, tt.now))
		})
	}
}

func TestRewrite(t *testing.T) {
	tmpl := &corev1.PodTemplateSpec{Spec: corev1.PodSpec{
		InitContainers: []corev1.Container{{Name: "init", EnvFrom: []corev1.EnvFromSource{cmEnvFrom("cfg", nil)}}},
		Containers: []corev1.Container{{Name: "app",
			Env:     []corev1.EnvVar{cmKeyRef("cfg", yes), cmKeyRef("other", nil), secretKeyRef("creds")},
			EnvFrom: []corev1.EnvFromSource{cmEnvFrom("cfg", nil)}}},
		Volumes: []corev1.Volume{cmVolume("cfg", nil), projected("cfg", "creds"), cmVolume("other", nil)},
	}}
	got := Rewrite(tmpl, []Restore{{Kind: KindConfigMap, Name: "cfg", Snapshot: "cfg-dg-1"}, {Kind: KindSecret, Name: "creds", Snapshot: "creds-dg-2"}})

	assert.Equal(t, []Ref{{Kind: KindConfigMap, Name: "cfg-dg-1"}, {Kind: KindConfigMap, Name: "other"}, {Kind: KindSecret, Name: "creds-dg-2"}},
		Refs(&got.Spec, true), "every reference to cfg and creds points at their snapshots; other is left")
	assert.Equal(t, "k", got.Spec.Containers[0].Env[0].ValueFrom.ConfigMapKeyRef.Key, "keys kept")
	assert.Equal(t, yes, got.Spec.Containers[0].Env[0].ValueFrom.ConfigMapKeyRef.Optional, "optional kept")
	assert.Equal(t, "v-cfg", got.Spec.Volumes[0].Name, "volume names kept: the mounts still find them")
	assert.Equal(t, "cfg", tmpl.Spec.Volumes[0].ConfigMap.Name, "input not modified")
	assert.Equal(t, tmpl, Rewrite(tmpl, nil), "nothing to restore: the same template")
}

func TestSentence(t *testing.T) {
	assert.Empty(t, RestorePlan{}.Sentence())
	p := RestorePlan{
		Restore: []Restore{{Kind: KindConfigMap, Name: "cfg", Snapshot: "cfg-dg-1"}, {Kind: KindConfigMap, Name: "pruned", Snapshot: "pruned-dg-2", Gone: true}},
		Lost:    []Lost{{Kind: KindConfigMap, Name: "big", Why: "changed since and no snapshot was kept (larger than 256 KiB)"}},
	}
	assert.Equal(t, " Config restored: ConfigMap cfg from snapshot cfg-dg-1 (changed since), ConfigMap pruned from snapshot pruned-dg-2 (deleted since)."+
		" Config not restored: ConfigMap big (changed since and no snapshot was kept (larger than 256 KiB)).", p.Sentence())
}
