package main

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// reportFixture is a file of manifests with known lines: a denial on line 9,
// warnings on lines 17 (image) and 16 (the container without a readiness
// probe), a List item and a Service.
const reportFixture = `# a comment first
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: shop
spec:
  replicas: 2
  strategy: {rollingUpdate: {maxUnavailable: 100%}}
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
        - name: web
          image: nginx:latest
          resources: {requests: {cpu: 10m, memory: 16Mi}}
---
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Service
  metadata: {name: svc}
- apiVersion: apps/v1
  kind: Deployment
  metadata: {name: listed}
  spec:
    selector: {matchLabels: {app: listed}}
    template:
      metadata: {labels: {app: listed}}
      spec:
        containers:
        - name: c
          image: "c:1"
          readinessProbe: {tcpSocket: {port: 80}}
          resources: {requests: {cpu: 1m, memory: 1Mi}}
`

func runCheck(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(append([]string{"check"}, args...), strings.NewReader(""), &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

func TestCheckFindingsPointAtTheLine(t *testing.T) {
	p := writeFile(t, t.TempDir(), "app.yaml", reportFixture)
	code, out, stderr := runCheck(t, "-f", p, "-o", "json")
	require.Equal(t, 1, code, stderr)
	var results []checkResult
	require.NoError(t, json.Unmarshal([]byte(out), &results))
	require.Len(t, results, 3)
	web := results[0]
	assert.Equal(t, 2, web.Line, "the object starts after the comment")
	lines := map[string]int{}
	for _, f := range web.Findings {
		lines[f.Rule+" "+f.Field] = f.Line
	}
	assert.Equal(t, map[string]int{
		"check/spec.strategy.rollingUpdate.maxUnavailable spec.strategy.rollingUpdate.maxUnavailable": 9,
		"policy/images spec.template.spec.containers[0].image":                                        18,
		// A missing field points at its nearest ancestor that is written.
		"policy/probes spec.template.spec.containers[0].readinessProbe": 17,
	}, lines)
	assert.Equal(t, "skipped", results[1].Verdict)
	assert.Equal(t, 24, results[1].Line, "a List item starts at its own line")
	assert.Equal(t, "admitted", results[2].Verdict)
	assert.Equal(t, 27, results[2].Line)

	code, text, _ := runCheck(t, "-f", p)
	assert.Equal(t, 1, code)
	assert.Contains(t, text, "at once: set it below 2 (for example 25%), or to 0 with maxSurge of at least 1 (line 9)")
}

// One problem, one warning: a missing readiness probe is the probes policy's
// to report (webhook.CheckSpec leaves it to it), and no finding repeats.
func TestCheckWarnsOncePerProblem(t *testing.T) {
	_, out, stderr := runCheck(t, "-f", writeFile(t, t.TempDir(), "app.yaml", reportFixture), "-o", "json")
	var results []checkResult
	require.NoError(t, json.Unmarshal([]byte(out), &results), stderr)
	probe := 0
	seen := map[string]bool{}
	for _, f := range results[0].Findings {
		if strings.Contains(f.Message, "readinessProbe") {
			probe++
		}
		assert.False(t, seen[f.Field], "two findings on %s", f.Field)
		seen[f.Field] = true
	}
	assert.Equal(t, 1, probe, "%+v", results[0].Findings)
}

func TestFieldLine(t *testing.T) {
	raw := []byte("apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  labels:\n    app.kubernetes.io/name: web\nspec:\n  template:\n    spec:\n      containers: [{name: a, image: a}, {name: b,\n        image: b}]\n")
	doc := document{raw: raw, line: 10}
	tests := []struct {
		path string
		want int
	}{
		{"", 10},
		{"metadata.labels[app.kubernetes.io/name]", 14},
		{"spec.template.spec.containers[1].image", 19},
		{"spec.template.spec.containers[0]", 18},
		{"spec.template.spec.containers[5].image", 18},
		{"spec.strategy", 15},
		{"<document>", 10},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, fieldLine(doc, tt.path), tt.path)
	}
	assert.Zero(t, fieldLine(document{}, "spec"), "no text, no line")
	assert.Equal(t, 3, fieldLine(document{raw: []byte("{{{"), line: 3}, "spec"), "unparsable text: the document's line")
}

func TestCheckSARIFValidatesAgainstTheSchema(t *testing.T) {
	c := jsonschema.NewCompiler()
	schemaFile := filepath.Join("testdata", "schemas", "sarif-2.1.0-rtm.5.json")
	f, err := os.Open(schemaFile)
	require.NoError(t, err)
	defer f.Close()
	doc, err := jsonschema.UnmarshalJSON(f)
	require.NoError(t, err)
	require.NoError(t, c.AddResource(schemaFile, doc))
	schema, err := c.Compile(schemaFile)
	require.NoError(t, err)

	dir := t.TempDir()
	p := writeFile(t, dir, "app.yaml", reportFixture)
	for _, tt := range []struct {
		name string
		args []string
	}{
		{"findings", []string{"-f", p}},
		{"nothing to report", []string{"-f", writeFile(t, dir, "svc.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: s}\n")}},
		{"kustomize", []string{"-k", kustomizeFixture(t)}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, out, stderr := runCheck(t, append(tt.args, "-o", "sarif")...)
			inst, err := jsonschema.UnmarshalJSON(strings.NewReader(out))
			require.NoError(t, err, stderr)
			require.NoError(t, schema.Validate(inst), out)
		})
	}

	_, out, _ := runCheck(t, "-f", p, "-o", "sarif")
	var log struct {
		Version string
		Runs    []struct {
			Results []struct {
				RuleID    string
				Level     string
				Locations []struct {
					PhysicalLocation struct {
						ArtifactLocation struct{ URI string }
						Region           struct{ StartLine int }
					}
				}
			}
		}
	}
	require.NoError(t, json.Unmarshal([]byte(out), &log))
	assert.Equal(t, "2.1.0", log.Version)
	require.Len(t, log.Runs, 1)
	got := map[string]int{}
	for _, r := range log.Runs[0].Results {
		require.Len(t, r.Locations, 1)
		assert.Equal(t, "file://"+filepath.ToSlash(p), r.Locations[0].PhysicalLocation.ArtifactLocation.URI)
		got[r.Level+" "+r.RuleID] = r.Locations[0].PhysicalLocation.Region.StartLine
	}
	assert.Equal(t, map[string]int{
		"error check/spec.strategy.rollingUpdate.maxUnavailable": 9,
		"warning policy/images":                                  18,
		"warning policy/probes":                                  17,
	}, got)
}

// junitRule is what the Jenkins xunit-plugin's JUnit schema (junit-10.xsd)
// allows of one element.
type junitRule struct {
	children []string
	attrs    []string
	required []string
	ints     []string
}

// junitRules transcribes junit-10.xsd (which extends the common junit-4.xsd):
// there is no XML Schema validator for Go without cgo, so the test checks the
// same constraints by hand.
var junitRules = map[string]junitRule{
	"testsuites": {children: []string{"testsuite"}, attrs: []string{"name", "time", "tests", "failures", "disabled", "errors"},
		ints: []string{"tests", "failures", "disabled", "errors"}},
	"testsuite": {children: []string{"testsuite", "properties", "testcase", "system-out", "system-err"},
		attrs:    []string{"name", "tests", "failures", "errors", "group", "time", "disabled", "skipped", "timestamp", "hostname", "id", "package", "file", "log", "url", "version"},
		required: []string{"name", "tests"}, ints: []string{"tests", "failures", "errors", "disabled", "skipped"}},
	"testcase": {children: []string{"properties", "skipped", "error", "failure", "rerunFailure", "rerunError", "flakyFailure", "flakyError", "system-out", "system-err"},
		attrs:    []string{"name", "assertions", "time", "classname", "status", "class", "file", "line", "log", "group", "url"},
		required: []string{"name"}, ints: []string{"assertions", "line"}},
	"failure":    {attrs: []string{"message", "type"}},
	"error":      {attrs: []string{"message", "type"}},
	"skipped":    {attrs: []string{"message"}},
	"system-out": {},
	"system-err": {},
}

type xmlElement struct {
	name     string
	attrs    map[string]string
	children []*xmlElement
}

func parseXML(t *testing.T, b []byte) *xmlElement {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(b))
	var stack []*xmlElement
	var root *xmlElement
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		switch x := tok.(type) {
		case xml.StartElement:
			e := &xmlElement{name: x.Name.Local, attrs: map[string]string{}}
			for _, a := range x.Attr {
				e.attrs[a.Name.Local] = a.Value
			}
			if len(stack) > 0 {
				stack[len(stack)-1].children = append(stack[len(stack)-1].children, e)
			} else {
				root = e
			}
			stack = append(stack, e)
		case xml.EndElement:
			stack = stack[:len(stack)-1]
		}
	}
	require.NotNil(t, root)
	return root
}

func validateJUnit(t *testing.T, e *xmlElement) {
	t.Helper()
	rule, ok := junitRules[e.name]
	require.True(t, ok, "element <%s> is not in the schema", e.name)
	for a, v := range e.attrs {
		assert.Contains(t, rule.attrs, a, "<%s %s> is not in the schema", e.name, a)
		if slices.Contains(rule.ints, a) {
			_, err := strconv.Atoi(v)
			assert.NoError(t, err, "<%s %s=%q> is not an integer", e.name, a, v)
		}
	}
	for _, a := range rule.required {
		assert.Contains(t, e.attrs, a, "<%s> lacks required %s", e.name, a)
	}
	for _, c := range e.children {
		assert.Contains(t, rule.children, c.name, "<%s> may not contain <%s>", e.name, c.name)
		validateJUnit(t, c)
	}
}

func TestCheckJUnitValidatesAgainstTheSchema(t *testing.T) {
	dir := t.TempDir()
	p := writeFile(t, dir, "app.yaml", reportFixture)
	patch := writeFile(t, dir, "patch.yaml", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec:\n  template:\n    spec:\n      containers:\n      - name: web\n        $patch: delete\n")
	for _, strict := range []bool{false, true} {
		args := []string{"-f", p, "-f", patch, "-o", "junit"}
		if strict {
			args = append(args, "--strict")
		}
		code, out, stderr := runCheck(t, args...)
		require.Equal(t, 1, code, stderr)
		root := parseXML(t, []byte(out))
		require.Equal(t, "testsuites", root.name)
		validateJUnit(t, root)

		// The counts add up, and each finding is told with file and line.
		total := 0
		cases := map[string]*xmlElement{}
		for _, s := range root.children {
			n, _ := strconv.Atoi(s.attrs["tests"])
			assert.Len(t, s.children, n)
			total += n
			for _, c := range s.children {
				cases[c.attrs["name"]] = c
			}
		}
		assert.Equal(t, strconv.Itoa(total), root.attrs["tests"])
		web := cases["Deployment shop/web (document 1)"]
		require.NotNil(t, web, out)
		require.Len(t, web.children, 2, "a failure and the warnings")
		assert.Equal(t, "failure", web.children[0].name)
		assert.Equal(t, "2", web.attrs["line"])
		assert.Contains(t, out, p+":9: [check/spec.strategy.rollingUpdate.maxUnavailable] Invalid value")
		assert.Contains(t, out, p+":18: [policy/images]")
		assert.Equal(t, "skipped", cases["Deployment web (document 1)"].children[0].name, "the patch is skipped")
		listed := cases["Deployment default/listed (document 2)"]
		require.NotNil(t, listed)
		assert.Empty(t, listed.children, "admitted without warnings")
	}
}

// A field set by a strategic-merge patch is found in the patch, by the
// element's name (the patch's index need not be the rendered one); one the
// patch does not set is found in the source.
func TestFindFieldInPatches(t *testing.T) {
	rendered := []byte(`{"spec":{"replicas":3,"template":{"spec":{"containers":[{"name":"web","image":"web:2"},{"name":"sidecar","image":"s:1"}]}}}}`)
	src := document{file: "base.yaml", line: 1, json: rendered,
		raw: []byte("spec:\n  replicas: 1\n  template:\n    spec:\n      containers:\n      - name: web\n        image: web:1\n      - name: sidecar\n        image: s:1\n")}
	src.patches = []document{
		{file: "replicas.yaml", line: 1, raw: []byte("spec:\n  replicas: 3\n")},
		{file: "image.yaml", line: 1, raw: []byte("spec:\n  template:\n    spec:\n      containers:\n      - name: sidecar\n        imagePullPolicy: Always\n      - name: web\n        image: web:2\n")},
	}
	tests := []struct {
		path, file string
		line       int
	}{
		{"spec.replicas", "replicas.yaml", 2},
		{"spec.template.spec.containers[0].image", "image.yaml", 8},
		{"spec.template.spec.containers[1].image", "base.yaml", 9},
		{"spec.template.spec.containers[0].readinessProbe", "base.yaml", 6},
	}
	for _, tt := range tests {
		file, line := findField(src, tt.path)
		assert.Equal(t, tt.file+":"+strconv.Itoa(tt.line), file+":"+strconv.Itoa(line), tt.path)
	}
}
