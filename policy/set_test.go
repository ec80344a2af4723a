package policy

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// withoutDigests clears the digests, for comparing the rest.
func withoutDigests(infos []PolicyInfo) []PolicyInfo {
	for i := range infos {
		infos[i].Digest = ""
	}
	return infos
}

func digests(s Set) map[string]string {
	out := map[string]string{}
	for _, p := range s.Policies() {
		out[p.Name] = p.Digest
	}
	return out
}

// TestDigestsChangeWithWhatDecides: the audit refreshes only the policies
// whose digest changed, so a digest must change with the policy's module, a
// library it may import, or its mode, and with nothing else.
func TestDigestsChangeWithWhatDecides(t *testing.T) {
	lib := regoSource("lib.rego", "package lib.k8s\n\nreplicas(obj) := obj.spec.replicas\n")
	a, b := denyAlways("a", ""), denyAlways("b", "")
	before := digests(newEngine(t, Options{}, lib, a, b).Active())
	require.Len(t, before, 2)

	tests := []struct {
		name    string
		opts    Options
		sources []Source
		changed []string
	}{
		{"same set loaded again", Options{}, []Source{lib, a, b}, nil},
		{"sources in another order", Options{}, []Source{b, lib, a}, nil},
		{"one policy's module changes", Options{}, []Source{lib, denyAlways("a", "warn"), b}, []string{"a"}},
		{"a library changes", Options{}, []Source{regoSource("lib.rego", "package lib.k8s\n\nreplicas(obj) := 1\n"), a, b}, []string{"a", "b"}},
		{"a mode override", Options{PolicyModes: map[string]Mode{"b": ModeAudit}}, []Source{lib, a, b}, []string{"b"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			after := digests(newEngine(t, tt.opts, tt.sources...).Active())
			var changed []string
			for _, name := range []string{"a", "b"} {
				if after[name] != before[name] {
					changed = append(changed, name)
				}
			}
			assert.Equal(t, tt.changed, changed)
		})
	}
}

// TestSetKeepsItsPolicies: a Set taken before a load keeps evaluating the
// policies it listed, and evaluates only those it is asked for.
func TestSetKeepsItsPolicies(t *testing.T) {
	e := newEngine(t, Options{}, denyAlways("a", ""), denyAlways("b", ""))
	old := e.Active()
	require.NoError(t, e.Load(context.Background(), []Source{denyAlways("c", "")}))

	r := Request{Operation: "UPDATE", Namespace: "team-a", Name: "shop", Object: deployment(goodContainer("web"))}
	d, err := old.EvaluateRequest(context.Background(), r, nil)
	require.NoError(t, err)
	assert.Equal(t, []string{"a", "b"}, policiesOf(d.Denied))
	assert.Equal(t, []string{"a", "b"}, []string{old.Policies()[0].Name, old.Policies()[1].Name})

	d, err = old.EvaluateRequest(context.Background(), r, func(name string) bool { return name == "b" })
	require.NoError(t, err)
	assert.Equal(t, []string{"b"}, policiesOf(d.Denied))

	d, err = e.EvaluateRequest(context.Background(), r)
	require.NoError(t, err)
	assert.Equal(t, []string{"c"}, policiesOf(d.Denied))
}
