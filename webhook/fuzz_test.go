package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"

	"github.com/deployguard/deployguard/policy"
	"github.com/deployguard/deployguard/webhook/review"
	"github.com/deployguard/deployguard/webhook/review/reviewtest"
)

// The seeds are small on purpose: the fuzzer minimizes every new interesting
// input, and minimizing an 8 KB review costs up to -fuzzminimizetime (60 s by
// default) during which no new input runs. Coverage comes from the shape of
// the input, not its size.

// FuzzHandlers feeds both webhooks arbitrary request bodies: each must answer
// with an AdmissionReview (a refusal or a 4xx for bad input), never panic and
// never fail with a 5xx, and keep nothing of what it was sent: the admission
// metrics never hold more series than their fixed label sets allow, however
// many distinct inputs came. `make fuzz` explores it; `make test` replays the
// seeds and testdata/fuzz/FuzzHandlers.
//
// The seeds include what anyone who reaches the port can send: junk and huge
// operations, unknown kinds, YAML, a body over the size limit (lowered to
// fuzzBodyLimit here, so that the seed that crosses it stays small).
func FuzzHandlers(f *testing.F) {
	d := reviewtest.Stored()
	bad := d.DeepCopy()
	bad.Spec.Selector = nil
	bad.Spec.Template.Labels = map[string]string{"version": "1"}
	create := reviewBody(f, admissionv1.Create, d, nil)
	f.Add(create)
	f.Add(reviewBody(f, admissionv1.Update, d, reviewtest.Guarded()))
	f.Add(reviewBody(f, admissionv1.Delete, nil, d))
	f.Add(reviewBody(f, admissionv1.Create, bad, nil))
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"1","operation":"CREATE","object":{"kind":"Deployment","apiVersion":"apps/v1","spec":null}}}`))
	f.Add([]byte(`{"request":{"kind":{"group":"apps","version":"v1","kind":"Deployment"},"operation":"UPDATE","object":{},"oldObject":{"metadata":{"finalizers":["deployguard.io/x"]}}}}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(``))
	// The port's junk.
	for _, op := range []string{"JUNK", "create", "CONNECT", "CREATE\u0000", strings.Repeat("o", 16<<10)} {
		f.Add(bytes.Replace(create, []byte(`"operation":"CREATE"`), []byte(`"operation":"`+op+`"`), 1))
	}
	f.Add(bytes.Replace(create, []byte(`"kind":"Deployment"},`), []byte(`"kind":"JunkKind"},`), 1))
	f.Add(bytes.Replace(create, []byte(`"group":"apps"`), []byte(`"group":"junk.example.com"`), 1))
	f.Add([]byte("apiVersion: admission.k8s.io/v1\nkind: AdmissionReview\n"))
	f.Add([]byte(`[{"request":{}}]`))
	f.Add(append(bytes.Repeat([]byte(" "), fuzzBodyLimit-len(create)), create...))
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	require.NoError(f, err)
	mutating, validating := (&Hooks{Reviewer: fuzzReviewer(nil)}).Handlers(m)
	no := false
	for _, e := range []*Endpoint{mutating, validating} {
		e.RecoverPanic, e.MaxBodyBytes = &no, fuzzBodyLimit
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		answers(t, body, mutating, validating)
		require.LessOrEqual(t, seriesOf(m.requests), maxAdmissionSeries, "a series per input")
	})
}

// seriesOf counts c's series as a scrape would find them, without
// encoding them (testutil.CollectAndCount's encoding was a quarter of
// FuzzHandlers' time per input).
func seriesOf(c prometheus.Collector) int {
	ch := make(chan prometheus.Metric)
	go func() {
		c.Collect(ch)
		close(ch)
	}()
	n := 0
	for range ch {
		n++
	}
	return n
}

// fuzzBodyLimit is FuzzHandlers' body size limit (Endpoint.MaxBodyBytes).
const fuzzBodyLimit = 32 << 10

// maxAdmissionSeries is how many series deployguard_admission_requests_total
// may hold for two webhooks: its label values are fixed sets (webhook,
// operation, result, reason: 2, 5, 4 and 13 values).
const maxAdmissionSeries = 2 * 5 * 4 * 13

// FuzzDeployment builds a well-formed AdmissionReview around an arbitrary
// operation, object and oldObject, so that the fuzzer spends its time inside
// the Deployment (defaults, checks, finalizer rules, the built-in Rego library
// through RegoPolicies) rather than on the envelope.
func FuzzDeployment(f *testing.F) {
	d, _ := json.Marshal(reviewtest.Stored())
	g, _ := json.Marshal(reviewtest.Guarded())
	f.Add("CREATE", d, []byte(nil))
	f.Add("UPDATE", d, g)
	f.Add("UPDATE", g, d)
	f.Add("DELETE", []byte(nil), g)
	f.Add("CREATE", []byte(`{"spec":{"selector":{},"template":{"metadata":{"labels":{"app":"x"}},"spec":{"containers":[{"name":"a","image":"a:latest"}]}},"strategy":{"type":"RollingUpdate","rollingUpdate":{"maxUnavailable":"100%","maxSurge":0}}}}`), []byte(nil))
	f.Add("CREATE", []byte(`{"spec":{"replicas":-1,"revisionHistoryLimit":0,"progressDeadlineSeconds":1,"template":{"spec":{"hostNetwork":true,"containers":[{"name":"a","image":"b","resources":{"requests":{"cpu":"1e9"}}}]}}}}`), []byte(nil))
	f.Add("UPDATE", []byte(`{"metadata":{"finalizers":[],"annotations":{"deployguard.io/allow-template":"x","deployguard.io/cleanup":"drain,record,drain"}}}`), []byte(`{"metadata":{"finalizers":["deployguard.io/drain"],"deletionTimestamp":"2026-01-01T00:00:00Z"}}`))
	eng, err := policy.New(policy.Options{})
	require.NoError(f, err)
	require.NoError(f, eng.Load(context.Background(), policy.Builtins()))
	mutating, validating := serversWith(f, review.RegoPolicies{Engine: eng})
	f.Fuzz(func(t *testing.T, op string, object, oldObject []byte) {
		answers(t, envelope(op, object, oldObject), mutating, validating)
	})
}

// envelope is an AdmissionReview for a Deployment with the given parts
// spliced in as they come: parts that are not JSON make the body malformed,
// which the handlers must answer too.
func envelope(op string, object, oldObject []byte) []byte {
	b := []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"0d1f3c1e","kind":{"group":"apps","version":"v1","kind":"Deployment"},"resource":{"group":"apps","version":"v1","resource":"deployments"},"name":"web","namespace":"shop","userInfo":{"username":"alice"},"operation":`)
	b = strconv.AppendQuote(b, op)
	for _, part := range []struct {
		name string
		raw  []byte
	}{{"object", object}, {"oldObject", oldObject}} {
		if len(part.raw) > 0 {
			b = append(b, `,"`+part.name+`":`...)
			b = append(b, part.raw...)
		}
	}
	return append(b, "}}"...)
}

// answers posts body to each handler and checks what any API server needs:
// an AdmissionReview with a response, and a refusal of bad input that is the
// client's fault (4xx), not the guard's (5xx).
func answers(t *testing.T, body []byte, handlers ...http.Handler) {
	t.Helper()
	for _, h := range handlers {
		w := post(h, body)
		require.Equal(t, http.StatusOK, w.Code)
		var out admissionv1.AdmissionReview
		require.NoError(t, json.Unmarshal(w.Body.Bytes(), &out), "every answer is an AdmissionReview")
		require.NotNil(t, out.Response)
		if !out.Response.Allowed {
			require.NotNil(t, out.Response.Result)
			assert.Less(t, out.Response.Result.Code, int32(500), out.Response.Result.Message)
		}
		if out.Response.Allowed && len(out.Response.Patch) > 0 {
			// A patch the API server cannot apply fails the request as surely
			// as a 5xx: it must at least be a JSON Patch.
			var ops []map[string]any
			require.NoError(t, json.Unmarshal(out.Response.Patch, &ops), "the patch is a JSON Patch")
		}
	}
}
