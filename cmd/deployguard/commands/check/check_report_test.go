package check

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/deployguard/deployguard/cmd/deployguard/cli"
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
	code := cli.Run(NewCommand, args, strings.NewReader(""), &stdout, &stderr)
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
// to report (review's spec checks leave it to it), and no finding repeats.
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

// validateXML validates doc against the XML Schema in schemaFile with xmllint
// (libxml2, Debian's libxml2-utils), and returns its complaints when doc does
// not validate. xmllint rather than Go: the standard library has no XML
// Schema validator, the Go modules that do it are either libxml2 through cgo
// or new and little used, and libxml2's validator is the one CI tooling has
// long relied on. `make test-unit` installs it; without it the test fails,
// it does not skip.
func validateXML(t *testing.T, schemaFile string, doc []byte) error {
	t.Helper()
	bin, err := exec.LookPath("xmllint")
	require.NoError(t, err, "validating JUnit XML needs xmllint: `make xmllint` (or `make test-unit`) installs it with apt-get install libxml2-utils")
	p := filepath.Join(t.TempDir(), "report.xml")
	require.NoError(t, os.WriteFile(p, doc, 0o600))
	out, err := exec.Command(bin, "--noout", "--nonet", "--schema", schemaFile, p).CombinedOutput()
	var exit *exec.ExitError
	if errors.As(err, &exit) && exit.ExitCode() == 3 { // xmllint: "validation error"
		return errors.New(string(out))
	}
	// Anything else (the schema does not compile, doc is not XML) is the
	// test's fault, not the report's.
	require.NoError(t, err, "xmllint: %s", out)
	return nil
}

// junitSchema is the Jenkins xUnit plugin's junit-10.xsd, as the header of
// the file says.
var junitSchema = filepath.Join("testdata", "schemas", "junit-10.xsd")

// junitReport reads back what the test asserts of -o junit.
type junitReport struct {
	XMLName  xml.Name `xml:"testsuites"`
	Tests    int      `xml:"tests,attr"`
	Failures int      `xml:"failures,attr"`
	Suites   []struct {
		Name     string `xml:"name,attr"`
		File     string `xml:"file,attr"`
		Tests    int    `xml:"tests,attr"`
		Failures int    `xml:"failures,attr"`
		Skipped  int    `xml:"skipped,attr"`
		Cases    []struct {
			Name    string `xml:"name,attr"`
			Failure *struct {
				Type string `xml:"type,attr"`
				Text string `xml:",chardata"`
			} `xml:"failure"`
			Skipped   *struct{} `xml:"skipped"`
			SystemOut string    `xml:"system-out"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

func TestCheckJUnitValidatesAgainstTheSchema(t *testing.T) {
	dir := t.TempDir()
	denied := writeFile(t, dir, "app.yaml", reportFixture)
	clean := writeFile(t, dir, "clean.yaml", `apiVersion: apps/v1
kind: Deployment
metadata: {name: clean, namespace: shop}
spec:
  selector: {matchLabels: {app: clean}}
  template:
    metadata: {labels: {app: clean}}
    spec:
      containers:
      - name: c
        image: "c:1"
        readinessProbe: {tcpSocket: {port: 80}}
        resources: {requests: {cpu: 1m, memory: 1Mi}}
`)
	warned := writeFile(t, dir, "warned.yaml", `apiVersion: apps/v1
kind: Deployment
metadata: {name: warned, namespace: shop}
spec:
  selector: {matchLabels: {app: warned}}
  template:
    metadata: {labels: {app: warned}}
    spec:
      containers:
      - name: c
        image: nginx:latest
        readinessProbe: {tcpSocket: {port: 80}}
        resources: {requests: {cpu: 1m, memory: 1Mi}}
`)
	patch := writeFile(t, dir, "patch.yaml", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec:\n  template:\n    spec:\n      containers:\n      - name: web\n        $patch: delete\n")
	empty := writeFile(t, dir, "empty.yaml", "# nothing here yet\n")

	// Each case's outcome, keyed "file: test case": passed, skipped,
	// failure:denied or failure:warning, and +warnings when the warnings are
	// in system-out.
	tests := []struct {
		name     string
		args     []string
		code     int
		outcomes map[string]string
	}{
		{"no findings", []string{"-f", clean}, 0, map[string]string{
			"clean.yaml: Deployment shop/clean (document 1)": "passed",
		}},
		{"nothing to check", []string{"-f", empty}, 0, map[string]string{}},
		{"denied", []string{"-f", denied}, 1, map[string]string{
			"app.yaml: Deployment shop/web (document 1)":       "failure:denied+warnings",
			"app.yaml: Service svc (document 2)":               "skipped",
			"app.yaml: Deployment default/listed (document 2)": "passed",
		}},
		{"warnings", []string{"-f", warned}, 0, map[string]string{
			"warned.yaml: Deployment shop/warned (document 1)": "passed+warnings",
		}},
		{"warnings with --strict", []string{"-f", warned, "--strict"}, 1, map[string]string{
			"warned.yaml: Deployment shop/warned (document 1)": "failure:warning",
		}},
		{"patch fragment skipped", []string{"-f", patch}, 0, map[string]string{
			"patch.yaml: Deployment web (document 1)": "skipped",
		}},
		{"several files", []string{"-f", denied, "-f", clean, "-f", warned, "-f", patch}, 1, map[string]string{
			"app.yaml: Deployment shop/web (document 1)":       "failure:denied+warnings",
			"app.yaml: Service svc (document 2)":               "skipped",
			"app.yaml: Deployment default/listed (document 2)": "passed",
			"clean.yaml: Deployment shop/clean (document 1)":   "passed",
			"warned.yaml: Deployment shop/warned (document 1)": "passed+warnings",
			"patch.yaml: Deployment web (document 1)":          "skipped",
		}},
		{"kustomize", []string{"-k", kustomizeFixture(t)}, 1, map[string]string{
			// The denial is the overlay's patch's, told at its line.
			"deployment.yaml: Deployment shop/prod-web (document 1)": "failure:denied+warnings",
			"service.yaml: Service shop/prod-web (document 1)":       "skipped",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, stderr := runCheck(t, append(tt.args, "-o", "junit")...)
			require.Equal(t, tt.code, code, stderr)
			require.NoError(t, validateXML(t, junitSchema, []byte(out)), out)

			var report junitReport
			require.NoError(t, xml.Unmarshal([]byte(out), &report))
			got := map[string]string{}
			tests, failures := 0, 0
			for _, s := range report.Suites {
				assert.Equal(t, s.Name, s.File, "one suite per file")
				assert.Len(t, s.Cases, s.Tests, s.Name)
				sf, ss := 0, 0
				for _, c := range s.Cases {
					outcome := "passed"
					switch {
					case c.Failure != nil:
						outcome = "failure:" + c.Failure.Type
						sf++
					case c.Skipped != nil:
						outcome = "skipped"
						ss++
					}
					if c.SystemOut != "" {
						outcome += "+warnings"
					}
					got[filepath.Base(s.Name)+": "+c.Name] = outcome
				}
				assert.Equal(t, sf, s.Failures, s.Name)
				assert.Equal(t, ss, s.Skipped, s.Name)
				tests += s.Tests
				failures += s.Failures
			}
			assert.Equal(t, tt.outcomes, got, out)
			assert.Equal(t, tests, report.Tests)
			assert.Equal(t, failures, report.Failures)
		})
	}

	// Each finding is told with its file and line.
	_, out, _ := runCheck(t, "-f", denied, "-o", "junit")
	assert.Contains(t, out, denied+":9: [check/spec.strategy.rollingUpdate.maxUnavailable] Invalid value")
	assert.Contains(t, out, denied+":18: [policy/images]")
	_, out, _ = runCheck(t, "-f", warned, "-o", "junit", "--strict")
	assert.Contains(t, out, warned+":11: [policy/images]")
}

// The schema check bites: what junit-10.xsd refuses, xmllint refuses with it.
func TestJUnitSchemaRejects(t *testing.T) {
	tests := []struct {
		name, doc, complaint string
	}{
		{"a line on a test case", `<testsuites><testsuite name="a.yaml" tests="1" failures="0" errors="0"><testcase name="x" line="2"/></testsuite></testsuites>`,
			"attribute 'line': The attribute 'line' is not allowed"},
		{"a suite without its failures count", `<testsuites><testsuite name="a.yaml" tests="0" errors="0"/></testsuites>`,
			"The attribute 'failures' is required"},
		{"a count that is not a number", `<testsuites><testsuite name="a.yaml" tests="one" failures="0" errors="0"/></testsuites>`,
			"'one' is not a valid value"},
		{"a test case outside a suite", `<testsuites><testcase name="x"/></testsuites>`,
			"This element is not expected"},
		{"a failure at the suite's level", `<testsuites><testsuite name="a.yaml" tests="0" failures="0" errors="0"><failure/></testsuite></testsuites>`,
			"This element is not expected"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := validateXML(t, junitSchema, []byte(xml.Header+tt.doc))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.complaint)
		})
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
