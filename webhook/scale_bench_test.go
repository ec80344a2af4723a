package webhook

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/deployguard/deployguard/policy"
	"github.com/deployguard/deployguard/webhook/exception"
	"github.com/deployguard/deployguard/webhook/review"
	"github.com/deployguard/deployguard/webhook/review/reviewtest"
)

// BenchmarkValidatingAtClusterSize answers issue 56's "admission p99 at
// 50,000 within 1.5× of 1,000" with an instrument steadier than a busy
// cluster: the default install's validating webhook (as
// BenchmarkValidatingDefaultInstall) in a guard that holds a cluster of n
// Deployments, 100 a namespace as bench-scale fills it, each with its own
// PodDisruptionBudget, one PolicyException per 50, and the heap the
// guard's cache keeps for them: three copies of a realistic Deployment each
// (about 40 KB, the guard's measured live heap per Deployment being 34 KiB),
// so that the collector marks what it would at that size, with the deployed
// GOGC=400. The request is a CREATE in one of those namespaces, admitted.
// Reported per request: p50 and p99 (ns), besides the mean and allocations;
// heap-MiB is the heap in use once the cluster is held.
//
//	go test -run '^$' -bench ValidatingAtClusterSize -benchtime 20000x ./webhook/
func BenchmarkValidatingAtClusterSize(b *testing.B) {
	for _, n := range []int{1_000, 50_000} {
		b.Run(fmt.Sprintf("deployments=%d", n), func(b *testing.B) { benchmarkValidatingAt(b, n) })
	}
}

func benchmarkValidatingAt(b *testing.B, n int) {
	defer debug.SetGCPercent(debug.SetGCPercent(400))
	ctrllog.SetLogger(logr.Discard()) // as unset, without the warning
	eng, err := policy.New(policy.Options{})
	require.NoError(b, err)
	require.NoError(b, eng.Load(context.Background(), policy.Builtins()))

	overlaps := review.NewOverlapIndex(nil)
	budgets := review.NewBudgetIndex(overlaps)
	exceptions := exception.NewIndex("deployguard-system")
	one := intstr.FromInt32(1)
	template := realistic()
	kept := make([]*appsv1.Deployment, 0, 3*n)
	for i := range n {
		ns := fmt.Sprintf("team-%03d", i/100)
		if i/100 == 7 {
			ns = "shop" // the request's namespace: 100 others beside it
		}
		name := fmt.Sprintf("app-%05d", i)
		d := reviewtest.Guarded(func(d *appsv1.Deployment) {
			d.Namespace, d.Name = ns, name
			d.Spec.Selector.MatchLabels["app.kubernetes.io/name"] = name
			d.Spec.Template.Labels["app.kubernetes.io/name"] = name
			d.Spec.Template.Labels["app.kubernetes.io/part-of"] = "shop"
		})
		overlaps.Set(d)
		budgets.Set(reviewtest.BudgetIn(ns, name, &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": name}}, &one))
		if i%50 == 0 {
			exceptions.Set(&exception.PolicyException{
				ObjectMeta: metav1.ObjectMeta{Namespace: "deployguard-system", Name: "ex-" + name},
				Spec: exception.Spec{Match: exception.Match{Namespace: ns, Names: []string{name}}, Policies: []string{"images"},
					ExpiresAt: metav1.NewTime(time.Now().Add(time.Hour)), Owner: "o", Reason: "r"},
			})
		}
		for range 3 {
			c := template.DeepCopy()
			c.Namespace, c.Name = ns, name
			kept = append(kept, c)
		}
	}
	if overlaps.Len() != n || budgets.Len() != n {
		b.Fatal("the indexes hold the cluster")
	}

	validating, d := defaultInstallValidating(b, &review.Reviewer{Options: reviewtest.Options(), Overlaps: overlaps, Budgets: budgets,
		Exceptions: exceptions, Policies: review.RegoPolicies{Engine: eng}})
	body := reviewBody(b, admissionv1.Create, d, nil)
	if w := post(validating, body); !strings.Contains(w.Body.String(), `"allowed":true`) {
		b.Fatalf("not admitted: %.500s", w.Body.String())
	}

	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	timeEach(b, func() {
		if w := post(validating, body); w.Code != http.StatusOK {
			b.Fatalf("validating: %d", w.Code)
		}
	})
	b.ReportMetric(float64(ms.HeapInuse)/(1<<20), "heap-MiB")
	runtime.KeepAlive(kept)
}
