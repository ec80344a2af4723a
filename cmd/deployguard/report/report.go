// Package report writes `deployguard check`'s verdicts in the formats CI
// systems read: SARIF 2.1.0 for code-scanning UIs (GitHub's upload-sarif,
// GitLab, Azure DevOps), which show each finding on its manifest's line, and
// JUnit XML for test-report views.
package report

import (
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"path/filepath"
	"sort"
	"strings"
)

// Result is one object's verdict, as check reached it.
type Result struct {
	File      string
	Document  int
	Line      int // where the object starts; 0 when unknown
	Kind      string
	Namespace string
	Name      string
	Verdict   string // admitted, denied, skipped
	Note      string
	Findings  []Finding
}

// Finding is one problem (Level "error") or warning (Level "warning").
type Finding struct {
	Level   string
	Rule    string
	Field   string
	File    string // when not the object's file (a kustomize patch)
	Line    int    // 0 when unknown
	Message string
}

// Object names the object for people: "Deployment shop/web".
func (r Result) Object() string {
	switch {
	case r.Name != "" && r.Namespace != "":
		return r.Kind + " " + r.Namespace + "/" + r.Name
	case r.Name != "":
		return r.Kind + " " + r.Name
	}
	return r.Kind
}

// Tool identifies the tool in the reports.
type Tool struct {
	Name           string
	Version        string
	InformationURI string
}

// SARIF schema and version this package writes.
const (
	SARIFVersion = "2.1.0"
	SARIFSchema  = "https://json.schemastore.org/sarif-2.1.0.json"
)

type sarifLog struct {
	Schema  string     `json:"$schema"`
	Version string     `json:"version"`
	Runs    []sarifRun `json:"runs"`
}

type sarifRun struct {
	Tool struct {
		Driver sarifDriver `json:"driver"`
	} `json:"tool"`
	Results []sarifResult `json:"results"`
}

type sarifDriver struct {
	Name           string      `json:"name"`
	Version        string      `json:"version,omitempty"`
	InformationURI string      `json:"informationUri,omitempty"`
	Rules          []sarifRule `json:"rules"`
}

type sarifRule struct {
	ID               string        `json:"id"`
	ShortDescription sarifMessage  `json:"shortDescription"`
	DefaultConfig    *sarifRuleCfg `json:"defaultConfiguration,omitempty"`
}

type sarifRuleCfg struct {
	Level string `json:"level"`
}

type sarifMessage struct {
	Text string `json:"text"`
}

type sarifResult struct {
	RuleID    string          `json:"ruleId"`
	RuleIndex int             `json:"ruleIndex"`
	Level     string          `json:"level"`
	Message   sarifMessage    `json:"message"`
	Locations []sarifLocation `json:"locations"`
}

type sarifLocation struct {
	PhysicalLocation sarifPhysical  `json:"physicalLocation"`
	LogicalLocations []sarifLogical `json:"logicalLocations,omitempty"`
}

type sarifPhysical struct {
	ArtifactLocation sarifArtifact `json:"artifactLocation"`
	Region           *sarifRegion  `json:"region,omitempty"`
}

type sarifArtifact struct {
	URI string `json:"uri"`
}

type sarifRegion struct {
	StartLine int `json:"startLine"`
}

type sarifLogical struct {
	Name               string `json:"name,omitempty"`
	FullyQualifiedName string `json:"fullyQualifiedName"`
	Kind               string `json:"kind"`
}

// WriteSARIF writes one SARIF run with a result per finding, located at the
// finding's file and line (the object's line when the field's is unknown),
// the field path as its logical location. Skipped objects have no findings.
func WriteSARIF(w io.Writer, tool Tool, results []Result) error {
	ruleIndex := map[string]int{}
	var rules []sarifRule
	var out []sarifResult
	for _, r := range results {
		for _, f := range r.Findings {
			i, ok := ruleIndex[f.Rule]
			if !ok {
				i = len(rules)
				ruleIndex[f.Rule] = i
				rules = append(rules, sarifRule{ID: f.Rule, ShortDescription: sarifMessage{Text: ruleDescription(f.Rule)}})
			}
			file, line := r.at(f)
			loc := sarifLocation{PhysicalLocation: sarifPhysical{ArtifactLocation: sarifArtifact{URI: artifactURI(file)}}}
			if line > 0 {
				loc.PhysicalLocation.Region = &sarifRegion{StartLine: line}
			}
			fq := r.Object()
			if f.Field != "" {
				fq += " " + f.Field
			}
			loc.LogicalLocations = []sarifLogical{{Name: f.Field, FullyQualifiedName: fq, Kind: "member"}}
			out = append(out, sarifResult{
				RuleID: f.Rule, RuleIndex: i, Level: sarifLevel(f.Level),
				Message:   sarifMessage{Text: r.Object() + ": " + f.Message},
				Locations: []sarifLocation{loc},
			})
		}
	}
	if rules == nil {
		rules = []sarifRule{}
	}
	if out == nil {
		out = []sarifResult{}
	}
	run := sarifRun{Results: out}
	run.Tool.Driver = sarifDriver{Name: tool.Name, Version: tool.Version, InformationURI: tool.InformationURI, Rules: rules}
	log := sarifLog{Schema: SARIFSchema, Version: SARIFVersion, Runs: []sarifRun{run}}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(log)
}

func ruleDescription(rule string) string {
	switch {
	case strings.HasPrefix(rule, "policy/"):
		return "deployguard policy " + strings.TrimPrefix(rule, "policy/")
	case rule == "check/object":
		return "deployguard check of the object as a whole"
	}
	return "deployguard check of " + strings.TrimPrefix(rule, "check/")
}

func sarifLevel(l string) string {
	switch l {
	case "error", "warning", "note":
		return l
	}
	return "none"
}

// artifactURI is a file path as a SARIF URI reference: relative paths stay
// relative (code scanning resolves them against the checkout), with forward
// slashes.
func artifactURI(p string) string {
	if p == "<stdin>" {
		return "stdin"
	}
	p = filepath.ToSlash(p)
	if filepath.IsAbs(p) {
		return "file://" + p
	}
	return strings.TrimPrefix(p, "./")
}

// at is where f stands: in another file (a kustomize patch), at its own
// line there; otherwise in r's file, at its line or, when that is unknown,
// at r's.
func (r Result) at(f Finding) (file string, line int) {
	switch {
	case f.File != "":
		return f.File, f.Line
	case f.Line != 0:
		return r.File, f.Line
	}
	return r.File, r.Line
}

// JUnit XML as the Jenkins xUnit plugin's junit-10.xsd allows it (the
// strictest of the common readers: it validates a report before reading it):
// <testsuites> of one <testsuite> per file, one <testcase> per object. That
// schema has no file or line on <testcase>: the file is the suite's, and each
// finding's file and line are in the text of its failure or system-out.
type junitSuites struct {
	XMLName  xml.Name     `xml:"testsuites"`
	Name     string       `xml:"name,attr"`
	Tests    int          `xml:"tests,attr"`
	Failures int          `xml:"failures,attr"`
	Errors   int          `xml:"errors,attr"`
	Suites   []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Name     string      `xml:"name,attr"`
	Tests    int         `xml:"tests,attr"`
	Failures int         `xml:"failures,attr"`
	Errors   int         `xml:"errors,attr"`
	Skipped  int         `xml:"skipped,attr"`
	Time     string      `xml:"time,attr"`
	File     string      `xml:"file,attr"`
	Cases    []junitCase `xml:"testcase"`
}

type junitCase struct {
	Name      string        `xml:"name,attr"`
	Classname string        `xml:"classname,attr"`
	Time      string        `xml:"time,attr"`
	Failure   *junitFailure `xml:"failure,omitempty"`
	Skipped   *junitSkipped `xml:"skipped,omitempty"`
	SystemOut string        `xml:"system-out,omitempty"`
}

type junitFailure struct {
	Message string `xml:"message,attr"`
	Type    string `xml:"type,attr"`
	Text    string `xml:",chardata"`
}

type junitSkipped struct {
	Message string `xml:"message,attr"`
}

// WriteJUnit writes a test case per object: a failure for a denied one (or,
// when strict, an admitted one with warnings), skipped for one passed over;
// warnings go to its system-out. Each finding is written file:line: field:
// message.
func WriteJUnit(w io.Writer, tool Tool, results []Result, strict bool) error {
	byFile := map[string]*junitSuite{}
	var files []string
	all := junitSuites{Name: tool.Name + " check"}
	for _, r := range results {
		s, ok := byFile[r.File]
		if !ok {
			s = &junitSuite{Name: r.File, File: r.File, Time: "0"}
			byFile[r.File] = s
			files = append(files, r.File)
		}
		c := junitCase{Name: fmt.Sprintf("%s (document %d)", r.Object(), r.Document), Classname: r.File, Time: "0"}
		var errs, warns []string
		for _, f := range r.Findings {
			file, at := r.at(f)
			line := fmt.Sprintf("%s:%d: [%s] %s", file, at, f.Rule, f.Message)
			if f.Level == "error" {
				errs = append(errs, line)
			} else {
				warns = append(warns, line)
			}
		}
		switch {
		case r.Verdict == "skipped":
			c.Skipped = &junitSkipped{Message: r.Note}
			s.Skipped++
		case r.Verdict == "denied":
			c.Failure = &junitFailure{Message: fmt.Sprintf("denied: %d problems", len(errs)), Type: "denied", Text: strings.Join(errs, "\n")}
			s.Failures++
		case strict && len(warns) > 0:
			c.Failure = &junitFailure{Message: fmt.Sprintf("%d warnings (--strict)", len(warns)), Type: "warning", Text: strings.Join(warns, "\n")}
			s.Failures++
		}
		if len(warns) > 0 && (c.Failure == nil || c.Failure.Type != "warning") {
			c.SystemOut = strings.Join(warns, "\n")
		}
		s.Tests++
		s.Cases = append(s.Cases, c)
	}
	sort.Strings(files)
	for _, f := range files {
		s := byFile[f]
		all.Tests += s.Tests
		all.Failures += s.Failures
		all.Suites = append(all.Suites, *s)
	}
	if _, err := io.WriteString(w, xml.Header); err != nil {
		return err
	}
	enc := xml.NewEncoder(w)
	enc.Indent("", "  ")
	if err := enc.Encode(all); err != nil {
		return err
	}
	_, err := io.WriteString(w, "\n")
	return err
}
