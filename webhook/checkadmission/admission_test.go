package checkadmission

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/deployguard/deployguard/reconciler/analysis/checks"
)

const (
	errorRate = `sum(rate(http_requests_total{code=~"5..",pod=~"{{ .Name }}-{{ .PodTemplateHash }}-.*"}[2m])) / sum(rate(http_requests_total{pod=~"{{ .Name }}-{{ .PodTemplateHash }}-.*"}[2m]))`
)

// metric is a valid metric measuring query.
func metric(query string) string {
	q, err := json.Marshal(query)
	if err != nil {
		panic(err)
	}
	return `{"name": "error-rate", "query": ` + string(q) + `, "successCondition": "result[0] < 0.05", "interval": "1m", "count": 5}`
}

func clusterCheck(spec string) string {
	return `{"apiVersion": "deployguard.io/v1alpha1", "kind": "ClusterDeploymentCheck", "metadata": {"name": "platform"}, "spec": ` + spec + `}`
}

// teamCheck leaves metadata.namespace out, as a manifest applied with -n may.
func teamCheck(spec string) string {
	return `{"apiVersion": "deployguard.io/v1alpha1", "kind": "DeploymentCheck", "metadata": {"name": "team"}, "spec": ` + spec + `}`
}

func request(op admissionv1.Operation, kind, namespace, object, old string) admission.Request {
	r := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: "1", Operation: op, Namespace: namespace, Name: "check",
		Kind:   metav1.GroupVersionKind{Group: checks.GroupVersion.Group, Version: checks.GroupVersion.Version, Kind: kind},
		Object: runtime.RawExtension{Raw: []byte(object)},
	}}
	if old != "" {
		r.OldObject = runtime.RawExtension{Raw: []byte(old)}
	}
	return r
}

func TestValidator(t *testing.T) {
	valid := `{"metrics": [` + metric(errorRate) + `]}`
	noCondition := `{"metrics": [{"name": "error-rate", "query": "up"}]}`
	for _, tc := range []struct {
		name string
		req  admission.Request
		// code is the refusal's HTTP code (0: allowed); paths, the field
		// paths it names, all of them.
		code  int32
		paths []string
		// says is in the message kubectl prints.
		says string
	}{
		{name: "a valid ClusterDeploymentCheck is admitted",
			req: request(admissionv1.Create, checks.ClusterKind, "", clusterCheck(`{"namespaceSelector": {"matchLabels": {"tier": "prod"}}, "bakeWindow": "15m", "metrics": [`+
				metric(errorRate)+`, {"name": "latency", "query": "histogram_quantile(0.99, sum by (le) (rate(http_request_duration_seconds_bucket{namespace=\"ingress\"}[5m])))", "failureCondition": "result[0] > 0.5"}]}`), ""),
		},
		{name: "the platform may read any namespace",
			req: request(admissionv1.Create, checks.ClusterKind, "", clusterCheck(`{"metrics": [`+metric(`sum(up{namespace="ingress-nginx"})`)+`]}`), ""),
		},
		{name: "a valid DeploymentCheck is admitted",
			req: request(admissionv1.Create, checks.NamespacedKind, "team-a", teamCheck(valid), ""),
		},
		{name: "a team's query naming its own namespace is admitted: the namespace comes from the request",
			req: request(admissionv1.Create, checks.NamespacedKind, "team-a", teamCheck(`{"metrics": [`+metric(`sum(up{namespace="team-a"})`)+`]}`), ""),
		},
		{name: "a team's query naming another namespace is refused at the query",
			req:  request(admissionv1.Create, checks.NamespacedKind, "team-a", teamCheck(`{"metrics": [`+metric(`sum(up{namespace="team-b"})`)+`]}`), ""),
			code: http.StatusUnprocessableEntity, paths: []string{"spec.metrics[0].query"},
		},
		{name: "a metric without a condition is refused",
			req:  request(admissionv1.Create, checks.ClusterKind, "", clusterCheck(noCondition), ""),
			code: http.StatusUnprocessableEntity, paths: []string{"spec.metrics[0].successCondition"},
		},
		{name: "a condition that does not parse is refused",
			req:  request(admissionv1.Create, checks.ClusterKind, "", clusterCheck(`{"metrics": [{"name": "error-rate", "query": "up", "successCondition": "result[0] <"}]}`), ""),
			code: http.StatusUnprocessableEntity, paths: []string{"spec.metrics[0].successCondition"},
		},
		{name: "a selector that does not parse is refused, every problem at once",
			req: request(admissionv1.Create, checks.ClusterKind, "", clusterCheck(`{"namespaceSelector": {"matchExpressions": [{"key": "tier", "operator": "Equals", "values": ["prod"]}]},
				"selector": {"matchLabels": {"bad key": "x"}}, "metrics": [{"name": "error-rate", "query": "up"}]}`), ""),
			code: http.StatusUnprocessableEntity, paths: []string{"spec.namespaceSelector", "spec.selector", "spec.metrics[0].successCondition"},
		},
		{name: "a team's query template that loops is refused at once (never run)",
			req:  request(admissionv1.Create, checks.NamespacedKind, "team-a", teamCheck(`{"metrics": [`+metric(`{{ range 2000000000 }}{{ range 2000000000 }}{{ end }}{{ end }}up`)+`]}`), ""),
			code: http.StatusUnprocessableEntity, paths: []string{"spec.metrics[0].query"}, says: "may be used",
		},
		{name: "a team's query longer than 8192 characters is refused at the query, without quoting it",
			req: request(admissionv1.Create, checks.NamespacedKind, "team-a",
				teamCheck(`{"metrics": [`+metric(`sum(up{job="`+strings.Repeat("x", 1<<20)+`"})`)+`]}`), ""),
			code: http.StatusUnprocessableEntity, paths: []string{"spec.metrics[0].query"},
			says: "spec.metrics[0].query: Too long: may not be more than 8192 characters",
		},
		{name: "a malformed object is a bad request",
			req:  request(admissionv1.Create, checks.NamespacedKind, "team-a", teamCheck(`{"metrics": "error-rate"}`), ""),
			code: http.StatusBadRequest,
		},
		{name: "an update that makes the check invalid is refused",
			req:  request(admissionv1.Update, checks.NamespacedKind, "team-a", teamCheck(noCondition), teamCheck(valid)),
			code: http.StatusUnprocessableEntity, paths: []string{"spec.metrics[0].successCondition"},
		},
		{name: "an update of the metadata alone is admitted, even of a check stored invalid",
			req: request(admissionv1.Update, checks.ClusterKind, "",
				`{"kind": "ClusterDeploymentCheck", "metadata": {"name": "platform", "labels": {"owner": "sre"}}, "spec": `+noCondition+`}`,
				clusterCheck(noCondition)),
		},
		{name: "a deletion is not judged",
			req: request(admissionv1.Delete, checks.ClusterKind, "", "", clusterCheck(noCondition)),
		},
		{name: "another kind is a bad request",
			req:  request(admissionv1.Create, "PolicyException", "team-a", teamCheck(valid), ""),
			code: http.StatusBadRequest,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := Validator{}.Handle(context.Background(), tc.req)
			if tc.code == 0 {
				assert.True(t, resp.Allowed, "%+v", resp.Result)
				return
			}
			require.False(t, resp.Allowed)
			require.NotNil(t, resp.Result)
			assert.Equal(t, tc.code, resp.Result.Code, resp.Result.Message)
			assert.Contains(t, resp.Result.Message, tc.says)
			assert.Less(t, len(resp.Result.Message), 4096, "a refusal kubectl can print")
			if tc.paths == nil {
				return
			}
			require.NotNil(t, resp.Result.Details, resp.Result.Message)
			var got []string
			for _, c := range resp.Result.Details.Causes {
				got = append(got, c.Field)
				assert.Contains(t, resp.Result.Message, c.Field, "the message kubectl prints names every field")
			}
			assert.Equal(t, tc.paths, got, resp.Result.Message)
		})
	}
}
