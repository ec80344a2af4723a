package reconciler

import (
	"encoding/json"
	"fmt"
	"maps"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/reconciler/vocab"
)

// bigPodSpec is a pod spec of the size the cache must not hold: many
// containers, each with env and resources, and volumes.
func bigPodSpec() corev1.PodSpec {
	var s corev1.PodSpec
	for i := range 20 {
		c := corev1.Container{Name: fmt.Sprintf("c%d", i), Image: fmt.Sprintf("registry.example/app-%d:v1", i),
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")}}}
		for j := range 20 {
			c.Env = append(c.Env, corev1.EnvVar{Name: fmt.Sprintf("VAR_%d", j), Value: fmt.Sprintf("value-%d-%d", i, j)})
		}
		s.Containers = append(s.Containers, c)
		s.Volumes = append(s.Volumes, corev1.Volume{Name: fmt.Sprintf("v%d", i), VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	}
	return s
}

// Rule 4: the cache transform strips every template the API server sends,
// whatever its annotations say. A tenant who writes the cache's own key,
// deployguard.io/cached-template-hash, on a Deployment or ReplicaSet (or in
// its pod template) keeps no pod spec in the guard's memory and chooses no
// hash: the hash is the template's own.
func TestStripForCacheIgnoresAForgedHash(t *testing.T) {
	const forged = "0123456789abcdef"
	forgeries := []struct {
		name                   string
		onMeta, onTmpl, asName bool
	}{
		{name: "none"},
		{name: "on the object's annotations", onMeta: true},
		{name: "on the template's annotations", onTmpl: true},
		{name: "on both", onMeta: true, onTmpl: true},
		{name: "as the template's name", asName: true},
		{name: "everywhere", onMeta: true, onTmpl: true, asName: true},
	}
	objects := map[string]func() (obj client.Object, meta *metav1.ObjectMeta, tmpl *corev1.PodTemplateSpec){
		"Deployment": func() (client.Object, *metav1.ObjectMeta, *corev1.PodTemplateSpec) {
			d := deployment()
			d.Spec.Template.Spec = bigPodSpec()
			return d, &d.ObjectMeta, &d.Spec.Template
		},
		"ReplicaSet": func() (client.Object, *metav1.ObjectMeta, *corev1.PodTemplateSpec) {
			rs := replicaSet(deployment(), 2, "web:v2")
			rs.Spec.Template.Spec = bigPodSpec()
			return rs, &rs.ObjectMeta, &rs.Spec.Template
		},
	}
	for kind, build := range objects {
		for _, f := range forgeries {
			t.Run(kind+", forged hash "+f.name, func(t *testing.T) {
				obj, meta, tmpl := build()
				if f.onMeta {
					meta.Annotations[rollout.CachedTemplateHash] = forged
				}
				if f.onTmpl {
					tmpl.Annotations[rollout.CachedTemplateHash] = forged
				}
				if f.asName {
					tmpl.Name = rollout.CachedTemplateHash + "=" + forged
				}
				want := vocab.TemplateHash(tmpl)

				_, err := StripForCache(obj)
				require.NoError(t, err)

				assert.Equal(t, corev1.PodSpec{}, tmpl.Spec, "no pod spec kept")
				assert.Equal(t, rollout.CachedTemplateHash+"="+want, tmpl.Name, "the template's own hash in its place")
				assert.Nil(t, tmpl.Annotations, "no map kept for the template's annotations")
				assert.Equal(t, want, rollout.TemplateHash(tmpl))
				assert.NotEqual(t, forged, rollout.TemplateHash(tmpl))

				// Idempotent: the transform of a cached object changes nothing.
				once := obj.DeepCopyObject()
				_, err = StripForCache(obj)
				require.NoError(t, err)
				assert.Equal(t, once, obj, "stripped twice is stripped once")
				assert.Equal(t, want, rollout.TemplateHash(tmpl))
			})
		}
	}
}

// The cache keeps, of a Deployment's or ReplicaSet's annotations, what the
// guard reads, each at most MaxCachedAnnotationBytes long: a tenant's
// annotation of the guard's domain that nothing reads, or one too long, costs
// no memory on the object or on the ReplicaSets it is copied to.
func TestStripForCacheKeepsOnlyTheAnnotationsTheGuardReads(t *testing.T) {
	long := strings.Repeat("x", MaxCachedAnnotationBytes+1)
	short := strings.Repeat("x", MaxCachedAnnotationBytes)
	in := map[string]string{
		vocab.Domain + "/notes":            strings.Repeat("x", 200_000), // read by nothing
		vocab.Domain + "/unknown":          "1",                          // read by nothing
		vocab.AnnotationAutoRollback:       "false",
		vocab.AnnotationFailFast:           long, // read, but too long
		vocab.AnnotationRollbackStatus:     short,
		vocab.LegacyAnnotationKnownGood:    "2026-01-01T00:00:00Z",
		vocab.RevisionAnnotation:           "3",
		corev1.LastAppliedConfigAnnotation: "{}",
		"kubernetes.io/change-cause":       "release 3",
		"team.example/owner":               "shop",
	}
	tests := []struct {
		name    string
		obj     func() (client.Object, *metav1.ObjectMeta)
		want    map[string]string
		trimmed bool
	}{
		{name: "Deployment: the guard's it reads, short, and the user's (policies may read them), marked trimmed",
			trimmed: true,
			obj:     func() (client.Object, *metav1.ObjectMeta) { d := deployment(); return d, &d.ObjectMeta },
			want: map[string]string{
				vocab.AnnotationAutoRollback: "false", vocab.AnnotationRollbackStatus: short,
				vocab.LegacyAnnotationKnownGood: "2026-01-01T00:00:00Z", vocab.RevisionAnnotation: "3",
				"kubernetes.io/change-cause": "release 3", "team.example/owner": "shop",
			}},
		{name: "ReplicaSet: its revision and the guard's it reads, short",
			obj: func() (client.Object, *metav1.ObjectMeta) {
				rs := replicaSet(deployment(), 3, "web:v3")
				return rs, &rs.ObjectMeta
			},
			want: map[string]string{
				vocab.AnnotationAutoRollback: "false", vocab.AnnotationRollbackStatus: short,
				vocab.LegacyAnnotationKnownGood: "2026-01-01T00:00:00Z", vocab.RevisionAnnotation: "3",
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			obj, meta := tt.obj()
			meta.Annotations = maps.Clone(in)
			_, err := StripForCache(obj)
			require.NoError(t, err)
			got := maps.Clone(meta.Annotations)
			_, marked := got[rollout.CacheTrimmed]
			delete(got, rollout.CacheTrimmed)
			assert.Equal(t, tt.want, got)
			assert.Equal(t, tt.trimmed, marked, "marked trimmed")
		})
	}
}

// The cache keeps a bounded part of a Deployment's other annotations (each
// value at most MaxCachedAnnotationBytes, all of them at most
// MaxCachedOtherAnnotationBytes) and marks a copy it trimmed with a hash of
// what it dropped; an incoming marker, a tenant's, never survives.
func TestStripForCacheBoundsADeploymentsOtherAnnotations(t *testing.T) {
	value := func(n int) string { return strings.Repeat("v", n) }
	// Four values that fill the total to the byte, with their keys.
	const key = "team.example/a"
	fill := MaxCachedOtherAnnotationBytes/4 - len(key)
	fourFull := map[string]string{}
	for _, k := range []string{"team.example/a", "team.example/b", "team.example/c", "team.example/d"} {
		fourFull[k] = value(fill)
	}
	tests := []struct {
		name    string
		in      map[string]string
		want    map[string]string
		trimmed bool
	}{
		{name: "none", in: nil, want: nil},
		{name: "short ones are kept whole, unmarked",
			in:   map[string]string{"team.example/owner": "shop", vocab.RevisionAnnotation: "3"},
			want: map[string]string{"team.example/owner": "shop", vocab.RevisionAnnotation: "3"}},
		{name: "a value at the cap is kept", in: map[string]string{key: value(MaxCachedAnnotationBytes)},
			want: map[string]string{key: value(MaxCachedAnnotationBytes)}},
		{name: "a value over the cap is dropped, marked",
			in:      map[string]string{key: value(MaxCachedAnnotationBytes + 1), "team.example/owner": "shop"},
			want:    map[string]string{"team.example/owner": "shop"},
			trimmed: true},
		{name: "a 250 KB one is dropped, marked", in: map[string]string{key: value(250_000)}, want: map[string]string{}, trimmed: true},
		{name: "the total to the byte is kept", in: fourFull, want: fourFull},
		{name: "past the total, the later keys are dropped, marked",
			in:      func() map[string]string { m := maps.Clone(fourFull); m["team.example/e"] = "x"; return m }(),
			want:    fourFull,
			trimmed: true},
		{name: "kubectl's last-applied configuration is dropped, marked",
			in:      map[string]string{corev1.LastAppliedConfigAnnotation: "{}", "team.example/owner": "shop"},
			want:    map[string]string{"team.example/owner": "shop"},
			trimmed: true},
		{name: "a tenant's marker is dropped, and marks nothing",
			in:   map[string]string{rollout.CacheTrimmed: "forged", "team.example/owner": "shop"},
			want: map[string]string{"team.example/owner": "shop"}},
		{name: "a tenant's marker alone leaves nothing", in: map[string]string{rollout.CacheTrimmed: ""}, want: nil},
		{name: "a tenant's marker on a trimmed object is replaced by the transform's",
			in:      map[string]string{rollout.CacheTrimmed: "forged", key: value(250_000)},
			want:    map[string]string{},
			trimmed: true},
		{name: "the revision is kept, and not counted, whatever sorts before it",
			in: func() map[string]string {
				m := map[string]string{vocab.RevisionAnnotation: "3"}
				for k, v := range fourFull {
					m["app.example/"+strings.TrimPrefix(k, "team.example/")] = v
				}
				return m
			}(),
			want: func() map[string]string {
				m := map[string]string{vocab.RevisionAnnotation: "3"}
				for k, v := range fourFull {
					m["app.example/"+strings.TrimPrefix(k, "team.example/")] = v
				}
				return m
			}()},
		{name: "a revision over the cap is dropped, marked",
			in:      map[string]string{vocab.RevisionAnnotation: value(MaxCachedAnnotationBytes + 1)},
			want:    map[string]string{},
			trimmed: true},
		{name: "the guard's annotations do not count against the total",
			in: func() map[string]string {
				m := maps.Clone(fourFull)
				m[vocab.AnnotationRollbackStatus] = value(MaxCachedAnnotationBytes)
				return m
			}(),
			want: func() map[string]string {
				m := maps.Clone(fourFull)
				m[vocab.AnnotationRollbackStatus] = value(MaxCachedAnnotationBytes)
				return m
			}()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := deployment()
			d.Annotations = maps.Clone(tt.in)
			_, err := StripForCache(d)
			require.NoError(t, err)
			got := maps.Clone(d.Annotations)
			mark, marked := got[rollout.CacheTrimmed]
			delete(got, rollout.CacheTrimmed)
			if len(tt.want) == 0 {
				assert.Empty(t, got)
			} else {
				assert.Equal(t, tt.want, got)
			}
			assert.Equal(t, tt.trimmed, marked, "marked trimmed")
			if marked {
				assert.NotEqual(t, "forged", mark)
				assert.Len(t, mark, 16, "the marker is a short hash")
			}
		})
	}
}

// The marker changes with what was dropped: a change of a dropped annotation
// is a change of the cached copy (the audit judges the Deployment again).
func TestStripForCacheMarkerFollowsWhatWasDropped(t *testing.T) {
	mark := func(v string) string {
		d := deployment()
		d.Annotations = map[string]string{"team.example/notes": v}
		_, err := StripForCache(d)
		require.NoError(t, err)
		return d.Annotations[rollout.CacheTrimmed]
	}
	a, b := mark(strings.Repeat("a", 250_000)), mark(strings.Repeat("b", 250_000))
	require.NotEmpty(t, a)
	assert.NotEqual(t, a, b)
	assert.Equal(t, a, mark(strings.Repeat("a", 250_000)), "the same annotations, the same marker")
}

// BenchmarkCacheOfLargeTemplates measures what the cache keeps of a
// Deployment or ReplicaSet with an 800 KB pod template, as the informer gets
// it (decoded from JSON, then StripForCache): plain; with the annotation that
// an earlier release's cache trusted (forged=hash); and with a 200 KB
// deployguard.io/* annotation a tenant wrote (forged=annotation), which the
// Deployment controller copies onto every new ReplicaSet; and with 250 KB of
// ordinary annotations (forged=ordinary), five of 50 KB. retained-B/op is
// the heap the kept object holds (a few KB of noise at small counts). Run:
// go test -run XXX -bench CacheOfLargeTemplates -benchtime 1000x ./reconciler/
func BenchmarkCacheOfLargeTemplates(b *testing.B) {
	spec := bigPodSpec()
	// About 800 KB of env values in the first container.
	for i := range 800 {
		spec.Containers[0].Env = append(spec.Containers[0].Env, corev1.EnvVar{Name: fmt.Sprintf("BIG_%d", i), Value: strings.Repeat("x", 1000)})
	}
	objects := []struct {
		kind   string
		build  func() (client.Object, *metav1.ObjectMeta, *corev1.PodTemplateSpec)
		decode func() client.Object
	}{
		{"Deployment", func() (client.Object, *metav1.ObjectMeta, *corev1.PodTemplateSpec) {
			d := deployment()
			return d, &d.ObjectMeta, &d.Spec.Template
		}, func() client.Object { return &appsv1.Deployment{} }},
		{"ReplicaSet", func() (client.Object, *metav1.ObjectMeta, *corev1.PodTemplateSpec) {
			rs := replicaSet(deployment(), 2, "web:v2")
			return rs, &rs.ObjectMeta, &rs.Spec.Template
		}, func() client.Object { return &appsv1.ReplicaSet{} }},
	}
	for _, o := range objects {
		for _, forged := range []string{"none", "hash", "annotation", "ordinary"} {
			b.Run(fmt.Sprintf("%s/forged=%s", o.kind, forged), func(b *testing.B) {
				obj, meta, tmpl := o.build()
				tmpl.Spec = spec
				switch forged {
				case "hash":
					meta.Annotations[vocab.Domain+"/cached-template-hash"] = "forged"
					tmpl.Annotations = map[string]string{vocab.Domain + "/cached-template-hash": "forged"}
				case "annotation":
					meta.Annotations[vocab.Domain+"/notes"] = strings.Repeat("x", 200_000)
				case "ordinary":
					// 250 KB of a tenant's own annotations, under the API
					// server's 256 KiB: what a policy may read.
					for i := range 5 {
						meta.Annotations[fmt.Sprintf("team.example/notes-%d", i)] = strings.Repeat("x", 50_000)
					}
				}
				raw, err := json.Marshal(obj)
				require.NoError(b, err)
				kept := make([]any, 0, b.N)
				runtime.GC()
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				b.ResetTimer()
				for range b.N {
					o := o.decode()
					if err := json.Unmarshal(raw, o); err != nil {
						b.Fatal(err)
					}
					s, err := StripForCache(o)
					if err != nil {
						b.Fatal(err)
					}
					kept = append(kept, s)
				}
				b.StopTimer()
				runtime.GC()
				runtime.ReadMemStats(&after)
				b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/float64(b.N), "retained-B/op")
				b.ReportMetric(float64(len(raw)), "object-B")
				runtime.KeepAlive(kept)
			})
		}
	}
}

// A ReplicaSet's owner references and finalizers are a tenant's to write,
// as many as fit in the object: the cache keeps its controller reference
// alone, which is all the reconciler reads (its index and its watch), and no
// finalizer.
func TestStripForCacheKeepsOnlyAReplicaSetsController(t *testing.T) {
	other := func(i int) metav1.OwnerReference {
		return metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: fmt.Sprintf("o-%d", i), UID: types.UID(fmt.Sprintf("uid-%d", i))}
	}
	d := deployment()
	ctrl := replicaSet(d, 2, "web:v2").OwnerReferences[0]
	many := []metav1.OwnerReference{other(0), other(1), ctrl}
	for i := range 500 {
		many = append(many, other(2+i))
	}
	for _, tc := range []struct {
		name           string
		owners         []metav1.OwnerReference
		keepController bool
	}{
		{"the Deployment alone", []metav1.OwnerReference{ctrl}, true},
		{"the Deployment among 502 others", many, true},
		{"no controller", []metav1.OwnerReference{other(0), other(1)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := replicaSet(d, 2, "web:v2")
			rs.OwnerReferences = tc.owners
			for i := range 500 {
				rs.Finalizers = append(rs.Finalizers, fmt.Sprintf("team.example.com/f-%d", i))
			}
			got, err := StripForCache(rs)
			require.NoError(t, err)
			kept := got.(*appsv1.ReplicaSet)
			assert.Nil(t, kept.Finalizers)
			assert.LessOrEqual(t, cap(kept.OwnerReferences), 1, "the others are not held")
			if !tc.keepController {
				assert.Nil(t, kept.OwnerReferences)
				return
			}
			assert.Equal(t, []metav1.OwnerReference{ctrl}, kept.OwnerReferences)
			assert.Equal(t, []string{d.Name}, indexReplicaSetByController(kept), "the index still finds its Deployment")
		})
	}
}
