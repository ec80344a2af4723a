package policy

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestModes(t *testing.T) {
	sources := []Source{
		denyAlways("strict", ""), // no metadata: enforce
		denyAlways("gentle", "warn"),
		denyAlways("quiet", "audit"),
		regoSource("advice.rego", "package deployguard.advice\n\nwarn contains \"consider a PodDisruptionBudget\" if input.operation\n"),
	}
	tests := []struct {
		name                      string
		opts                      Options
		denied, warnings, audited []string // policy names
	}{
		{
			name:     "modes from metadata",
			denied:   []string{"strict"},
			warnings: []string{"advice", "gentle"},
			audited:  []string{"quiet"},
		},
		{
			name:    "force mode audit rolls everything out dry",
			opts:    Options{ForceMode: ModeAudit},
			audited: []string{"advice", "gentle", "quiet", "strict"},
		},
		{
			name:     "per-policy override wins over force mode",
			opts:     Options{ForceMode: ModeWarn, PolicyModes: map[string]Mode{"quiet": ModeEnforce}},
			denied:   []string{"quiet"},
			warnings: []string{"advice", "gentle", "strict"},
		},
		{
			name:     "per-policy override alone",
			opts:     Options{PolicyModes: map[string]Mode{"strict": ModeAudit}},
			warnings: []string{"advice", "gentle"},
			audited:  []string{"quiet", "strict"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEngine(t, tt.opts, sources...)
			got := e.Evaluate(context.Background(), createInput(t, deployment(goodContainer("web"))))
			assert.Equal(t, tt.denied, policiesOf(got.Denied), "denied")
			assert.Equal(t, tt.warnings, policiesOf(got.Warnings), "warnings")
			assert.Equal(t, tt.audited, policiesOf(got.Audited), "audited")
			for _, f := range append(append(got.Denied, got.Warnings...), got.Audited...) {
				assert.False(t, f.EvalFailed)
			}
		})
	}
}

func TestFindingShapes(t *testing.T) {
	src := regoSource("shapes.rego", `package deployguard.shapes

deny contains "plain string" if input.operation
deny contains {"msg": "with field", "field": "spec.replicas"} if input.operation
deny contains {"reason": "no msg"} if input.operation
deny contains 42 if input.operation
`)
	e := newEngine(t, Options{}, src)
	got := e.Evaluate(context.Background(), createInput(t, deployment(goodContainer("web"))))
	assert.ElementsMatch(t, []string{
		"[policy shapes] plain string",
		"[policy shapes] spec.replicas: with field",
		`[policy shapes] {"reason":"no msg"}`,
		"[policy shapes] 42",
	}, Lines(got.Denied))
}

// A rule that fails at run time: two values for one complete rule.
const conflictPolicy = `package deployguard.conflict

value := input.name
value := input.namespace

deny contains "unreachable" if value == "never"
`

// A rule that takes seconds: about ten million iterations.
const slowPolicy = `package deployguard.slow

deny contains "too slow to matter" if {
	some i in numbers.range(1, 3000)
	some j in numbers.range(1, 3000)
	i * j == -1
}
`

func TestEvaluationFailure(t *testing.T) {
	tests := []struct {
		name        string
		policy      string
		opts        Options
		denied      bool
		message     string
		wantInWarns bool
	}{
		{
			name:    "runtime error refuses under failure mode deny",
			policy:  conflictPolicy,
			denied:  true,
			message: "broken.rego:4: eval_conflict_error: complete rules must not produce multiple outputs",
		},
		{
			name:        "runtime error allows with a warning under failure mode allow",
			policy:      conflictPolicy,
			opts:        Options{FailureMode: FailureAllow},
			message:     "failure mode allow lets the request through",
			wantInWarns: true,
		},
		{
			name:    "time-out refuses under failure mode deny",
			policy:  slowPolicy,
			opts:    Options{EvalTimeout: 20 * time.Millisecond},
			denied:  true,
			message: "did not finish within its time budget of 20ms",
		},
		{
			name:        "time-out of a warn-mode policy only warns",
			policy:      slowPolicy,
			opts:        Options{EvalTimeout: 20 * time.Millisecond, PolicyModes: map[string]Mode{"slow": ModeWarn}},
			message:     "did not finish within its time budget",
			wantInWarns: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEngine(t, tt.opts, append(Builtins(), regoSource("broken.rego", tt.policy))...)
			start := time.Now()
			got := e.Evaluate(context.Background(), createInput(t, deployment(goodContainer("web"))))
			assert.Less(t, time.Since(start), 2*time.Second, "evaluation must respect its budget")

			failures := got.Warnings
			if tt.denied {
				failures = got.Denied
			}
			require.Len(t, failures, 1)
			f := failures[0]
			assert.True(t, f.EvalFailed)
			assert.Contains(t, []string{"conflict", "slow"}, f.Policy)
			assert.Contains(t, f.Message, "policy could not be evaluated")
			assert.Contains(t, f.Message, tt.message)
			assert.Equal(t, !tt.denied, got.Allowed())
			if tt.wantInWarns {
				assert.Empty(t, got.Denied)
			}
		})
	}
}

func TestCallerCancellation(t *testing.T) {
	e := newEngine(t, Options{}, denyAlways("strict", ""))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	got := e.Evaluate(ctx, createInput(t, deployment(goodContainer("web"))))
	require.Len(t, got.Denied, 1, "a cancelled request is not a pass")
	assert.True(t, got.Denied[0].EvalFailed)
	assert.Contains(t, got.Denied[0].Message, "the request was abandoned: context canceled")
}

// TestCallerGivesUpMidway: a caller that gives up while a policy runs stops
// it, whatever budget the policy has left, and the policy fails as abandoned.
func TestCallerGivesUpMidway(t *testing.T) {
	e := newEngine(t, Options{EvalTimeout: time.Hour}, regoSource("slow.rego", slowPolicy))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	got := e.Evaluate(ctx, createInput(t, deployment(goodContainer("web"))))
	require.Len(t, got.Denied, 1, "an abandoned request is not a pass")
	assert.True(t, got.Denied[0].EvalFailed)
	assert.Contains(t, got.Denied[0].Message, "the request was abandoned: context deadline exceeded")
}

func TestExemptions(t *testing.T) {
	ex := Exemptions{
		Namespaces: []string{"kube-system"},
		Usernames:  []string{"system:serviceaccount:argocd:argocd-application-controller"},
		Groups:     []string{"platform-admins"},
	}
	tests := []struct {
		name      string
		namespace string
		user      UserInfo
		reason    string // "" means not exempt
	}{
		{name: "exempt namespace", namespace: "kube-system", user: UserInfo{Username: "alice"},
			reason: `namespace "kube-system" is exempt from policies`},
		{name: "exempt service account", namespace: "team-a",
			user:   UserInfo{Username: "system:serviceaccount:argocd:argocd-application-controller"},
			reason: `user "system:serviceaccount:argocd:argocd-application-controller" is exempt from policies`},
		{name: "exempt group", namespace: "team-a", user: UserInfo{Username: "bob", Groups: []string{"system:authenticated", "platform-admins"}},
			reason: `group "platform-admins" of user "bob" is exempt from policies`},
		{name: "ordinary user", namespace: "team-a", user: UserInfo{Username: "alice", Groups: []string{"system:authenticated"}}},
		{name: "service account of another namespace", namespace: "team-a",
			user: UserInfo{Username: "system:serviceaccount:team-a:argocd-application-controller"}},
	}
	e := newEngine(t, Options{Exempt: ex}, denyAlways("strict", ""))
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := deployment(goodContainer("web"))
			d.Namespace = tt.namespace
			// The object cannot exempt itself, whatever it says.
			d.Annotations = map[string]string{"deployguard.io/exempt": "true"}
			in, err := NewInput(Request{Operation: "UPDATE", Namespace: tt.namespace, Name: d.Name, Object: d, OldObject: d, UserInfo: tt.user})
			require.NoError(t, err)

			got := e.Evaluate(context.Background(), in)
			assert.Equal(t, tt.reason != "", got.Exempt)
			assert.Equal(t, tt.reason, got.ExemptReason)
			assert.Equal(t, tt.reason != "", got.Allowed())
		})
	}
}

func TestLoadKeepsLastGoodSet(t *testing.T) {
	e := newEngine(t, Options{}, denyAlways("strict", ""))
	in := createInput(t, deployment(goodContainer("web")))
	require.Len(t, e.Evaluate(context.Background(), in).Denied, 1)

	broken := regoSource("/etc/deployguard/policies/team.rego", "package deployguard.team\n\ndeny contains msg if {\n\tmsg := \n}\n")
	err := e.Load(context.Background(), []Source{broken})
	require.Error(t, err)
	lerr, ok := AsLoadError(err)
	require.True(t, ok, "want a *LoadError, got %T", err)
	require.NotEmpty(t, lerr.Errors)
	assert.Equal(t, "/etc/deployguard/policies/team.rego", lerr.Errors[0].Source)
	assert.Equal(t, 5, lerr.Errors[0].Line)
	assert.Contains(t, err.Error(), "/etc/deployguard/policies/team.rego:5: rego_parse_error")

	// The old set still decides.
	assert.Equal(t, []string{"strict"}, policiesOf(e.Evaluate(context.Background(), in).Denied))
	assert.Equal(t, "strict", e.Policies()[0].Name)
}

func TestLoadErrors(t *testing.T) {
	tests := []struct {
		name    string
		sources []Source
		want    []string // SourceError.Error() prefixes, one per failing source
	}{
		{
			name: "duplicate policy names both sources",
			sources: []Source{
				denyAlways("images", ""),
				regoSource("configmap/deployguard/team/images.rego", "package deployguard.images\n\ndeny contains \"x\" if input.operation\n"),
			},
			want: []string{`configmap/deployguard/team/images.rego:1: policy "images" is defined twice: in images.rego and in configmap/deployguard/team/images.rego`},
		},
		{
			name:    "duplicate of a built-in",
			sources: append(Builtins(), regoSource("mine.rego", "package deployguard.probes\n\nwarn contains \"x\" if input.operation\n")),
			want:    []string{`mine.rego:1: policy "probes" is defined twice: in builtin/probes.rego and in mine.rego`},
		},
		{
			name:    "compile error names source and line",
			sources: []Source{regoSource("a.rego", "package deployguard.a\n\ndeny contains msg if {\n\tmsg := undefined_fn(input)\n}\n")},
			want:    []string{"a.rego:4: rego_type_error: undefined function undefined_fn"},
		},
		{
			name:    "network builtins are not available",
			sources: []Source{regoSource("net.rego", "package deployguard.net\n\ndeny contains \"x\" if {\n\thttp.send({\"method\": \"get\", \"url\": \"http://example.com\"})\n}\n")},
			want:    []string{"net.rego:4: rego_type_error: undefined function http.send"},
		},
		{
			name:    "policy without deny or warn",
			sources: []Source{regoSource("empty.rego", "package deployguard.empty\n\nallow := true\n")},
			want:    []string{`empty.rego:1: policy "empty" defines neither deny nor warn`},
		},
		{
			name:    "deny that is not a set",
			sources: []Source{regoSource("bool.rego", "package deployguard.bool\n\ndeny := true if input.operation == \"DELETE\"\n")},
			want:    []string{"bool.rego:3: deny must be a set of messages"},
		},
		{
			name:    "unknown mode",
			sources: []Source{denyAlways("typo", "enforcing")},
			want:    []string{`typo.rego:1: custom.mode: unknown mode "enforcing"`},
		},
		{
			name:    "unknown severity",
			sources: []Source{regoSource("sev.rego", "# METADATA\n# custom:\n#   severity: urgent\npackage deployguard.sev\n\ndeny contains \"x\" if input.operation\n")},
			want:    []string{"sev.rego:1: custom.severity must be one of critical, high, medium, low, info, not urgent"},
		},
		{
			name:    "category that is not a string",
			sources: []Source{regoSource("cat.rego", "# METADATA\n# custom:\n#   category: [a, b]\npackage deployguard.cat\n\ndeny contains \"x\" if input.operation\n")},
			want:    []string{"cat.rego:1: custom.category must be a string"},
		},
		{
			name:    "bare deployguard package",
			sources: []Source{regoSource("root.rego", "package deployguard\n\ndeny contains \"x\" if input.operation\n")},
			want:    []string{"root.rego:1: package deployguard has no policy name"},
		},
		{
			name: "errors from several sources at once",
			sources: []Source{
				regoSource("one.rego", "package deployguard.one\n\ndeny contains \"x\" if {\n"),
				regoSource("two.rego", "package deployguard.two\n\nwarn contains := 1\n"),
			},
			want: []string{"one.rego:4: rego_parse_error", "two.rego:3: rego_parse_error"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, err := New(Options{})
			require.NoError(t, err)
			err = e.Load(context.Background(), tt.sources)
			lerr, ok := AsLoadError(err)
			require.True(t, ok, "want a *LoadError, got %v", err)
			var wantSources []string
			for _, w := range tt.want {
				wantSources = append(wantSources, w[:strings.Index(w, ":")])
				assert.True(t, slices.ContainsFunc(lerr.Errors, func(se SourceError) bool {
					return strings.HasPrefix(se.Error(), w)
				}), "no error starts with %q in:\n%v", w, lerr)
			}
			assert.Equal(t, wantSources, lerr.Sources(), "only the failing sources are named")
			assert.Empty(t, e.Policies(), "a refused set never takes effect")
		})
	}
}

func TestLibraryPackages(t *testing.T) {
	// Helpers outside deployguard are compiled with the set and may be
	// imported, but are not policies themselves.
	lib := regoSource("lib.rego", "package lib.k8s\n\ncontainers(obj) := obj.spec.template.spec.containers\n")
	pol := regoSource("count.rego", `package deployguard.count

import data.lib.k8s

deny contains sprintf("%d containers is too many", [n]) if {
	n := count(k8s.containers(input.object))
	n > 1
}
`)
	e := newEngine(t, Options{}, lib, pol)
	infos := e.Policies()
	require.Len(t, infos, 1)
	assert.NotEmpty(t, infos[0].Digest)
	infos[0].Digest = ""
	assert.Equal(t, []PolicyInfo{{Name: "count", Source: "count.rego", Mode: ModeEnforce}}, infos)
	got := e.Evaluate(context.Background(), createInput(t, deployment(goodContainer("a"), goodContainer("b"))))
	assert.Equal(t, []string{"[policy count] 2 containers is too many"}, Lines(got.Denied))
}

func TestNewRejectsBadOptions(t *testing.T) {
	tests := []struct {
		name string
		opts Options
	}{
		{name: "unknown failure mode", opts: Options{FailureMode: "open"}},
		{name: "unknown force mode", opts: Options{ForceMode: "dry"}},
		{name: "unknown policy mode", opts: Options{PolicyModes: map[string]Mode{"images": "off"}}},
		{name: "negative timeout", opts: Options{EvalTimeout: -time.Second}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.opts)
			assert.Error(t, err)
		})
	}
}

func TestEvaluateWithoutInput(t *testing.T) {
	e := newEngine(t, Options{}, denyAlways("strict", ""))
	got := e.Evaluate(context.Background(), nil)
	require.Len(t, got.Denied, 1, "no input must not mean no policy")
	assert.True(t, got.Denied[0].EvalFailed)
}

// The input leaves out oldObject only when no policy of the set can read it.
func TestInputLeavesOutOldObjectOnlyWhenUnread(t *testing.T) {
	old := deployment(goodContainer("web"))
	old.Spec.Template.Spec.Containers[0].Image = "nginx:1.0"
	cur := deployment(goodContainer("web"))
	tests := []struct {
		name   string
		module string
		reads  bool
	}{
		{name: "the built-ins do not", reads: false},
		{name: "a rule about oldObject", reads: true,
			module: "package deployguard.x\n\ndeny contains \"image changed\" if input.oldObject.spec.template.spec.containers[0].image != input.object.spec.template.spec.containers[0].image\n"},
		{name: "input as a whole", reads: true,
			module: "package deployguard.x\n\ndoc := input\n\ndeny contains \"image changed\" if doc.oldObject.spec.template.spec.containers[0].image != doc.object.spec.template.spec.containers[0].image\n"},
		{name: "a member chosen at evaluation time", reads: true,
			module: "package deployguard.x\n\ndeny contains \"image changed\" if {\n\tsome k in [\"oldObject\"]\n\tinput[k].spec.template.spec.containers[0].image != input.object.spec.template.spec.containers[0].image\n}\n"},
		{name: "only the object", reads: false,
			module: "package deployguard.x\n\ndeny contains \"no\" if input.object.metadata.name == \"never\"\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sources := Builtins()
			if tt.module != "" {
				sources = append(sources, regoSource("x.rego", tt.module))
			}
			e := newEngine(t, Options{}, sources...)
			assert.Equal(t, tt.reads, e.active.Load().reads.child("oldObject") != nil)
			d, err := e.EvaluateRequest(context.Background(), Request{Operation: "UPDATE", Namespace: "team-a", Name: "shop", Object: cur, OldObject: old})
			require.NoError(t, err)
			if tt.module != "" && tt.reads {
				assert.False(t, d.Allowed(), "the rule saw oldObject")
			} else {
				assert.True(t, d.Allowed())
			}
		})
	}
}

// TestChangedSignalsEachNewSet: the audit re-evaluates when a new set becomes
// active, and only then: a load that fails keeps the old set and says nothing.
func TestChangedSignalsEachNewSet(t *testing.T) {
	e := newEngine(t, Options{}, denyAlways("one", "enforce"))
	changed := e.Changed()
	select {
	case <-changed:
		require.FailNow(t, "signalled before any change")
	default:
	}
	require.Error(t, e.Load(context.Background(), []Source{regoSource("bad.rego", "package deployguard.bad\n\ndeny contains {\n")}))
	select {
	case <-changed:
		require.FailNow(t, "a failed load signalled a change")
	default:
	}
	require.NoError(t, e.Load(context.Background(), []Source{denyAlways("two", "warn")}))
	select {
	case <-changed:
	default:
		require.FailNow(t, "a new set was not signalled")
	}
	assert.NotEqual(t, changed, e.Changed(), "the next change has a new channel")
}
