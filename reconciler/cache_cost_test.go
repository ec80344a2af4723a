package reconciler

import (
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/deployguard/deployguard/reconciler/vocab"
)

// servedDeployment is the i-th Deployment of a large cluster as the API
// server sends it to the informer: a chart's labels and annotations, a pod
// template of 2 containers with 30 env vars, probes and resources,
// managedFields and kubectl's last-applied configuration, and its status.
// Names, UIDs and resourceVersions are its own; the namespace one of 500.
func servedDeployment(i int) *appsv1.Deployment {
	name := fmt.Sprintf("app-%05d", i)
	labels := map[string]string{"app.kubernetes.io/name": name, "app.kubernetes.io/instance": name, "app.kubernetes.io/part-of": "shop",
		"app.kubernetes.io/managed-by": "Helm", "helm.sh/chart": "shop-1.4.2"}
	pod := map[string]string{"app.kubernetes.io/name": name, "app.kubernetes.io/instance": name, "app.kubernetes.io/version": "1.0.0"}
	var cs []corev1.Container
	for c := range 2 {
		ct := corev1.Container{Name: fmt.Sprintf("c%d", c), Image: fmt.Sprintf("registry.example.com/shop/c%d:1.0.%d", c, i%7),
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
			Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
				Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")},
			},
			ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/ready", Port: intstr.FromInt32(8080)}}},
		}
		for e := range 30 {
			ct.Env = append(ct.Env, corev1.EnvVar{Name: fmt.Sprintf("SETTING_%02d", e), Value: fmt.Sprintf("value-%02d-of-%s", e, name)})
		}
		cs = append(cs, ct)
	}
	fields := make([]byte, 0, 2048)
	fields = append(fields, `{"f:metadata":{"f:labels":{`...)
	for k := range labels {
		fields = append(fields, fmt.Sprintf(`"f:%s":{},`, k)...)
	}
	fields = append(fields, `}},"f:spec":{"f:template":{"f:spec":{"f:containers":{"k:{\"name\":\"c0\"}":{"f:env":{}}}}}}}`...)
	now := metav1.NewTime(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: fmt.Sprintf("team-%03d", i%500), Name: name, UID: types.UID(fmt.Sprintf("0b9c1e4a-%04d-4f6e-9a0c-%012d", i%10000, i)),
			ResourceVersion: fmt.Sprint(1_000_000 + i), Generation: 3, CreationTimestamp: now, Labels: labels,
			Annotations: map[string]string{vocab.RevisionAnnotation: "3", "meta.helm.sh/release-name": name, "meta.helm.sh/release-namespace": fmt.Sprintf("team-%03d", i%500),
				corev1.LastAppliedConfigAnnotation: string(make([]byte, 3000))},
			ManagedFields: []metav1.ManagedFieldsEntry{
				{Manager: "helm", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "apps/v1", Time: &now, FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(string(fields))},
				{Manager: "kube-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "apps/v1", Time: &now, FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(string(fields)), Subresource: "status"},
			},
		},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2), RevisionHistoryLimit: ptr.To[int32](10), ProgressDeadlineSeconds: ptr.To[int32](600),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": name, "app.kubernetes.io/instance": name}},
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType, RollingUpdate: &appsv1.RollingUpdateDeployment{
				MaxUnavailable: ptr.To(intstr.FromString("25%")), MaxSurge: ptr.To(intstr.FromString("25%"))}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: pod},
				Spec: corev1.PodSpec{Containers: cs, RestartPolicy: corev1.RestartPolicyAlways, DNSPolicy: corev1.DNSClusterFirst}},
		},
		Status: appsv1.DeploymentStatus{ObservedGeneration: 3, Replicas: 2, UpdatedReplicas: 2, ReadyReplicas: 2, AvailableReplicas: 2,
			Conditions: []appsv1.DeploymentCondition{
				{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue, LastUpdateTime: now, LastTransitionTime: now, Reason: "MinimumReplicasAvailable", Message: "Deployment has minimum availability."},
				{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionTrue, LastUpdateTime: now, LastTransitionTime: now, Reason: "NewReplicaSetAvailable", Message: fmt.Sprintf(`ReplicaSet "%s-5d8f7c9b4" has successfully progressed.`, name)},
			}},
	}
}

// servedReplicaSet is revision rev of d as the Deployment controller writes
// it: d's template with its pod-template-hash, d's annotations, an owner
// reference, managedFields.
func servedReplicaSet(d *appsv1.Deployment, rev int) *appsv1.ReplicaSet {
	hash := fmt.Sprintf("5d8f7c9b%d", rev)
	tmpl := *d.Spec.Template.DeepCopy()
	tmpl.Labels[appsv1.DefaultDeploymentUniqueLabelKey] = hash
	sel := d.Spec.Selector.DeepCopy()
	sel.MatchLabels[appsv1.DefaultDeploymentUniqueLabelKey] = hash
	annotations := map[string]string{vocab.RevisionAnnotation: fmt.Sprint(rev), "deployment.kubernetes.io/desired-replicas": "2", "deployment.kubernetes.io/max-replicas": "3",
		"meta.helm.sh/release-name": d.Name, "meta.helm.sh/release-namespace": d.Namespace}
	replicas := int32(0)
	if rev == 3 {
		replicas = 2
	}
	return &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: d.Namespace, Name: d.Name + "-" + hash, UID: types.UID(string(d.UID)[:len(d.UID)-1] + fmt.Sprint(rev)),
			ResourceVersion: fmt.Sprint(2_000_000 + rev), Generation: 1, CreationTimestamp: d.CreationTimestamp,
			Labels: tmpl.Labels, Annotations: annotations,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "Deployment", Name: d.Name, UID: d.UID, Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}},
			ManagedFields:   d.ManagedFields,
		},
		Spec:   appsv1.ReplicaSetSpec{Replicas: &replicas, Selector: sel, Template: tmpl},
		Status: appsv1.ReplicaSetStatus{Replicas: replicas, ReadyReplicas: replicas, AvailableReplicas: replicas, FullyLabeledReplicas: replicas, ObservedGeneration: 1},
	}
}

// BenchmarkCacheCostPerDeployment measures the heap the informers keep for
// one Deployment and its 3 ReplicaSets of a large cluster (servedDeployment),
// as they get them: decoded from protobuf, then transformed, one after the
// other, with each lever of the cache transform:
//   - none: the objects as served;
//   - managed-fields: managedFields dropped (controller-runtime's default);
//   - strip: StripForCache, what the guard runs;
//   - strip+rs-metadata: StripForCache of the Deployments, and the
//     ReplicaSets as a metadata-only informer gets and keeps them: only
//     their metadata served (PartialObjectMetadata), with StripForCache's
//     labels and annotations. Not built: the reconciler reads a
//     ReplicaSet's template hash, and its ready replicas;
//   - strip+tenant-labels: StripForCache, each Deployment written with 200
//     more labels on itself and on its pod template (tenantLabels), as a
//     tenant with the edit role could before deployguard-refusals bounded
//     their number (64 a set): what the cache keeps of them.
//
// Per Deployment, its ReplicaSets included: retained-B/op is the bytes of
// the objects kept (HeapAlloc after a collection), inuse-B/op the heap in
// use they cost (HeapInuse): a span stays in use for any object it holds,
// and the kept objects are spread among the decoder's garbage, the more so
// the fewer the collections. Run with the deployed GOGC=400 and 20,000 or
// more for a stable figure; CACHE_COST_PROFILE=FILE writes a heap profile of
// what one lever keeps:
// GOGC=400 go test -run XXX -bench CacheCostPerDeployment -benchtime 20000x ./reconciler/
func BenchmarkCacheCostPerDeployment(b *testing.B) {
	noManagedFields := func(o any) any {
		o.(metav1.Object).SetManagedFields(nil)
		return o
	}
	strip := func(o any) any {
		s, _ := StripForCache(o)
		return s
	}
	levers := []struct {
		name      string
		transform func(any) any
	}{
		{"none", func(o any) any { return o }},
		{"managed-fields", noManagedFields},
		{"strip", strip},
	}
	for _, l := range levers {
		b.Run(l.name, func(b *testing.B) { cacheCost(b, l.transform, served{}) })
	}
	b.Run("strip+tenant-labels", func(b *testing.B) { cacheCost(b, strip, served{tenantLabels: true}) })
	b.Run("strip+rs-metadata", func(b *testing.B) {
		cacheCost(b, func(o any) any {
			if m, ok := o.(*metav1.PartialObjectMetadata); ok {
				rs := &appsv1.ReplicaSet{ObjectMeta: m.ObjectMeta}
				_, _ = StripForCache(rs)
				m.ObjectMeta = rs.ObjectMeta
				return m
			}
			return strip(o)
		}, served{metadataOnly: true})
	})
}

// served is how cacheCost serves the objects: with metadataOnly, the
// ReplicaSets as PartialObjectMetadata; with tenantLabels, each Deployment
// carrying tenantLabels' labels (and its ReplicaSets, as the Deployment
// controller copies its template's).
type served struct{ metadataOnly, tenantLabels bool }

// tenantLabels adds to d what the API server admits and the cache keeps
// whole: 200 labels of 123 bytes (a 60-byte key, a 63-byte value) on the
// Deployment and as many on its pod template, about 48 KB. The API server
// bounds a label's key and value, not their number.
func tenantLabels(d *appsv1.Deployment) {
	for i := range 200 {
		k, v := fmt.Sprintf("tenant.example.com/label-%035d", i), fmt.Sprintf("%063d", i)
		d.Labels[k] = v
		d.Spec.Template.Labels[k] = v
	}
}

// cacheCost keeps b.N Deployments and their ReplicaSets, decoded and
// transformed, and reports what they cost (BenchmarkCacheCostPerDeployment).
func cacheCost(b *testing.B, transform func(any) any, how served) {
	metadataOnly := how.metadataOnly
	// What the API server sends is made as it is read, not beforehand: a
	// heap holding every object served would set the collector's pace, and
	// a collection is what lets a kept object take the place of garbage.
	serve := func(i int) (d []byte, rss [][]byte) {
		served := servedDeployment(i)
		if how.tenantLabels {
			tenantLabels(served)
		}
		d, err := served.Marshal()
		if err != nil {
			b.Fatal(err)
		}
		for rev := 1; rev <= 3; rev++ {
			rs := servedReplicaSet(served, rev)
			raw, err := rs.Marshal()
			if metadataOnly {
				raw, err = (&metav1.PartialObjectMetadata{ObjectMeta: rs.ObjectMeta}).Marshal()
			}
			if err != nil {
				b.Fatal(err)
			}
			rss = append(rss, raw)
		}
		return d, rss
	}
	kept := make([]any, 0, 4*b.N)
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		raw, rss := serve(i)
		b.StartTimer()
		d := &appsv1.Deployment{}
		if err := d.Unmarshal(raw); err != nil {
			b.Fatal(err)
		}
		kept = append(kept, transform(d))
		for _, raw := range rss {
			var rs interface{ Unmarshal([]byte) error } = &appsv1.ReplicaSet{}
			if metadataOnly {
				rs = &metav1.PartialObjectMetadata{}
			}
			if err := rs.Unmarshal(raw); err != nil {
				b.Fatal(err)
			}
			kept = append(kept, transform(rs))
		}
	}
	b.StopTimer()
	runtime.GC()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(b.N), "retained-B/op")
	b.ReportMetric(float64(after.HeapInuse-before.HeapInuse)/float64(b.N), "inuse-B/op")
	if f := os.Getenv("CACHE_COST_PROFILE"); f != "" {
		out, err := os.Create(f)
		if err != nil {
			b.Fatal(err)
		}
		_ = pprof.WriteHeapProfile(out)
		_ = out.Close()
	}
	runtime.KeepAlive(kept)
}
