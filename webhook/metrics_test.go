package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/deployguard/deployguard/policy"
	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/webhook/origin"
	"github.com/deployguard/deployguard/webhook/review"
	"github.com/deployguard/deployguard/webhook/review/reviewtest"
)

func TestRefusalReason(t *testing.T) {
	selector := field.NewPath("spec", "selector")
	tests := []struct {
		name string
		errs field.ErrorList
		want string
	}{
		{name: "nothing refused", errs: nil, want: reasonNone},
		{name: "a check's error counts as its check",
			errs: field.ErrorList{field.Invalid(selector, "app=web", "overlaps").WithOrigin(origin.Overlap)}, want: origin.Overlap},
		{name: "the first check that refused counts, not the path",
			errs: field.ErrorList{
				field.Invalid(field.NewPath("spec", "strategy", "rollingUpdate", "maxUnavailable"), "100%", "all down").WithOrigin(origin.Strategy),
				field.Invalid(selector, "app=web", "overlaps").WithOrigin(origin.Overlap),
			}, want: origin.Strategy},
		{name: "a policy denial at a field a Go check also reports is the policy's",
			errs: field.ErrorList{field.Forbidden(selector, "[policy p] no").WithOrigin(origin.Policy)}, want: origin.Policy},
		{name: "an internal error is the guard's, whichever check met it",
			errs: field.ErrorList{field.InternalError(selector, errors.New("index not synced")).WithOrigin(origin.Overlap)}, want: origin.Internal},
		{name: "an error that names no check is not given a label outside the set",
			errs: field.ErrorList{field.Forbidden(selector, "who said this?")}, want: origin.Internal},
		{name: "a free-text origin is not a label",
			errs: field.ErrorList{field.Forbidden(selector, "no").WithOrigin("require-probes")}, want: origin.Internal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, refusalReason(tt.errs))
		})
	}
}

// Every admission is counted once, with the reason of its refusal, whichever
// way it was refused: before decoding, by a Go check, by a policy, or by the
// guard's own failure.
func TestAdmissionsCountedByReason(t *testing.T) {
	index := reviewtest.Index(reviewtest.Guarded(func(d *appsv1.Deployment) { d.Name = "other" }))
	w := &review.Reviewer{
		Options: reviewtest.Options(),
		Overlaps: reviewtest.OverlapsFunc(func(ctx context.Context, d *appsv1.Deployment) ([]review.Selection, error) {
			if d.Name == "unlisted" {
				return nil, review.ErrIndexNotSynced
			}
			return index.OverlapCandidates(ctx, d)
		}),
		// A policy that refuses at spec.selector, where the selector check
		// reports too. A DELETE has no object.
		Policies: reviewtest.PoliciesFunc(func(in policy.Request) policy.Decision {
			raw, _ := in.Object.([]byte)
			if !bytes.Contains(raw, []byte(`"example.com/deny":"true"`)) {
				return policy.Decision{}
			}
			return policy.Decision{Denied: []policy.Finding{{Policy: "no-selectors", Field: "spec.selector", Message: "no", Rule: "deny", Mode: policy.ModeEnforce}}}
		}),
	}
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	require.NoError(t, err)
	mutating, validating := (&Hooks{Reviewer: w}).Handlers(m)

	named := func(name string) func(*appsv1.Deployment) { return func(d *appsv1.Deployment) { d.Name = name } }
	deleting := func(d *appsv1.Deployment) { d.DeletionTimestamp = &metav1.Time{Time: time.Unix(1e9, 0)} }
	denyAnnotated := reviewtest.Guarded(func(d *appsv1.Deployment) { d.Annotations["example.com/deny"] = "true" })
	pod := &corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}}
	wrongKind := bytes.Replace(reviewBody(t, admissionv1.Create, pod, nil),
		[]byte(`"kind":{"group":"apps","version":"v1","kind":"Deployment"}`), []byte(`"kind":{"group":"","version":"v1","kind":"Pod"}`), 1)

	tests := []struct {
		name                    string
		validating              bool
		body                    []byte
		op, wantResult, wantWhy string
	}{
		{name: "nothing to default", body: reviewBody(t, admissionv1.Create, reviewtest.Stored(named("api")), nil),
			op: "CREATE", wantResult: "allowed", wantWhy: reasonNone},
		{name: "a selector repaired", body: reviewBody(t, admissionv1.Create, reviewtest.Stored(func(d *appsv1.Deployment) { d.Spec.Selector = nil }), nil),
			op: "CREATE", wantResult: "patched", wantWhy: reasonNone},
		{name: "a selector that cannot be repaired", body: reviewBody(t, admissionv1.Create, reviewtest.Stored(func(d *appsv1.Deployment) {
			d.Spec.Selector = nil
			d.Spec.Template.Labels = map[string]string{"version": "v1"}
		}), nil), op: "CREATE", wantResult: "denied", wantWhy: origin.Selector},
		{name: "an object that does not decode", body: bytes.Replace(reviewBody(t, admissionv1.Update, reviewtest.Stored(), reviewtest.Stored()), []byte(`"replicas":3`), []byte(`"replicas":"three"`), 1),
			op: "UPDATE", wantResult: "error", wantWhy: reasonMalformed},

		{validating: true, name: "not a Deployment", body: wrongKind,
			op: "CREATE", wantResult: "error", wantWhy: reasonMalformed},
		{validating: true, name: "an overlap", body: reviewBody(t, admissionv1.Create, reviewtest.Guarded(), nil),
			op: "CREATE", wantResult: "denied", wantWhy: origin.Overlap},
		{validating: true, name: "every replica down and an overlap: the first check", body: reviewBody(t, admissionv1.Create, reviewtest.Guarded(func(d *appsv1.Deployment) {
			d.Spec.Strategy.RollingUpdate.MaxUnavailable = ptr.To(intstr.FromString("100%"))
		}), nil), op: "CREATE", wantResult: "denied", wantWhy: origin.Strategy},
		{validating: true, name: "the overlap index not synced", body: reviewBody(t, admissionv1.Create, reviewtest.Guarded(named("unlisted")), nil),
			op: "CREATE", wantResult: "denied", wantWhy: origin.Internal},
		{validating: true, name: "a metadata change", body: reviewBody(t, admissionv1.Update, reviewtest.Guarded(), reviewtest.Guarded()),
			op: "UPDATE", wantResult: "allowed", wantWhy: reasonNone},
		{validating: true, name: "a policy", body: reviewBody(t, admissionv1.Update, denyAnnotated, reviewtest.Guarded()),
			op: "UPDATE", wantResult: "denied", wantWhy: origin.Policy},
		{validating: true, name: "the guard's finalizers removed while deleting",
			body: reviewBody(t, admissionv1.Update, reviewtest.Guarded(deleting, func(d *appsv1.Deployment) { d.Finalizers = nil }), reviewtest.Guarded(deleting)),
			op:   "UPDATE", wantResult: "denied", wantWhy: origin.Finalizers},
		{validating: true, name: "a protected Deployment deleted",
			body: reviewBody(t, admissionv1.Delete, nil, reviewtest.Guarded(func(d *appsv1.Deployment) { d.Annotations[vocab.AnnotationProtected] = "true" })),
			op:   "DELETE", wantResult: "denied", wantWhy: origin.Protected},
		{validating: true, name: "a DELETE without oldObject", body: reviewBody(t, admissionv1.Delete, nil, nil),
			op: "DELETE", wantResult: "error", wantWhy: reasonMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, webhook := mutating, "mutating"
			if tt.validating {
				h, webhook = validating, "validating"
			}
			resp := decodeResponse(t, post(h, tt.body))
			assert.Equal(t, tt.wantResult == "allowed" || tt.wantResult == "patched", resp.Allowed, "%v", resp.Result)
			assert.Equal(t, 1.0, testutil.ToFloat64(m.requests.WithLabelValues(webhook, tt.op, tt.wantResult, tt.wantWhy)))
		})
	}
	// Each request once, under its own labels, and nothing else.
	assert.Equal(t, len(tests), testutil.CollectAndCount(m.requests))
}

func TestLabelsFromAFixedSet(t *testing.T) {
	tests := []struct {
		name, op, reason        string
		wantOp, wantReasonLabel string
	}{
		{name: "the API server's operations", op: "DELETE", reason: origin.Protected, wantOp: "DELETE", wantReasonLabel: origin.Protected},
		{name: "CONNECT", op: "CONNECT", reason: reasonNone, wantOp: "CONNECT", wantReasonLabel: reasonNone},
		{name: "no operation", op: "", reason: reasonMalformed, wantOp: operationUnknown, wantReasonLabel: reasonMalformed},
		{name: "another case", op: "create", reason: reasonMalformed, wantOp: operationUnknown, wantReasonLabel: reasonMalformed},
		{name: "junk", op: strings.Repeat("x", 1<<16), reason: "free text", wantOp: operationUnknown, wantReasonLabel: origin.Internal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.wantOp, operationLabel(admissionv1.Operation(tt.op)))
			assert.Equal(t, tt.wantReasonLabel, reasonLabel(tt.reason))
		})
	}
}

// Requests that no API server sends, each with strings of its own (junk
// operations, huge ones, unknown kinds), are answered as malformed and add
// no series: the admission metrics hold the same series after a thousand of
// them as after one, and no label carries anything the requests chose.
func TestJunkOnThePortKeepsNoSeries(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	require.NoError(t, err)
	hooks := &Hooks{Reviewer: &review.Reviewer{Options: reviewtest.Options(), Budgets: review.NewBudgetIndex(review.NewOverlapIndex(nil))}}
	mutating, validating := hooks.Handlers(m)
	handlers := map[string]http.Handler{"mutating": mutating, "validating": validating,
		"verdict": hooks.VerdictHandler(m), "disruption-budget": &Endpoint{Webhook: hooks.BudgetHandler(m)}}
	d, err := json.Marshal(reviewtest.Stored())
	require.NoError(t, err)
	junk := func(i int) [][]byte {
		op := fmt.Sprintf("JUNK-%d-%s", i, strings.Repeat("o", i%7*1000))
		return [][]byte{
			envelope(op, d, d),
			bytes.Replace(envelope("CREATE", d, nil), []byte(`"kind":"Deployment"},`), fmt.Appendf(nil, `"kind":"JunkKind%d"},`, i), 1),
			bytes.Replace(envelope(op, d, nil), []byte(`"group":"apps"`), fmt.Appendf(nil, `"group":"junk%d.example.com"`, i), 1),
		}
	}
	series := func() (n int, labels string) {
		mfs, err := reg.Gather()
		require.NoError(t, err)
		for _, mf := range mfs {
			for _, mt := range mf.GetMetric() {
				n++
				for _, l := range mt.GetLabel() {
					labels += l.GetName() + "=" + l.GetValue() + " "
				}
			}
		}
		return n, labels
	}
	for name, h := range handlers {
		for _, body := range junk(0) {
			resp := decodeResponse(t, post(h, body))
			if name != "verdict" && name != "disruption-budget" { // they never refuse
				assert.False(t, resp.Allowed, "%s: %s", name, body)
			}
		}
	}
	before, _ := series()
	for i := 1; i <= 1000; i++ {
		for _, h := range handlers {
			for _, body := range junk(i) {
				post(h, body)
			}
		}
	}
	after, labels := series()
	assert.Equal(t, before, after, "no series for junk")
	// Not assert.NotContains: on failure it would print every label.
	assert.False(t, strings.Contains(labels, "JUNK") || strings.Contains(labels, "junk"), "a label carries junk")
	assert.Contains(t, labels, "operation="+operationUnknown)
}

// A refusal's log line is bounded whatever the request held.
func TestRefusalLogLineIsBounded(t *testing.T) {
	var lines []string
	ctx := logr.NewContext(context.Background(), funcr.New(func(prefix, args string) { lines = append(lines, args) }, funcr.Options{}))
	junk := strings.Repeat("j", 1<<20)
	_, validating := (&Hooks{Reviewer: &review.Reviewer{Options: reviewtest.Options()}}).Handlers(nil)
	// The handler itself: the Webhook would log through its own logger
	// (bounded too: boundedlog.Constructor).
	validating.Handler.Handle(ctx, admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: types.UID(junk), Kind: deploymentKind.gvk, Operation: admissionv1.Operation(junk), Name: junk, Namespace: junk,
		UserInfo: authenticationv1.UserInfo{Username: junk},
	}})
	require.Len(t, lines, 1)
	assert.Contains(t, lines[0], `"reason"="malformed"`)
	assert.Less(t, len(lines[0]), 8*1024, "a line of at most a few values of 512 bytes")
}

// How many budgets the drain check does not judge, for their selector's
// size, is on the metrics endpoint, read from the index at each scrape; a
// second registration (a guard restarted in one process) reads its own.
func TestUnjudgedBudgetsAreAGauge(t *testing.T) {
	reg := prometheus.NewRegistry()
	one := intstr.FromInt32(1)
	wide := &metav1.LabelSelector{MatchLabels: map[string]string{}}
	for i := range review.MaxBudgetSelectorTerms + 1 {
		wide.MatchLabels[fmt.Sprintf("l-%d", i)] = "v"
	}
	read := func() float64 {
		t.Helper()
		families, err := reg.Gather()
		require.NoError(t, err)
		for _, f := range families {
			if f.GetName() == "deployguard_disruption_budgets_unjudged" {
				return f.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatal("deployguard_disruption_budgets_unjudged is not registered")
		return 0
	}
	x := review.NewBudgetIndex(nil)
	require.NoError(t, RegisterUnjudgedBudgets(reg, x))
	assert.Zero(t, read())
	x.Set(reviewtest.BudgetIn("shop", "wide", wide, &one))
	x.Set(reviewtest.BudgetIn("shop", "web", &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}, &one))
	assert.Equal(t, 1.0, read())

	restarted := review.NewBudgetIndex(nil)
	require.NoError(t, RegisterUnjudgedBudgets(reg, restarted))
	assert.Zero(t, read(), "the restarted guard's index")
}
