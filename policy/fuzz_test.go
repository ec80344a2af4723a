package policy

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
)

// fuzzEngine has the built-in library loaded, with an evaluation budget no
// loaded machine runs out of: a time-out is not what these targets look for.
func fuzzEngine(f *testing.F) *Engine {
	e, err := New(Options{EvalTimeout: 10 * time.Second})
	require.NoError(f, err)
	require.NoError(f, e.Load(context.Background(), Builtins()))
	return e
}

// FuzzBuiltins evaluates the built-in library on the input built from
// arbitrary object JSON, as the webhook and `deployguard check` build it.
// Bytes that are not JSON are an error for the caller, never a panic; any
// object that decodes as a Deployment (what the API server sends) is
// evaluated without a policy failing: a built-in policy that errors on a
// valid Deployment would refuse it under failureMode deny.
func FuzzBuiltins(f *testing.F) {
	small, err := json.Marshal(deployment(goodContainer("web")))
	require.NoError(f, err)
	f.Add(small)
	f.Add([]byte(`{"spec":{"template":{"spec":{"containers":[{"name":"a","image":"a:latest","resources":{"requests":{"cpu":"x"}}}],"initContainers":[{"image":"b"}],"hostPID":true}}}}`))
	f.Add([]byte(`{"spec":{"template":{"spec":{"containers":[{"name":"a","image":"registry:5000/a","readinessProbe":{}}],"hostNetwork":"yes"}}}}`))
	f.Add([]byte(`{"spec":{"template":{"spec":{"containers":{"a":1}}}}}`))
	f.Add([]byte(`{"metadata":{"managedFields":[{"manager":"m"}]},"spec":null}`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`{`))
	e := fuzzEngine(f)
	f.Fuzz(func(t *testing.T, object []byte) {
		ctx := context.Background()
		req := Request{Operation: "CREATE", Namespace: "shop", Name: "web", Object: object}
		d, err := e.EvaluateRequest(ctx, req)
		if err != nil {
			assert.NotEmpty(t, err.Error())
			return
		}
		checkFindings(t, d)

		var typed appsv1.Deployment
		if json.Unmarshal(object, &typed) != nil {
			return
		}
		req.Object = &typed
		d, err = e.EvaluateRequest(ctx, req)
		require.NoError(t, err, "a typed Deployment always converts")
		for _, f := range append(append(d.Denied, d.Warnings...), d.Audited...) {
			assert.False(t, f.EvalFailed, "a built-in policy failed on a valid Deployment: %s", f)
		}
		checkFindings(t, d)
	})
}

// checkFindings holds what users read: every finding names its policy and
// says something.
func checkFindings(t *testing.T, d Decision) {
	t.Helper()
	for _, f := range append(append(d.Denied, d.Warnings...), d.Audited...) {
		assert.NotEmpty(t, f.Policy)
		assert.NotEmpty(t, strings.TrimSpace(f.Message), "finding of %s", f.Policy)
	}
}

// FuzzLoad loads arbitrary policy source, METADATA included. A source that
// is refused returns a *LoadError that names it and leaves the set that was
// active before in place; one that loads is evaluated on a Deployment
// without a panic.
func FuzzLoad(f *testing.F) {
	f.Add("package deployguard.x\n\ndeny contains {\"msg\": \"no\"} if input.object.spec.replicas > 3\n")
	f.Add("# METADATA\n# title: T\n# custom:\n#   mode: audit\npackage deployguard.y\n\nwarn contains f if { some c in input.object.spec.template.spec.containers; f := {\"msg\": c.name, \"field\": \"x\"} }\n")
	f.Add("# METADATA\n# custom:\n#   mode: [1, 2]\npackage deployguard.z\ndeny contains 1 if true\n")
	f.Add("# METADATA\n# custom: {mode: enforce, severity: high}\n# scope: rule\npackage deployguard.w\n")
	f.Add("package deployguard.h\nimport rego.v1\ndeny contains x if { x := http.send({\"method\": \"get\", \"url\": \"http://127.0.0.1:1\"}) }\n")
	f.Add("package deployguard.loop\ndeny contains x if { some x in numbers.range(1, 100000) }\n")
	f.Add("package x\n")
	f.Add("")
	e := fuzzEngine(f)
	before := e.Policies()
	obj, err := json.Marshal(deployment(goodContainer("web")))
	require.NoError(f, err)
	f.Fuzz(func(t *testing.T, module string) {
		ctx := context.Background()
		err := e.Load(ctx, []Source{{Name: "fuzz.rego", Module: module}})
		if err != nil {
			assert.Equal(t, before, e.Policies(), "a refused set leaves the active one in place")
			if le, ok := AsLoadError(err); ok {
				assert.Equal(t, []string{"fuzz.rego"}, le.Sources(), "the error names the source: %v", err)
			}
			return
		}
		defer func() { require.NoError(t, e.Load(ctx, Builtins())) }()
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		d, err := e.EvaluateRequest(ctx, Request{Operation: "CREATE", Namespace: "shop", Name: "web", Object: obj})
		require.NoError(t, err)
		for _, f := range append(append(d.Denied, d.Warnings...), d.Audited...) {
			assert.NotEmpty(t, f.Policy)
		}
	})
}
