package review

import (
	"fmt"
	"runtime"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// BenchmarkOverlapIndexPerDeployment measures what the overlap index keeps
// per Deployment (retained-B/op, after a collection) for Deployments of a
// chart's shape, 100 per namespace: a selector on the app's name and
// instance, and pods labelled with both and a version the namespace shares.
// The Deployments themselves exist before and are not counted.
// go test -run XXX -bench OverlapIndexPerDeployment -benchtime 20000x ./webhook/review/
func BenchmarkOverlapIndexPerDeployment(b *testing.B) {
	ds := make([]*appsv1.Deployment, b.N)
	for i := range ds {
		name := fmt.Sprintf("app-%05d", i)
		sel := map[string]string{"app.kubernetes.io/name": name, "app.kubernetes.io/instance": name}
		pod := map[string]string{"app.kubernetes.io/name": name, "app.kubernetes.io/instance": name, "app.kubernetes.io/version": "1.0.0"}
		ds[i] = &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("team-%03d", i%(b.N/100+1)), Name: name},
			Spec: appsv1.DeploymentSpec{
				Selector: &metav1.LabelSelector{MatchLabels: sel},
				Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: pod}},
			},
		}
	}
	x := NewOverlapIndex(nil)
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	b.ResetTimer()
	for _, d := range ds {
		x.Set(d)
	}
	b.StopTimer()
	runtime.GC()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(b.N), "retained-B/op")
	if x.Len() != b.N {
		b.Fatalf("filed %d of %d", x.Len(), b.N)
	}
	runtime.KeepAlive(ds)
}

// names holds one name as a string and more in a map, and goes back to a
// string at one: every sequence of adds and removes leaves the set a map
// would.
func TestNamesIsASet(t *testing.T) {
	ops := []struct {
		add  bool
		name string
		want []string
	}{
		{true, "a", []string{"a"}},
		{true, "a", []string{"a"}},
		{false, "b", []string{"a"}},
		{true, "b", []string{"a", "b"}},
		{true, "c", []string{"a", "b", "c"}},
		{false, "a", []string{"b", "c"}},
		{false, "c", []string{"b"}},
		{true, "b", []string{"b"}},
		{false, "b", nil},
		{false, "b", nil},
		{true, "d", []string{"d"}},
	}
	var n names
	for i, op := range ops {
		if op.add {
			n = n.with(op.name)
		} else {
			n = n.without(op.name)
		}
		var got []string
		n.each(func(s string) { got = append(got, s) })
		slices.Sort(got)
		if !slices.Equal(got, op.want) || n.len() != len(op.want) {
			t.Fatalf("step %d (add=%v %s): got %v (len %d), want %v", i, op.add, op.name, got, n.len(), op.want)
		}
		if len(op.want) <= 1 && n.many != nil {
			t.Fatalf("step %d: %d name(s) kept in a map", i, len(op.want))
		}
	}
}
