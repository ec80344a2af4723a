package audit

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestOverviewGroupsByPolicyThenNamespace(t *testing.T) {
	res := func(ns, name, policy, result string) StoredResult {
		return StoredResult{Result: Result{Policy: policy, Rule: "deny", Result: result, Severity: "high", Category: "Ownership",
			Resource: Resource{Namespace: ns, Name: name, UID: typesUID(ns + name)}}}
	}
	var shop, pay Stored
	shop.Namespace, pay.Namespace = "shop", "pay"
	for i := range 7 {
		shop.Results = append(shop.Results, res("shop", fmt.Sprintf("web-%d", i), "deployguard.team", ResultFail))
	}
	shop.Results = append(shop.Results, res("shop", "web-0", "deployguard.images", ResultWarn))
	pay.Results = append(pay.Results, res("pay", "api", "deployguard.team", ResultFail),
		res("pay", "api", "deployguard.team", ResultFail)) // two findings, one Deployment
	o := OverviewOf([]Stored{shop, pay})

	var b bytes.Buffer
	o.WriteText(&b)
	assert.Equal(t, `deployguard.team (severity high, category Ownership): 8 Deployments in 2 namespaces would be refused
  pay: 1 fail  (api)
  shop: 7 fail  (web-0, web-1, web-2, web-3, web-4, … 2 more)
deployguard.images (severity high, category Ownership): 1 warn
  shop: 1 warn
`, b.String())
}
