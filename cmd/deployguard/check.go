package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/deployguard/deployguard/cmd/deployguard/config"
	guardwebhook "github.com/deployguard/deployguard/webhook"
)

// Exit codes of `deployguard check`.
const (
	exitAdmitted = 0
	exitDenied   = 1
	exitUsage    = 2
)

type checkFlags struct {
	files      multiFlag
	output     string
	strict     bool
	configFile string
	policyDir  string
	namespace  string
	username   string
	groups     string
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

// checkResult is one object's verdict; its JSON form is `check -o json`.
type checkResult struct {
	File      string         `json:"file"`
	Document  int            `json:"document"`
	Kind      string         `json:"kind"`
	Namespace string         `json:"namespace,omitempty"`
	Name      string         `json:"name,omitempty"`
	Verdict   string         `json:"verdict"` // admitted, denied, skipped
	Problems  []checkProblem `json:"problems,omitempty"`
	Warnings  []string       `json:"warnings,omitempty"`
	Defaulted []string       `json:"defaulted,omitempty"`
	Note      string         `json:"note,omitempty"`
}

type checkProblem struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

func check(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	f := checkFlags{}
	fs := flag.NewFlagSet("deployguard check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Var(&f.files, "f", "a manifest file, a directory of manifests, or - for stdin (YAML or JSON, multi-document); repeatable")
	fs.StringVar(&f.output, "o", "text", "output format: text or json")
	fs.BoolVar(&f.strict, "strict", false, "fail on warnings too")
	fs.StringVar(&f.configFile, "config", "", "the guard's config file, as given to serve")
	fs.StringVar(&f.policyDir, "policy-dir", "", "a directory of Rego policies to apply besides the built-in library")
	fs.StringVar(&f.namespace, "namespace", "default", "namespace of objects that name none")
	fs.StringVar(&f.username, "as", "", "username the policies see in input.userInfo")
	fs.StringVar(&f.groups, "as-group", "", "comma-separated groups the policies see in input.userInfo")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitAdmitted
		}
		return exitUsage
	}
	if len(f.files) == 0 || fs.NArg() > 0 || (f.output != "text" && f.output != "json") {
		fmt.Fprintln(stderr, "usage: deployguard check -f PATH [-f PATH…] [-o text|json] [--strict] [--config FILE] [--policy-dir DIR]")
		return exitUsage
	}
	cfg, err := config.Load(f.configFile)
	if err != nil {
		fmt.Fprintf(stderr, "deployguard check: %v\n", err)
		return exitUsage
	}
	eng, _, err := newPolicyEngine(context.Background(), cfg, f.policyDir)
	if err != nil {
		fmt.Fprintf(stderr, "deployguard check: %v\n", err)
		return exitUsage
	}
	pipe := newPipeline(cfg, guardwebhook.RegoPolicies{Engine: eng})
	user := authenticationv1.UserInfo{Username: f.username, Groups: splitList(f.groups)}

	var results []checkResult
	for _, path := range f.files {
		docs, err := readDocuments(path, stdin)
		if err != nil {
			fmt.Fprintf(stderr, "deployguard check: %v\n", err)
			return exitUsage
		}
		for _, d := range docs {
			results = append(results, pipe.check(context.Background(), d, f.namespace, user)...)
		}
	}

	code := exitAdmitted
	for _, r := range results {
		if r.Verdict == "denied" || (f.strict && r.Verdict == "admitted" && len(r.Warnings) > 0) {
			code = exitDenied
		}
	}
	if f.output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.SetEscapeHTML(false)
		if results == nil {
			results = []checkResult{}
		}
		_ = enc.Encode(results)
		return code
	}
	printText(stdout, results)
	return code
}

func printText(w io.Writer, results []checkResult) {
	counts := map[string]int{}
	for _, r := range results {
		counts[r.Verdict]++
		obj := r.Kind
		switch {
		case r.Name != "" && r.Namespace != "":
			obj += " " + r.Namespace + "/" + r.Name
		case r.Name != "":
			obj += " " + r.Name
		}
		fmt.Fprintf(w, "%s#%d %s: %s\n", r.File, r.Document, obj, strings.ToUpper(r.Verdict))
		for _, p := range r.Problems {
			fmt.Fprintf(w, "  error   %s: %s\n", p.Field, p.Message)
		}
		for _, x := range r.Warnings {
			fmt.Fprintf(w, "  warning %s\n", x)
		}
		if len(r.Defaulted) > 0 {
			fmt.Fprintf(w, "  note    the guard would default: %s\n", strings.Join(r.Defaulted, ", "))
		}
		if r.Note != "" {
			fmt.Fprintf(w, "  note    %s\n", r.Note)
		}
	}
	fmt.Fprintf(w, "%d admitted, %d denied, %d skipped\n", counts["admitted"], counts["denied"], counts["skipped"])
}

// document is one YAML or JSON document of an input file.
type document struct {
	file  string
	index int // 1-based, in its file
	json  []byte
}

// readDocuments reads a file, every manifest of a directory (recursively), or
// stdin for "-".
func readDocuments(path string, stdin io.Reader) ([]document, error) {
	if path == "-" {
		return splitDocuments("<stdin>", stdin)
	}
	info, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !info.IsDir() {
		fh, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer fh.Close()
		return splitDocuments(path, fh)
	}
	var files []string
	err = filepath.WalkDir(path, func(p string, e os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		switch strings.ToLower(filepath.Ext(p)) {
		case ".yaml", ".yml", ".json":
			if !e.IsDir() {
				files = append(files, p)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	var out []document
	for _, p := range files {
		docs, err := readDocuments(p, nil)
		if err != nil {
			return nil, err
		}
		out = append(out, docs...)
	}
	return out, nil
}

func splitDocuments(name string, r io.Reader) ([]document, error) {
	rd := utilyaml.NewYAMLReader(bufio.NewReader(r))
	var out []document
	for i := 1; ; i++ {
		b, err := rd.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", name, i, err)
		}
		if len(bytes.TrimSpace(stripComments(b))) == 0 {
			i--
			continue
		}
		j, err := yaml.YAMLToJSON(b)
		if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", name, i, err)
		}
		out = append(out, document{file: name, index: i, json: j})
	}
}

func stripComments(b []byte) []byte {
	var out []byte
	for _, l := range bytes.Split(b, []byte("\n")) {
		if t := bytes.TrimSpace(l); len(t) > 0 && t[0] != '#' && string(t) != "---" {
			out = append(out, l...)
		}
	}
	return out
}

// pipeline is the admission pipeline of the cluster, run offline: the API
// server's built-in defaults, the mutating webhook's defaults, the validating
// webhook's Go checks, then the Rego policies.
type pipeline struct {
	opts   *guardwebhook.Options
	policy guardwebhook.PolicyEvaluator
	// seen indexes the Deployments admitted so far, as the webhook's index
	// does the cluster's, so that a later manifest that overlaps an earlier
	// one is refused as the cluster would refuse it.
	seen *guardwebhook.OverlapIndex
}

func (p *pipeline) check(ctx context.Context, doc document, defaultNS string, user authenticationv1.UserInfo) []checkResult {
	var head struct {
		APIVersion string            `json:"apiVersion"`
		Kind       string            `json:"kind"`
		Items      []json.RawMessage `json:"items"`
		Metadata   struct {
			Name      string `json:"name"`
			Namespace string `json:"namespace"`
		} `json:"metadata"`
	}
	res := checkResult{File: doc.file, Document: doc.index}
	if err := json.Unmarshal(doc.json, &head); err != nil || head.Kind == "" {
		res.Kind, res.Verdict = "unknown", "skipped"
		res.Note = "not a Kubernetes object (no kind); passed over"
		return []checkResult{res}
	}
	res.Kind, res.Name, res.Namespace = head.Kind, head.Metadata.Name, head.Metadata.Namespace
	if strings.HasSuffix(head.Kind, "List") && head.APIVersion == "v1" {
		var out []checkResult
		for _, item := range head.Items {
			out = append(out, p.check(ctx, document{file: doc.file, index: doc.index, json: item}, defaultNS, user)...)
		}
		return out
	}
	if head.APIVersion != "apps/v1" || head.Kind != "Deployment" {
		res.Verdict = "skipped"
		res.Note = fmt.Sprintf("%s %s is not an apps/v1 Deployment; passed over", head.APIVersion, head.Kind)
		return []checkResult{res}
	}
	d := &appsv1.Deployment{}
	dec := json.NewDecoder(bytes.NewReader(doc.json))
	if err := dec.Decode(d); err != nil {
		res.Verdict = "denied"
		res.Problems = []checkProblem{{Field: "<document>", Message: "cannot be read as an apps/v1 Deployment: " + err.Error()}}
		return []checkResult{res}
	}
	if d.Namespace == "" {
		d.Namespace = defaultNS
	}
	res.Namespace = d.Namespace
	v := p.admit(ctx, d, user)
	res.Verdict, res.Problems, res.Warnings, res.Defaulted = v.verdict, v.problems, v.warnings, v.defaulted
	if v.verdict == "admitted" {
		p.seen.Set(d)
	}
	return []checkResult{res}
}

type verdict struct {
	verdict   string
	problems  []checkProblem
	warnings  []string
	defaulted []string
}

// admit runs one Deployment through the pipeline, as a CREATE.
func (p *pipeline) admit(ctx context.Context, d *appsv1.Deployment, user authenticationv1.UserInfo) verdict {
	guardwebhook.APIServerDefaults(d)
	defaulted, errs := guardwebhook.Default(d, nil, p.opts, false)
	if len(errs) > 0 {
		return verdict{verdict: "denied", problems: problemsOf(errs)}
	}
	f := guardwebhook.Validate(ctx, d, nil, user, p.opts, p.seen)
	f.Warnings = append(guardwebhook.DefaultingWarnings(d, defaulted), f.Warnings...)
	if p.policy != nil {
		pv := p.policy.EvaluateDeployment(ctx, guardwebhook.PolicyInput{
			Operation: "CREATE", Object: d, Namespace: d.Namespace, UserInfo: user,
		})
		f.Errs = append(f.Errs, pv.Denials...)
		f.Warnings = append(f.Warnings, pv.Warnings...)
	}
	v := verdict{verdict: "admitted", warnings: f.Warnings, defaulted: defaulted}
	if len(f.Errs) > 0 {
		v.verdict, v.problems = "denied", problemsOf(f.Errs)
	}
	return v
}

func problemsOf(errs field.ErrorList) []checkProblem {
	out := make([]checkProblem, 0, len(errs))
	for _, e := range errs {
		out = append(out, checkProblem{Field: e.Field, Message: e.ErrorBody()})
	}
	return out
}

// newPipeline builds the offline pipeline from the same config file and policy
// sources as serve.
func newPipeline(cfg config.Config, policy guardwebhook.PolicyEvaluator) *pipeline {
	return &pipeline{
		opts:   cfg.WebhookOptions(""),
		policy: policy,
		seen:   guardwebhook.NewOverlapIndex(nil),
	}
}
