package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	jsonpatch5 "github.com/evanphx/json-patch/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"
	"sigs.k8s.io/structured-merge-diff/v6/value"

	"github.com/deployguard/deployguard/policy"
	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/webhook/exception"
	"github.com/deployguard/deployguard/webhook/native"
	"github.com/deployguard/deployguard/webhook/native/floor"
	"github.com/deployguard/deployguard/webhook/review"
	"github.com/deployguard/deployguard/webhook/review/reviewtest"
)

// servers returns the two webhooks as HTTP handlers, with panics left to
// surface (controller-runtime recovers them by default, which would hide them
// from the fuzzer).
func servers(t testing.TB) (mutating, validating http.Handler) {
	t.Helper()
	return serversWith(t, nil)
}

func serversWith(t testing.TB, p review.Policies) (mutating, validating http.Handler) {
	t.Helper()
	m, v := (&Hooks{Reviewer: fuzzReviewer(p)}).Handlers(nil)
	no := false
	m.RecoverPanic, v.RecoverPanic = &no, &no
	return m, v
}

// fuzzReviewer is the handlers' reviewer in the handler tests: the test
// options, with one other Deployment to overlap with.
func fuzzReviewer(p review.Policies) *review.Reviewer {
	return &review.Reviewer{Options: reviewtest.Options(), Overlaps: reviewtest.Index(reviewtest.Guarded(func(d *appsv1.Deployment) { d.Name = "other" })), Policies: p}
}

// realistic is a Deployment of the size and shape seen in production: several
// containers with env, probes, resources, volumes; about 8 KB as JSON.
func realistic() *appsv1.Deployment {
	d := reviewtest.Stored()
	d.Labels = map[string]string{"app.kubernetes.io/name": "web", "app.kubernetes.io/part-of": "shop", "team": "checkout"}
	d.Annotations = map[string]string{"kubernetes.io/change-cause": "release 2026.11.21-1", "owner": "checkout@example.com"}
	var containers []corev1.Container
	for i := range 3 {
		c := corev1.Container{
			Name:  fmt.Sprintf("c%d", i),
			Image: fmt.Sprintf("registry.example.com/shop/c%d:2026.11.21@sha256:%064d", i, i),
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: int32(8080 + i)}},
			Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
				Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")},
			},
			ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/ready", Port: intstr.FromString("http")}}},
			LivenessProbe:  &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/live", Port: intstr.FromString("http")}}},
			VolumeMounts:   []corev1.VolumeMount{{Name: "config", MountPath: "/etc/app"}, {Name: "cache", MountPath: "/cache"}},
		}
		for j := range 20 {
			c.Env = append(c.Env, corev1.EnvVar{Name: fmt.Sprintf("SETTING_%02d", j), Value: strings.Repeat("v", 30)})
		}
		containers = append(containers, c)
	}
	d.Spec.Template.Spec.Containers = containers
	d.Spec.Template.Spec.Volumes = []corev1.Volume{
		{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "web-config"}}}},
		{Name: "cache", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
	}
	review.APIServerDefaults(d)
	return d
}

// withManagedFields is d as the API server hands it to a webhook: with the
// managed fields of the one manager that wrote every field it has (about
// a third of the object's bytes), which the API server records before
// admission.
func withManagedFields(t testing.TB, d *appsv1.Deployment) *appsv1.Deployment {
	t.Helper()
	d = d.DeepCopy()
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(d)
	require.NoError(t, err)
	delete(u, "status")
	fields, err := fieldpath.SetFromValue(value.NewValueInterface(u)).ToJSON()
	require.NoError(t, err)
	d.ManagedFields = []metav1.ManagedFieldsEntry{{
		Manager: "kubectl-client-side-apply", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "apps/v1",
		Time: &metav1.Time{Time: time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)}, FieldsType: "FieldsV1",
		FieldsV1: metav1.NewFieldsV1(string(fields)),
	}}
	return d
}

func reviewBody(t testing.TB, op admissionv1.Operation, obj, old runtime.Object) []byte {
	t.Helper()
	req := &admissionv1.AdmissionRequest{
		UID:       types.UID("0d1f3c1e-2b7a-4c4e-9d4e-1f2a3b4c5d6e"),
		Kind:      deploymentKind.gvk,
		Resource:  metav1.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"},
		Name:      "web",
		Namespace: "shop",
		Operation: op,
		UserInfo:  authenticationv1.UserInfo{Username: "alice"},
	}
	if obj != nil {
		req.Object = runtime.RawExtension{Raw: mustJSON(t, obj)}
	}
	if old != nil {
		req.OldObject = runtime.RawExtension{Raw: mustJSON(t, old)}
	}
	return mustJSON(t, &admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request:  req,
	})
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}

func post(h http.Handler, body []byte) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func decodeResponse(t testing.TB, w *httptest.ResponseRecorder) *admissionv1.AdmissionResponse {
	t.Helper()
	var out admissionv1.AdmissionReview
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &out), "body: %s", w.Body.String())
	require.NotNil(t, out.Response, "body: %s", w.Body.String())
	return out.Response
}

func TestHandlersOnBadInput(t *testing.T) {
	mutating, validating := servers(t)
	pod := &corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}}
	wrongKind := reviewBody(t, admissionv1.Create, pod, nil)
	wrongKind = bytes.Replace(wrongKind, []byte(`"kind":{"group":"apps","version":"v1","kind":"Deployment"}`), []byte(`"kind":{"group":"","version":"v1","kind":"Pod"}`), 1)

	// controller-runtime answers every request with an AdmissionReview whose
	// status carries the HTTP code, which is what the API server reads.
	tests := []struct {
		name     string
		body     []byte
		wantCode int32
		wantMsg  string
	}{
		{name: "empty body", body: nil, wantCode: http.StatusBadRequest, wantMsg: "no AdmissionReview request"},
		{name: "not JSON", body: []byte("{nope"), wantCode: http.StatusBadRequest},
		{name: "review without request", body: []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`), wantCode: http.StatusBadRequest, wantMsg: "no AdmissionReview request"},
		{name: "wrong kind", body: wrongKind, wantCode: http.StatusBadRequest, wantMsg: "admits apps/v1 Deployments only"},
		{name: "missing object", body: reviewBody(t, admissionv1.Create, nil, nil), wantCode: http.StatusBadRequest, wantMsg: "carries no object"},
		{name: "update without oldObject", body: reviewBody(t, admissionv1.Update, realistic(), nil), wantCode: http.StatusBadRequest, wantMsg: "carries no oldObject"},
		{name: "object that is not a Deployment", body: bytes.Replace(reviewBody(t, admissionv1.Create, realistic(), nil), []byte(`"replicas":3`), []byte(`"replicas":"three"`), 1), wantCode: http.StatusBadRequest, wantMsg: "replicas"},
		{name: "oversized body", body: bytes.Repeat([]byte(" "), 8<<20), wantCode: http.StatusRequestEntityTooLarge, wantMsg: "too large"},
	}
	for _, tt := range tests {
		for name, h := range map[string]http.Handler{"mutating": mutating, "validating": validating} {
			t.Run(tt.name+"/"+name, func(t *testing.T) {
				w := post(h, tt.body)
				require.Equal(t, http.StatusOK, w.Code)
				resp := decodeResponse(t, w)
				assert.False(t, resp.Allowed)
				require.NotNil(t, resp.Result)
				assert.Equal(t, tt.wantCode, resp.Result.Code, resp.Result.Message)
				assert.Contains(t, resp.Result.Message, tt.wantMsg)
			})
		}
	}
}

func TestHandlersPatchOnlyWhatTheyChange(t *testing.T) {
	mutating, _ := servers(t)
	// A default install changes nothing in a valid Deployment: no patch at all.
	resp := decodeResponse(t, post(mutating, reviewBody(t, admissionv1.Create, realistic(), nil)))
	require.True(t, resp.Allowed)
	assert.Empty(t, resp.Patch)
	assert.Empty(t, resp.Warnings)

	d := realistic()
	d.Annotations[vocab.AnnotationCleanup] = "record"
	d.Spec.Selector = nil
	resp = decodeResponse(t, post(mutating, reviewBody(t, admissionv1.Create, d, nil)))
	require.True(t, resp.Allowed)
	assert.Equal(t, []string{"spec.selector: the selector was empty; deployguard set it to app.kubernetes.io/name=web from the template's stable labels: write it into the manifest to keep it"}, resp.Warnings)
	var ops []struct {
		Op   string `json:"op"`
		Path string `json:"path"`
	}
	require.NoError(t, json.Unmarshal(resp.Patch, &ops))
	var paths []string
	for _, o := range ops {
		paths = append(paths, o.Op+" "+o.Path)
	}
	sort.Strings(paths)
	assert.Equal(t, []string{
		"add /metadata/annotations/deployguard.io~1defaulted",
		"add /metadata/finalizers",
		"add /spec/selector",
	}, paths)

	// Applying the patch and admitting again: nothing more to change.
	again := d.DeepCopy()
	_, errs := review.Default(again, nil, reviewtest.Options(), false)
	require.Empty(t, errs)
	resp = decodeResponse(t, post(mutating, reviewBody(t, admissionv1.Create, again, nil)))
	assert.True(t, resp.Allowed)
	assert.Empty(t, resp.Patch, "idempotent through HTTP too")
}

// The patch, applied to the request's object as the API server applies it,
// gives exactly what Default computes.
func TestMutatingPatchAppliesToDefault(t *testing.T) {
	mutating, _ := servers(t)
	tests := map[string]*appsv1.Deployment{
		"realistic, asking for cleanup": func() *appsv1.Deployment {
			d := realistic()
			d.Annotations[vocab.AnnotationCleanup] = "record,drain"
			return d
		}(),
		"no selector, no annotations": func() *appsv1.Deployment {
			d := reviewtest.Stored(func(d *appsv1.Deployment) { d.Spec.Selector = nil })
			d.Annotations = nil
			return d
		}(),
		"no rollingUpdate (defaulting bypassed)": reviewtest.Stored(func(d *appsv1.Deployment) {
			d.Spec.Strategy.RollingUpdate = nil
			d.Spec.RevisionHistoryLimit = nil
			d.Spec.ProgressDeadlineSeconds = nil
		}),
		"both strategy fields": reviewtest.Stored(func(d *appsv1.Deployment) {
			d.Spec.Strategy.RollingUpdate.MaxSurge = nil
			d.Annotations = map[string]string{"a/b~c": "x"}
		}),
	}
	for name, d := range tests {
		t.Run(name, func(t *testing.T) {
			got := createPatched(t, mutating, d)

			want := d.DeepCopy()
			_, errs := review.Default(want, nil, reviewtest.Options(), false)
			require.Empty(t, errs)
			assert.Equal(t, want, got)
		})
	}
}

// createPatched sends the CREATE of d to the mutating webhook and applies
// its patch to d's JSON, as the API server does.
func createPatched(t *testing.T, mutating http.Handler, d *appsv1.Deployment) *appsv1.Deployment {
	t.Helper()
	raw := mustJSON(t, d)
	resp := decodeResponse(t, post(mutating, reviewBody(t, admissionv1.Create, d, nil)))
	require.True(t, resp.Allowed, "%v", resp.Result)
	got := &appsv1.Deployment{}
	if len(resp.Patch) == 0 {
		require.NoError(t, json.Unmarshal(raw, got))
		return got
	}
	p, err := jsonpatch5.DecodePatch(resp.Patch)
	require.NoError(t, err)
	patched, err := p.Apply(raw)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(patched, got))
	return got
}

// A create that deployguard-selector labelled for the entry for creates
// comes out without the label, whatever else the webhook does, and the
// patch applies to it: alone, with defaults, with the API server's
// selector repair, on an object with no other label.
func TestMutatingRemovesTheRoutingLabel(t *testing.T) {
	mutating, _ := servers(t)
	labelled := func(mut func(d *appsv1.Deployment)) *appsv1.Deployment {
		d := realistic()
		d.Labels[native.LabelDefaulting] = native.DefaultingPending
		d.Labels[native.LabelRefusals] = native.DefaultingPending
		mut(d)
		return d
	}
	for name, d := range map[string]*appsv1.Deployment{
		"finalizers already as asked": labelled(func(d *appsv1.Deployment) {
			d.Annotations[vocab.AnnotationCleanup] = "record"
			d.Finalizers = []string{vocab.FinalizerRecord}
		}),
		"finalizers to add": labelled(func(d *appsv1.Deployment) { d.Annotations[vocab.AnnotationCleanup] = "record,drain" }),
		"the only label": labelled(func(d *appsv1.Deployment) {
			d.Labels = map[string]string{native.LabelDefaulting: native.DefaultingPending, native.LabelRefusals: native.DefaultingPending}
			d.Annotations = nil
			d.Finalizers = []string{vocab.FinalizerRecord}
		}),
		"repaired by the API server": labelled(func(d *appsv1.Deployment) {
			d.Annotations[native.AnnotationSelectorRepaired] = "true"
		}),
		"the refusals' label alone": labelled(func(d *appsv1.Deployment) { delete(d.Labels, native.LabelDefaulting) }),
		"a strategy the refusals admit": labelled(func(d *appsv1.Deployment) {
			// Every replica but one: labelled, as loosely as the policy's
			// own condition, and admitted.
			three := intstr.FromInt32(3)
			d.Spec.Replicas = ptr.To(int32(4))
			d.Spec.Strategy = appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType,
				RollingUpdate: &appsv1.RollingUpdateDeployment{MaxUnavailable: &three}}
		}),
	} {
		t.Run(name, func(t *testing.T) {
			got := createPatched(t, mutating, d)
			assert.NotContains(t, got.Labels, native.LabelDefaulting)
			assert.NotContains(t, got.Labels, native.LabelRefusals)

			want := d.DeepCopy()
			_, errs := review.Default(want, nil, reviewtest.Options(), false)
			require.Empty(t, errs)
			delete(want.Labels, native.LabelDefaulting)
			delete(want.Labels, native.LabelRefusals)
			if len(want.Labels) == 0 {
				want.Labels = got.Labels // {} or nil: the same object
			}
			assert.Equal(t, want, got)

			// And once removed, nothing more to do.
			resp := decodeResponse(t, post(mutating, reviewBody(t, admissionv1.Create, got, nil)))
			assert.Empty(t, resp.Patch)
		})
	}
}

// A create deployguard-refusals refuses keeps the labels deployguard-selector
// put on it, so that the refusals' binding for creates selects it in the
// API server: the webhook itself neither refuses it nor unlabels it.
func TestMutatingKeepsTheLabelsOfARefusedCreate(t *testing.T) {
	mutating, _ := servers(t)
	for name, mut := range map[string]func(d *appsv1.Deployment){
		"every replica down": func(d *appsv1.Deployment) {
			all := intstr.FromString("100%")
			d.Spec.Replicas = ptr.To(int32(3))
			d.Spec.Strategy = appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType,
				RollingUpdate: &appsv1.RollingUpdateDeployment{MaxUnavailable: &all}}
		},
		"the floor probe's finalizer": func(d *appsv1.Deployment) { d.Finalizers = []string{floor.ProbeFinalizer} },
		"an unknown cleanup step":     func(d *appsv1.Deployment) { d.Annotations[vocab.AnnotationCleanup] = "backup" },
	} {
		t.Run(name, func(t *testing.T) {
			d := realistic()
			d.Labels[native.LabelDefaulting] = native.DefaultingPending
			d.Labels[native.LabelRefusals] = native.DefaultingPending
			mut(d)
			resp := decodeResponse(t, post(mutating, reviewBody(t, admissionv1.Create, d, nil)))
			require.True(t, resp.Allowed, "the policy refuses it, in its words: %+v", resp.Result)
			got := createPatched(t, mutating, d)
			assert.Equal(t, native.DefaultingPending, got.Labels[native.LabelRefusals])
			assert.Equal(t, native.DefaultingPending, got.Labels[native.LabelDefaulting])
		})
	}
}

// BenchmarkAdmission measures the full admission path of one request, as the
// API server drives it: decode the review, default (mutating), then decode,
// check and encode again (validating), on a realistic ~8 KB Deployment. The
// p99 of single requests is reported as a metric.
func BenchmarkAdmission(b *testing.B) {
	b.Run("go-checks", func(b *testing.B) { benchmarkAdmission(b, nil) })
	// The default install: kube-apiserver enforces the native refusals, the
	// webhook evaluates the warnings and bounds.
	b.Run("go-checks-native-refusals-in-apiserver", func(b *testing.B) {
		benchmarkAdmission(b, nil, func(w *review.Reviewer) { w.Options.NativeInAPIServer = true })
	})
	eng, err := policy.New(policy.Options{})
	require.NoError(b, err)
	require.NoError(b, eng.Load(context.Background(), policy.Builtins()))
	b.Run("with-builtin-policies", func(b *testing.B) { benchmarkAdmission(b, review.RegoPolicies{Engine: eng}) })
	// A Deployment a policy warns about makes the review look up the
	// exceptions that cover it: in a cluster of 1,000 exceptions, the cost
	// must be that of none (an index by namespace and name, not a scan).
	latest := func(d *appsv1.Deployment) {
		d.Spec.Template.Spec.Containers[0].Image = "registry.example.com/shop/c0:latest"
	}
	b.Run("policy-finding-no-exceptions", func(b *testing.B) { benchmarkAdmission(b, review.RegoPolicies{Engine: eng}, latest) })
	b.Run("policy-finding-1000-exceptions", func(b *testing.B) {
		benchmarkAdmission(b, review.RegoPolicies{Engine: eng}, latest, func(w *review.Reviewer) { w.Exceptions = thousandExceptions(b) })
	})
	// The drain check in a namespace of 2,000 Deployments, each under a
	// budget of its own, that share a common label: the review finds the
	// one budget selecting its pods and that budget's one Deployment.
	b.Run("go-checks-2000-deployments-and-budgets", func(b *testing.B) {
		benchmarkAdmission(b, nil, func(w *review.Reviewer) { w.Overlaps, w.Budgets = budgetedNamespace(b, 2000) })
	})
}

// budgetedNamespace indexes n Deployments of namespace shop labelled
// part-of=shop, each with a budget selecting its own name, plus a budget of
// minAvailable 1 over the benchmark's Deployment (web, 3 replicas: it allows
// evictions, so the check looks but finds nothing).
func budgetedNamespace(b *testing.B, n int) (*review.OverlapIndex, *review.BudgetIndex) {
	deps := review.NewOverlapIndex(nil)
	x := review.NewBudgetIndex(deps)
	one := intstr.FromInt32(1)
	for i := range n {
		name := fmt.Sprintf("app-%d", i)
		podLabels := map[string]string{"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "shop"}
		deps.Set(reviewtest.DeploymentIn("shop", name, 2, podLabels))
		x.Set(reviewtest.BudgetIn("shop", name, &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": name}}, &one))
	}
	x.Set(reviewtest.BudgetIn("shop", "web", &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": "web"}}, &one))
	if x.Len() != n+1 || deps.Len() != n {
		b.Fatal("the indexes hold what was set")
	}
	return deps, x
}

// thousandExceptions is an index of 1,000 exceptions: 990 in 99 other
// namespaces, and 10 in the benchmark's, naming other Deployments.
func thousandExceptions(b *testing.B) *exception.Index {
	x := exception.NewIndex("deployguard-system")
	for i := range 1000 {
		ns := fmt.Sprintf("team-%02d", i%99)
		if i%100 == 0 {
			ns = "shop"
		}
		x.Set(&exception.PolicyException{
			ObjectMeta: metav1.ObjectMeta{Namespace: "deployguard-system", Name: fmt.Sprintf("ex-%d", i)},
			Spec: exception.Spec{Match: exception.Match{Namespace: ns, Names: []string{fmt.Sprintf("app-%d", i)}}, Policies: []string{"images"},
				ExpiresAt: metav1.NewTime(time.Now().Add(time.Hour)), Owner: "o", Reason: "r"},
		})
	}
	if len(x.List()) != 1000 {
		b.Fatal("the index holds 1,000 exceptions")
	}
	return x
}

func benchmarkAdmission(b *testing.B, p review.Policies, muts ...any) {
	w := &review.Reviewer{Options: reviewtest.Options(), Overlaps: reviewtest.Index(reviewtest.Guarded(func(d *appsv1.Deployment) { d.Name = "other" })), Policies: p}
	d := realistic()
	for _, m := range muts {
		switch m := m.(type) {
		case func(*appsv1.Deployment):
			m(d)
		case func(*review.Reviewer):
			m(w)
		}
	}
	mutating, validating := (&Hooks{Reviewer: w}).Handlers(nil)
	no := false
	mutating.RecoverPanic, validating.RecoverPanic = &no, &no
	create := reviewBody(b, admissionv1.Create, d, nil)
	b.Logf("request size: %d bytes (object %d bytes)", len(create), len(mustJSON(b, d)))
	guardedD := d.DeepCopy()
	_, _ = review.Default(guardedD, nil, reviewtest.Options(), false)
	validate := reviewBody(b, admissionv1.Create, guardedD, nil)

	timeEach(b, func() {
		if w := post(mutating, create); w.Code != http.StatusOK {
			b.Fatalf("mutating: %d", w.Code)
		}
		if w := post(validating, validate); w.Code != http.StatusOK {
			b.Fatalf("validating: %d", w.Code)
		}
	})
}

// defaultInstallValidating is w's validating webhook as the default install
// runs it (the native refusals in the API server), and the realistic
// Deployment as the API server sends it after the mutating webhook.
func defaultInstallValidating(b *testing.B, w *review.Reviewer) (*Endpoint, *appsv1.Deployment) {
	w.Options.NativeInAPIServer = true
	_, validating := (&Hooks{Reviewer: w}).Handlers(nil)
	no := false
	validating.RecoverPanic = &no
	d := realistic()
	_, _ = review.Default(d, nil, reviewtest.Options(), false)
	return validating, withManagedFields(b, d)
}

// timeEach runs request b.N times and reports, besides the mean and the
// allocations, the p50 and p99 of single requests.
func timeEach(b *testing.B, request func()) {
	lat := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		request()
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns/req")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns/req")
}

// BenchmarkValidatingDefaultInstall measures the one call kube-apiserver
// makes per Deployment write in the default install, the validating
// webhook's (the mutating webhook's match conditions skip an ordinary
// Deployment): the native refusals enforced by the API server, the warnings
// and bounds in process, the built-in policies, on a CREATE and on an
// UPDATE that changes only an image, as bench-apiserver's two loads.
func BenchmarkValidatingDefaultInstall(b *testing.B) {
	eng, err := policy.New(policy.Options{})
	require.NoError(b, err)
	require.NoError(b, eng.Load(context.Background(), policy.Builtins()))
	// The namespace holds 500 other Deployments, none overlapping: the
	// request is admitted, as the bench's are.
	var others []*appsv1.Deployment
	for i := range 500 {
		others = append(others, reviewtest.Guarded(func(d *appsv1.Deployment) {
			d.Name = fmt.Sprintf("other-%d", i)
			d.Spec.Selector.MatchLabels["app.kubernetes.io/name"] = d.Name
			d.Spec.Template.Labels["app.kubernetes.io/name"] = d.Name
		}))
	}
	validating, d := defaultInstallValidating(b, &review.Reviewer{Options: reviewtest.Options(), Overlaps: reviewtest.Index(others...), Policies: review.RegoPolicies{Engine: eng}})
	image := d.DeepCopy()
	image.Spec.Template.Spec.Containers[0].Image += "-2"
	for name, body := range map[string][]byte{
		"create":            reviewBody(b, admissionv1.Create, d, nil),
		"image-only-update": reviewBody(b, admissionv1.Update, image, d),
	} {
		b.Run(name, func(b *testing.B) {
			if w := post(validating, body); !strings.Contains(w.Body.String(), `"allowed":true`) {
				b.Fatalf("not admitted: %.500s", w.Body.String())
			}
			b.ReportAllocs()
			for b.Loop() {
				if w := post(validating, body); w.Code != http.StatusOK {
					b.Fatalf("validating: %d", w.Code)
				}
			}
		})
	}
}
