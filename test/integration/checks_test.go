package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/analysis"
	"github.com/deployguard/deployguard/reconciler/analysis/checks"
	"github.com/deployguard/deployguard/test/harness"
)

// The webhook's entry in config/webhook, as deployed.
const checksWebhook = `admission webhook "validate.deploymentchecks.deployguard.io" denied the request`

// errorRateMetric is a valid metric measuring query.
func errorRateMetric(query string) analysis.Metric {
	return analysis.Metric{Name: "error-rate", Query: query, SuccessCondition: "result[0] < 0.05",
		Interval: metav1.Duration{Duration: 30 * time.Second}, Count: ptrTo[int32](4)}
}

func ptrTo[T any](v T) *T { return &v }

// A check is judged at `kubectl apply` by the CRD's schema and then the
// guard's webhook, and refused with every problem at its field path: a
// ClusterDeploymentCheck whose condition does not parse, a DeploymentCheck
// whose query names another namespace; a valid one of each is admitted.
func TestChecksAreJudgedAtApply(t *testing.T) {
	ctx := context.Background()
	ns := harness.NewNamespace(t, k8s)
	other := harness.NewNamespace(t, k8s)
	c, _ := clientAs(t, "")
	cluster := func(name string, metrics ...analysis.Metric) client.Object {
		return &checks.ClusterDeploymentCheck{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: checks.ClusterSpec{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "prod"}},
				Spec:              checks.Spec{Metrics: metrics},
			}}
	}
	team := func(name string, metrics ...analysis.Metric) client.Object {
		return &checks.DeploymentCheck{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: checks.Spec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}, Metrics: metrics}}
	}
	noCondition := errorRateMetric("sum(up)")
	noCondition.SuccessCondition = ""
	eleven := make([]analysis.Metric, 11)
	for i := range eleven {
		eleven[i] = errorRateMetric("sum(up)")
		eleven[i].Name = fmt.Sprintf("m%d", i)
	}
	badCondition := errorRateMetric("sum(up)")
	badCondition.SuccessCondition = "result[0] <"

	for _, tc := range []struct {
		name string
		obj  client.Object
		// by is who refuses ("" admits): the webhook or the schema; path,
		// the field the refusal names.
		by, path string
	}{
		{name: "a valid ClusterDeploymentCheck is admitted",
			obj: cluster("checks-valid", errorRateMetric(`sum(rate(http_requests_total{code=~"5..",namespace="ingress"}[2m]))`))},
		{name: "a valid DeploymentCheck is admitted",
			obj: team("checks-valid", errorRateMetric(`sum(rate(http_requests_total{code=~"5..",pod=~"{{ .Name }}-{{ .PodTemplateHash }}-.*"}[2m]))`))},
		{name: "a condition that does not parse is refused by the webhook",
			obj: cluster("checks-bad-condition", badCondition), by: "webhook", path: "spec.metrics[0].successCondition"},
		{name: "a team's query naming another namespace is refused by the webhook",
			obj: team("checks-other-namespace", errorRateMetric(`sum(up{namespace="`+other+`"})`)), by: "webhook", path: "spec.metrics[0].query"},
		{name: "a metric without a condition is refused by the schema",
			obj: team("checks-no-condition", noCondition), by: "schema", path: "spec.metrics[0].successCondition"},
		{name: "a query over 8 KiB is refused by the schema",
			obj: team("checks-long-query", errorRateMetric("sum(up)"+strings.Repeat(" ", checks.MaxQueryLength))), by: "schema", path: "spec.metrics[0].query"},
		{name: "more than 10 metrics are refused by the schema",
			obj: cluster("checks-eleven", eleven...), by: "schema", path: "spec.metrics"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := c.Create(ctx, tc.obj)
			if err == nil {
				t.Cleanup(func() { _ = k8s.Delete(context.Background(), tc.obj) })
			}
			if tc.by == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err, "refused")
			t.Logf("refused: %v", err)
			assert.True(t, apierrors.IsInvalid(err), "422 Invalid, each problem at its field: %v", err)
			assert.Contains(t, err.Error(), tc.path+":", "the message kubectl prints names the field")
			if tc.by == "webhook" {
				assert.Contains(t, err.Error(), checksWebhook)
			} else {
				assert.NotContains(t, err.Error(), "admission webhook", "the schema refuses it before any webhook")
			}
		})
	}
}
