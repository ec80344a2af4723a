package policy

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
)

// deleteInput is an admission DELETE of old by a plain user: no object.
func deleteInput(t testing.TB, old *appsv1.Deployment) *Input {
	t.Helper()
	in, err := NewInput(Request{
		Operation: opDelete,
		Namespace: old.Namespace,
		Name:      old.Name,
		OldObject: old,
		UserInfo:  UserInfo{Username: "alice", Groups: []string{"system:authenticated", "team-a"}},
	})
	require.NoError(t, err)
	return in
}

// TestPoliciesOnDelete: a policy is evaluated on a DELETE when it can tell
// one (it reads input.operation, input.oldObject, or input.object whole),
// and then judges the Deployment being deleted; a policy that reads only
// parts of input.object, which a DELETE has not, is not evaluated on one,
// so that its negated rules do not refuse every deletion.
func TestPoliciesOnDelete(t *testing.T) {
	critical := deployment(goodContainer("web"))
	critical.Labels["tier"] = "critical"
	plain := deployment(goodContainer("web"))
	lib := regoSource("lib.rego", `package lib.k8s

deleting if input.operation == "DELETE"

labels(obj) := object.get(obj, ["metadata", "labels"], {})
`)
	tests := []struct {
		name    string
		module  string
		deletes bool
		// denied on the DELETE of critical and of plain.
		critical, plain []string
		// skipped: what the policy would deny on the DELETE of plain if it
		// were evaluated (an input alike but for its operation): what
		// leaving it out spares the deletion.
		skipped []string
	}{
		{
			name: "the contract's deletion rule: operation and oldObject",
			module: `package deployguard.p

deny contains "a tier: critical Deployment may not be deleted" if {
	input.operation == "DELETE"
	input.oldObject.metadata.labels.tier == "critical"
}
`,
			deletes:  true,
			critical: []string{"[policy p] a tier: critical Deployment may not be deleted"},
		},
		{
			name: "a negated rule about a part of the object: not evaluated",
			module: `package deployguard.p

deny contains "add an owner label" if {
	not input.object.metadata.labels.owner
}
`,
			skipped: []string{"[policy p] add an owner label"},
		},
		{
			name: "object.get on the object: not evaluated",
			module: `package deployguard.p

deny contains "add an owner label" if {
	object.get(input.object, ["metadata", "labels", "owner"], "") == ""
}
`,
		},
		{
			name: "the object through a variable and a function: not evaluated",
			module: `package deployguard.p

import data.lib.k8s

deny contains "add an owner label" if {
	obj := input.object
	not k8s.labels(obj).owner
}
`,
		},
		{
			name: "the operation read through a library rule",
			module: `package deployguard.p

import data.lib.k8s

deny contains "critical" if {
	k8s.deleting
	k8s.labels(input.oldObject).tier == "critical"
}
`,
			deletes:  true,
			critical: []string{"[policy p] critical"},
		},
		{
			name: "the object as a whole: a DELETE told by its absence",
			module: `package deployguard.p

deny contains "no deletions in team-a" if {
	input.object == null
	input.namespace == "team-a"
}
`,
			deletes:  true,
			critical: []string{"[policy p] no deletions in team-a"},
			plain:    []string{"[policy p] no deletions in team-a"},
		},
		{
			name: "an update rule on oldObject: evaluated, and silent on a DELETE",
			module: `package deployguard.p

deny contains "the replicas may not shrink" if {
	input.object.spec.replicas < input.oldObject.spec.replicas
}
`,
			deletes: true,
		},
		{
			name: "a member of input chosen by a variable: evaluated",
			module: `package deployguard.p

deny contains "deleted" if {
	some k
	input[k] == "DELETE"
}
`,
			deletes:  true,
			critical: []string{"[policy p] deleted"},
			plain:    []string{"[policy p] deleted"},
		},
		{
			name: "a with: evaluated",
			module: `package deployguard.p

owner := input.object.metadata.labels.owner

deny contains "no owner" if {
	not owner with input.object as input.oldObject
}
`,
			deletes:  true,
			critical: []string{"[policy p] no owner"},
			plain:    []string{"[policy p] no owner"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEngine(t, Options{}, lib, regoSource("p.rego", tt.module))
			infos := e.Policies()
			require.Len(t, infos, 1)
			assert.Equal(t, tt.deletes, infos[0].Deletes, "PolicyInfo.Deletes")
			got := e.Evaluate(context.Background(), deleteInput(t, critical))
			assert.Equal(t, tt.critical, Lines(got.Denied), "DELETE of a tier: critical Deployment")
			got = e.Evaluate(context.Background(), deleteInput(t, plain))
			assert.Equal(t, tt.plain, Lines(got.Denied), "DELETE of a plain Deployment")
			if !tt.deletes {
				in, err := NewInput(Request{Operation: "UPDATE", Namespace: plain.Namespace, Name: plain.Name, OldObject: plain})
				require.NoError(t, err)
				assert.Equal(t, tt.skipped, Lines(e.Evaluate(context.Background(), in).Denied),
					"evaluated on an input alike but for its operation")
			}
		})
	}
}

// TestPoliciesOnDeleteByMode: a policy judges a DELETE in its mode, as any
// other request: enforce refuses, warn warns, audit records.
func TestPoliciesOnDeleteByMode(t *testing.T) {
	critical := deployment(goodContainer("web"))
	critical.Labels["tier"] = "critical"
	module := func(mode string) Source {
		return regoSource(mode+".rego", `# METADATA
# custom:
#   mode: `+mode+`
package deployguard.`+mode+`

deny contains "a tier: critical Deployment may not be deleted" if {
	input.operation == "DELETE"
	input.oldObject.metadata.labels.tier == "critical"
}
`)
	}
	e := newEngine(t, Options{}, module("enforce"), module("warn"), module("audit"))
	got := e.Evaluate(context.Background(), deleteInput(t, critical))
	assert.Equal(t, []string{"[policy enforce] a tier: critical Deployment may not be deleted"}, Lines(got.Denied))
	assert.Equal(t, []string{"[policy warn] a tier: critical Deployment may not be deleted"}, Lines(got.Warnings))
	assert.Equal(t, []string{"[policy audit] a tier: critical Deployment may not be deleted"}, Lines(got.Audited))
}

// TestBuiltinsEnforcedOnDelete: every built-in judges only parts of the
// object, so none is evaluated on a DELETE, and enforcing them all refuses
// no deletion of a Deployment that breaks every one of them.
func TestBuiltinsEnforcedOnDelete(t *testing.T) {
	e := newEngine(t, Options{ForceMode: ModeEnforce}, Builtins()...)
	for _, p := range e.Policies() {
		assert.Equal(t, ModeEnforce, p.Mode, p.Name)
		assert.False(t, p.Deletes, "%s is evaluated on a DELETE", p.Name)
	}
	old := deployment(goodContainer("web"))
	c := &old.Spec.Template.Spec.Containers[0]
	c.Image, c.ReadinessProbe, c.Resources.Requests = "nginx", nil, nil
	old.Spec.Template.Spec.HostNetwork = true
	require.False(t, e.Evaluate(context.Background(), createInput(t, old)).Allowed(), "the Deployment breaks the built-ins")
	got := e.Evaluate(context.Background(), deleteInput(t, old))
	assert.True(t, got.Allowed())
	assert.Empty(t, got.Warnings)
}
