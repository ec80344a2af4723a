package policy

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/deployguard/deployguard/test/harness"
)

// paths renders a projection as the sorted paths it reads whole, "*" for
// any member; "<all>" when it reads everything.
func (p *projection) paths() []string {
	if p.whole {
		return []string{"<all>"}
	}
	var out []string
	var walk func(n *projection, prefix string)
	walk = func(n *projection, prefix string) {
		if n.whole {
			out = append(out, prefix)
			return
		}
		for k, m := range n.members {
			walk(m, prefix+"."+k)
		}
		if n.any != nil {
			walk(n.any, prefix+".*")
		}
	}
	walk(p, "input")
	sort.Strings(out)
	return out
}

func setReads(t *testing.T, sources ...Source) *projection {
	t.Helper()
	return newEngine(t, Options{}, sources...).active.Load().reads
}

// The built-in policies read a few members of each container: the input
// leaves out the env, the volumes and the rest of the pod template.
func TestInputReadsOfTheBuiltins(t *testing.T) {
	spec := "input.object.spec.template.spec."
	want := []string{}
	for _, kind := range []string{"containers", "initContainers"} {
		for _, m := range []string{"image", "name", "resources.requests.cpu", "resources.requests.memory"} {
			want = append(want, spec+kind+".*."+m)
		}
	}
	want = append(want, spec+"containers.*.readinessProbe", spec+"hostIPC", spec+"hostNetwork", spec+"hostPID")
	sort.Strings(want)
	assert.Equal(t, want, setReads(t, Builtins()...).paths())
}

func TestInputReads(t *testing.T) {
	tests := []struct {
		name   string
		module string
		want   []string
	}{
		{"a member", `deny contains "x" if input.object.metadata.name == "x"`,
			[]string{"input.object.metadata.name"}},
		{"input bound to a variable", `deny contains "x" if { doc := input; doc.object.metadata.name == "x" }`,
			[]string{"input.object.metadata.name"}},
		{"input as a whole", `deny contains "x" if { doc := input; count(doc) > 0 }`,
			[]string{"<all>"}},
		{"input in a function", `deny contains "x" if count(input) > 100`,
			[]string{"<all>"}},
		{"a part passed to a builtin", `deny contains "x" if count(input.object.spec.template.spec.containers) > 3`,
			[]string{"input.object.spec.template.spec.containers"}},
		{"a part compared", `deny contains "x" if input.object.spec.template == input.oldObject.spec.template`,
			[]string{"input.object.spec.template", "input.oldObject.spec.template"}},
		{"a variable bound to a part", `deny contains c.name if { some c in input.object.spec.template.spec.containers; c.image == "x" }`,
			[]string{"input.object.spec.template.spec.containers.*.image", "input.object.spec.template.spec.containers.*.name"}},
		{"a bound part as the rule's value", `deny contains c if { some c in input.object.spec.template.spec.containers }`,
			[]string{"input.object.spec.template.spec.containers.*"}},
		{"a bound part passed to a builtin", `deny contains "x" if { some c in input.object.spec.template.spec.containers; json.marshal(c) == "" }`,
			[]string{"input.object.spec.template.spec.containers.*"}},
		{"a member chosen at evaluation time", `deny contains "x" if { some k; input.object.spec[k] == 1 }`,
			[]string{"input.object.spec.*"}},
		{"a member from a constant set", `deny contains "x" if { some k in {"a", "b"}; input.object.spec[k] == 1 }`,
			[]string{"input.object.spec.a", "input.object.spec.b"}},
		{"a member from a constant rule", "keys := {\"a\": 1, \"b\": 2}\n\ndeny contains \"x\" if { keys[k]; input.object.spec[k] == 1 }",
			[]string{"input.object.spec.a", "input.object.spec.b"}},
		{"a member of an element by index", `deny contains "x" if input.object.spec.template.spec.containers[0].name == "x"`,
			[]string{"input.object.spec.template.spec.containers.0.name"}},
		{"object.get with a constant path", `deny contains "x" if object.get(input.object, ["spec", "paused"], false)`,
			[]string{"input.object.spec.paused"}},
		{"object.get with a variable path", `deny contains "x" if { some p in [["spec"]]; object.get(input.object, p, false) }`,
			[]string{"input.object.*"}},
		{"a function reads its parameter", "image(c) := c.image\n\ndeny contains \"x\" if { some c in input.object.spec.template.spec.containers; image(c) == \"x\" }",
			[]string{"input.object.spec.template.spec.containers.*.image"}},
		{"a function returns its parameter", "same(c) := c\n\ndeny contains \"x\" if { some c in input.object.spec.template.spec.containers; same(c).image == \"x\" }",
			[]string{"input.object.spec.template.spec.containers.*"}},
		{"a rule's value from input", "containers := input.object.spec.template.spec.containers\n\ndeny contains \"x\" if { some c in containers; c.image == \"x\" }",
			[]string{"input.object.spec.template.spec.containers"}},
		{"a comprehension", `deny contains "x" if { images := [c.image | some c in input.object.spec.template.spec.containers]; count(images) > 1 }`,
			[]string{"input.object.spec.template.spec.containers.*.image"}},
		{"every", `deny contains "x" if { every c in input.object.spec.template.spec.containers { c.image != "x" } }`,
			[]string{"input.object.spec.template.spec.containers"}},
		{"with anywhere", "deny contains \"x\" if { input.object.metadata.name == \"x\" }\n\nt if { deny with input as {} }",
			[]string{"<all>"}},
		{"a variable bound twice compares", `deny contains "x" if { a := input.object.spec.template; a = input.oldObject.spec.template; a.metadata.name == "x" }`,
			[]string{"input.object.spec.template", "input.oldObject.spec.template"}},
		{"a part unified with a pattern", `deny contains "x" if { [a, b] := [input.object.spec, input.oldObject.spec]; a.x == b.x }`,
			[]string{"input.object.spec", "input.oldObject.spec"}},
		{"a membership test", `deny contains "x" if { "x" in input.object.metadata.labels }`,
			[]string{"input.object.metadata.labels"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := setReads(t, regoSource("x.rego", "package deployguard.x\n\n"+tt.module+"\n")).paths()
			assert.Equal(t, tt.want, got)
		})
	}
}

// readsModules are policies that read the input in every way the analysis
// distinguishes; TestProjectedInputDecidesAsTheWholeInput runs each on its
// own, so that each set's projection is as narrow as the policy allows.
var readsModules = []string{
	`deny contains c.name if { some c in input.object.spec.template.spec.containers; count(c.env) > 5 }`,
	`deny contains sprintf("%v", [c]) if { some c in input.object.spec.template.spec.initContainers }`,
	`deny contains "env" if { some c in input.object.spec.template.spec.containers; some e in c.env; e.name == "SETTING_03" }`,
	`deny contains "paused" if object.get(input.object, ["spec", "paused"], false)`,
	`deny contains k if { some k in {"hostNetwork", "hostPID", "dnsPolicy"}; input.object.spec.template.spec[k] }`,
	"first(xs) := xs[0]\n\ndeny contains first(input.object.spec.template.spec.containers).name if true",
	"names := {c.name | some c in input.object.spec.template.spec.containers}\n\ndeny contains n if { some n in names; startswith(n, \"c\") }",
	`deny contains "changed" if { input.operation == "UPDATE"; input.object.spec.template.spec.containers[0].image != input.oldObject.spec.template.spec.containers[0].image }`,
	`deny contains "volume" if { some v in input.object.spec.template.spec.volumes; v.configMap.name == "web-config" }`,
	`deny contains "probe" if { some i; c := input.object.spec.template.spec.containers[i]; not c.livenessProbe.httpGet }`,
	`deny contains "keys" if { some k, _ in input.object.metadata.labels; startswith(k, "team") }`,
	`deny contains "mounts" if { every c in input.object.spec.template.spec.containers { count(c.volumeMounts) > 1 } }`,
	`deny contains sprintf("%d", [count(input.object.spec.template.spec.containers[1].env)]) if true`,
	// A variable that holds a value before its "=": a parameter, a repeated
	// or pattern parameter, an every's value, an outer variable in a closure.
	"same_labels(l) if l = input.object.metadata.labels\n\ndeny contains \"labels changed\" if not same_labels(object.get(input.oldObject, [\"metadata\", \"labels\"], {}))",
	"has_port(p) if input.object.spec.template.spec.containers[_].ports[_] = p\n\ndeny contains \"port\" if has_port({\"containerPort\": 8080, \"name\": \"http\", \"protocol\": \"TCP\"})",
	`deny contains "every" if { every want in [{"app": "shop"}] { want = input.object.metadata.labels } }`,
	`deny contains "closure" if { d := {"app": "shop"}; [1 | d = input.object.metadata.labels] != [] }`,
	"same(x, x) := true\n\ndeny contains \"selector\" if not same(input.object.spec.selector.matchLabels, input.object.spec.template.metadata.labels)",
	"app({\"app\": x}) := x\n\ndeny contains app(input.object.metadata.labels) if true",
}

// The input built of what the set reads decides every request as the whole
// input does: the corpora's Deployments, as created and as updated, through
// the built-ins and through each of readsModules.
func TestProjectedInputDecidesAsTheWholeInput(t *testing.T) {
	corpus, err := harness.CorpusDeployments()
	require.NoError(t, err)
	require.NotEmpty(t, corpus)
	corpus = append(corpus, variants()...)
	sets := [][]Source{Builtins()}
	for i, m := range readsModules {
		sets = append(sets, []Source{regoSource(fmt.Sprintf("r%d.rego", i), fmt.Sprintf("package deployguard.r%d\n\n%s\n", i, m))})
	}
	ctx := context.Background()
	compared, findings := 0, 0
	for i, sources := range sets {
		e := newEngine(t, Options{}, sources...)
		set := e.Active()
		require.False(t, set.set.reads.whole, "set %d reads the whole input", i)
		for j, d := range corpus {
			old := corpus[(j+1)%len(corpus)]
			for _, r := range []Request{
				{Operation: "CREATE", Namespace: d.Namespace, Name: d.Name, Object: d},
				{Operation: "UPDATE", Namespace: d.Namespace, Name: d.Name, Object: d, OldObject: old},
			} {
				got, err := set.EvaluateRequest(ctx, r, nil)
				require.NoError(t, err)
				in, err := NewInput(r)
				require.NoError(t, err)
				want := e.Evaluate(ctx, in)
				require.Equal(t, want, got, "set %d, %s of %s/%s", i, r.Operation, d.Namespace, d.Name)
				compared++
				findings += len(want.Denied) + len(want.Warnings)
			}
		}
	}
	t.Logf("%d decisions compared, %d findings among them", compared, findings)
	assert.Greater(t, findings, compared/4, "the comparison must cover requests with findings")
}

// An engine that has loaded nothing builds the whole input, and an object
// that no policy reads is still checked.
func TestInputBeforeAnyLoadAndUnreadObject(t *testing.T) {
	e, err := New(Options{})
	require.NoError(t, err)
	d, err := e.EvaluateRequest(context.Background(), Request{Operation: "CREATE", Namespace: "a", Name: "b", Object: deployment(goodContainer("web"))})
	require.NoError(t, err)
	assert.True(t, d.Allowed())

	e = newEngine(t, Options{}, regoSource("x.rego", "package deployguard.x\n\ndeny contains \"x\" if input.operation == \"DELETE\"\n"))
	assert.Nil(t, e.active.Load().reads.child("object"))
	_, err = e.EvaluateRequest(context.Background(), Request{Operation: "CREATE", Namespace: "a", Name: "b", Object: []byte(`{"spec":`)})
	assert.ErrorContains(t, err, "object: decoding JSON")
	assert.Nil(t, e.active.Load().reads.child("oldObject"))
	_, err = e.EvaluateRequest(context.Background(), Request{Operation: "UPDATE", Namespace: "a", Name: "b", Object: deployment(goodContainer("web")), OldObject: []byte(`{`)})
	assert.ErrorContains(t, err, "oldObject: decoding JSON")
}

// variants are Deployments that the built-ins and readsModules find
// something in.
func variants() []*appsv1.Deployment {
	c := func(name string) corev1.Container {
		return corev1.Container{Name: name, Image: "registry.example.com/" + name,
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}},
			Env:   []corev1.EnvVar{{Name: "SETTING_03", Value: "x"}, {Name: "B"}, {Name: "C"}, {Name: "D"}, {Name: "E"}, {Name: "F"}}}
	}
	d := deployment(c("c0"), c("c1"))
	d.Spec.Paused = true
	d.Spec.Template.Spec.HostNetwork = true
	d.Spec.Template.Spec.InitContainers = []corev1.Container{c("init")}
	d.Spec.Template.Spec.Volumes = []corev1.Volume{{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "web-config"}}}}}
	d.Labels["team"] = "a"
	latest := d.DeepCopy()
	latest.Name = "latest"
	latest.Spec.Template.Spec.Containers[0].Image += ":latest"
	latest.Spec.Template.Spec.Containers[1].LivenessProbe = &corev1.Probe{}
	latest.Spec.Replicas = ptr.To[int32](0)
	good := deployment(goodContainer("web"))
	good.Name = strings.Repeat("g", 3)
	// Labels set apart, so that the selector and the pod labels differ.
	apart := deployment(goodContainer("web"))
	apart.Name = "apart"
	apart.Spec.Template.Labels = map[string]string{"app": "shop", "tier": "web"}
	return []*appsv1.Deployment{d, latest, good, apart}
}

// A set reads only the spec when nothing of its policies reads the rest of
// the object, the old object or who asks; the built-ins are such a set.
func TestReadsOnlySpec(t *testing.T) {
	assert.True(t, newEngine(t, Options{}, Builtins()...).Active().ReadsOnlySpec(), "the built-in policies")
	assert.True(t, newEngine(t, Options{}).Active().ReadsOnlySpec(), "no policies")
	for src, want := range map[string]bool{
		`deny contains "x" if input.object.spec.replicas < 2`:                                                       true,
		`deny contains msg if { input.object.spec.paused; msg := sprintf("%s/%s", [input.namespace, input.name]) }`: true,
		`deny contains "x" if not input.object.metadata.annotations.owner`:                                          false,
		`deny contains "x" if input.object.metadata.labels[_] == "x"`:                                               false,
		`deny contains "x" if input.oldObject.spec.replicas > input.object.spec.replicas`:                           false,
		`deny contains "x" if input.userInfo.username == "alice"`:                                                   false,
		`deny contains "x" if input.operation == "UPDATE"`:                                                          false,
		`deny contains "x" if input.object.status.replicas == 0`:                                                    false,
		`deny contains "x" if { some k; input.object[k].x }`:                                                        false,
		`deny contains "x" if { some k; input[k] == 1 }`:                                                            false,
		`deny contains "x" if count(input) > 0`:                                                                     false,
		`deny contains "x" if count(input.object) > 0`:                                                              false,
		`deny contains "x" if { input.object.spec.paused; time.now_ns() > 0 }`:                                      false,
		`deny contains "x" if { input.object.spec.paused; rand.intn("k", 2) == 1 }`:                                 false,
		`deny contains "x" if { input.object.spec.paused; crypto.x509.parse_and_verify_certificates("x")[0] }`:      false,
	} {
		e := newEngine(t, Options{}, Source{Name: "p.rego", Module: "package deployguard.p\n\n" + src + "\n"})
		assert.Equal(t, want, e.Active().ReadsOnlySpec(), src)
	}
}
