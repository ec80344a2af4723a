package check

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"

	"github.com/deployguard/deployguard/cmd/deployguard/cli"
	"github.com/deployguard/deployguard/cmd/deployguard/config"
	"github.com/deployguard/deployguard/webhook/review"
)

// FuzzReadDocuments feeds `deployguard check`'s manifest reader arbitrary
// multi-document YAML and JSON and checks every document it yields, as
// `check -f -` would: a reader error says where, and every document gets a
// verdict (a denial with its problems), never a panic.
func FuzzReadDocuments(f *testing.F) {
	f.Add([]byte("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec:\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n    spec: {containers: [{name: web, image: nginx:1.27}]}\n"))
	f.Add([]byte("# a comment\n---\n---\napiVersion: v1\nkind: List\nitems:\n- {apiVersion: apps/v1, kind: Deployment, spec: {selector: {}}}\n- {apiVersion: v1, kind: Service}\n"))
	f.Add([]byte(`{"apiVersion":"apps/v1","kind":"Deployment","spec":{"replicas":"3","template":{"spec":{"containers":null}}}}`))
	f.Add([]byte("apiVersion: apps/v1\nkind: Deployment\nspec:\n  strategy: {rollingUpdate: {maxUnavailable: 100%}}\n  template:\n    spec:\n      containers:\n      - name: a\n        image: a:latest\n---\nkind: Deployment\n$patch: delete\n"))
	f.Add([]byte("a: &a [*a, *a, *a]\nb: &b [*a, *a, *a]\nc: [*b, *b, *b]\n"))
	f.Add([]byte("\t- x\n: y"))
	f.Add([]byte{})
	cfg := config.Default()
	eng, _, err := cli.NewPolicyEngine(context.Background(), cfg, "")
	require.NoError(f, err)
	user := authenticationv1.UserInfo{Username: "ci"}
	f.Fuzz(func(t *testing.T, manifests []byte) {
		docs, err := splitDocuments("fuzz.yaml", bytes.NewReader(manifests))
		if err != nil {
			assert.Contains(t, err.Error(), "fuzz.yaml: document ", "the error says where")
			return
		}
		pipe := newPipeline(cfg, review.RegoPolicies{Engine: eng})
		for _, d := range docs {
			for _, r := range pipe.check(context.Background(), d, "default", user) {
				assert.Contains(t, []string{"admitted", "denied", "skipped"}, r.Verdict)
				if r.Verdict == "denied" {
					assert.NotEmpty(t, r.Problems, "a denial says what to change")
				}
			}
		}
	})
}
