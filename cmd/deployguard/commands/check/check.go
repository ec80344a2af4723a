package check

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/kustomize/api/konfig"
	"sigs.k8s.io/yaml"

	"github.com/deployguard/deployguard/cmd/deployguard/cli"
	"github.com/deployguard/deployguard/cmd/deployguard/config"
	"github.com/deployguard/deployguard/cmd/deployguard/report"
	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/webhook/review"
)

// Exit codes of `deployguard check`.
const (
	exitAdmitted = 0
	exitDenied   = 1
	exitUsage    = 2
)

type checkFlags struct {
	files      []string
	kustomize  []string
	output     string
	strict     bool
	configFile string
	policyDir  string
	exceptions string
	// clusterExceptions: read the cluster's PolicyExceptions once, through
	// kubeconfig.
	clusterExceptions bool
	kubeconfig        string
	namespace         string
	username          string
	groups            string
}

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
	// Line is where the object starts in File (0: unknown).
	Line int `json:"line,omitempty"`
	// Findings are the problems and warnings again, each with the rule that
	// raised it and the line of its field: what -o sarif and -o junit show.
	Findings []checkFinding `json:"findings,omitempty"`
}

type checkProblem struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// checkFinding is one problem (level "error") or warning (level "warning").
type checkFinding struct {
	Level string `json:"level"`
	Rule  string `json:"rule"`
	Field string `json:"field,omitempty"`
	// File is set when the field is written in another file than the
	// object's: a kustomize patch.
	File    string `json:"file,omitempty"`
	Line    int    `json:"line,omitempty"`
	Message string `json:"message"`
}

// findingsOf gives every refusal and warning of a review its rule and line:
// refusals first, then warnings, each in the order the checks ran.
func findingsOf(doc document, fs review.Findings) []checkFinding {
	var out []checkFinding
	for _, level := range []review.Severity{review.SeverityError, review.SeverityWarning} {
		for _, f := range fs {
			if f.Severity != level {
				continue
			}
			cf := checkFinding{Level: string(level), Rule: ruleID(f.Policy, f.Field), Field: f.Field, Message: f.Line()}
			if f.Err != nil {
				cf.Field, cf.Message = f.Err.Field, f.Err.ErrorBody()
			}
			out = append(out, locate(doc, cf))
		}
	}
	return out
}

func locate(doc document, f checkFinding) checkFinding {
	file, line := findField(doc, f.Field)
	f.Line = line
	if file != doc.file {
		f.File = file
	}
	return f
}

var indexRE = regexp.MustCompile(`\[[^\]]*\]`)

// ruleID names what raised a finding: a policy ("policy/images"), or the Go
// check of a field ("check/spec.strategy.rollingUpdate.maxUnavailable").
func ruleID(policy, path string) string {
	switch {
	case policy != "":
		return "policy/" + policy
	case path == "" || path == "<document>":
		return "check/object"
	}
	return "check/" + indexRE.ReplaceAllString(path, "")
}

// NewCommand is `deployguard check`: the admission pipeline on manifests,
// offline, as the cluster's guard would run it (CI).
func NewCommand(s cli.Streams) *cobra.Command {
	f := checkFlags{}
	cmd := cli.NewCommand(s, &cobra.Command{
		Use:   "check (-f PATH | -k DIR)… [flags]",
		Short: "run the admission pipeline on manifests, offline (CI)",
		Long: `Runs the guard's admission pipeline (defaults, checks, the built-in and your
Rego policies, PolicyExceptions) on manifests, offline, and says what the
cluster's guard would do with each Deployment: admitted, admitted with
warnings, or denied, with the field and the line. Exit 0 admitted, 1 denied
(or warned, with --strict), 2 the command line, a manifest or a policy was
wrong.`,
		Example: `  deployguard check -f deploy/
  kustomize build overlays/prod | deployguard check -f - -o sarif
  deployguard check -k overlays/prod --policy-dir policies/ --strict`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(f.files)+len(f.kustomize) == 0 || len(args) > 0 || !slices.Contains([]string{"text", "json", "sarif", "junit"}, f.output) {
				fmt.Fprintln(s.ErrOut, "usage: deployguard check (-f PATH | -k DIR)… [-o text|json|sarif|junit] [--strict] [--config FILE] [--policy-dir DIR]")
				return cli.Exit(exitUsage)
			}
			return cli.Exit(run(f, s.In, s.Out, s.ErrOut))
		},
	})
	fl := cmd.Flags()
	fl.StringArrayVarP(&f.files, "filename", "f", nil, "a manifest file, a directory of manifests, or - for stdin (YAML or JSON, multi-document); repeatable")
	fl.StringArrayVarP(&f.kustomize, "kustomize", "k", nil, "a kustomization directory: built in-process (as kustomize build) and what it renders checked; repeatable")
	fl.StringVarP(&f.output, "output", "o", "text", "output format: text, json, sarif (SARIF 2.1.0, for code scanning) or junit (JUnit XML)")
	fl.BoolVar(&f.strict, "strict", false, "fail on warnings too")
	fl.StringVar(&f.configFile, "config", "", "the guard's config file, as given to serve")
	fl.StringVar(&f.policyDir, "policy-dir", "", "a directory of Rego policies to apply besides the built-in library")
	fl.StringVar(&f.exceptions, "exceptions", "", "a file or directory of PolicyExceptions to apply, as the cluster applies them (those in exceptions.namespace)")
	fl.BoolVar(&f.clusterExceptions, "cluster-exceptions", false, "apply the PolicyExceptions the cluster holds now (read once, from exceptions.namespace), as its guard does")
	fl.StringVar(&f.kubeconfig, "kubeconfig", "", "with --cluster-exceptions: a kubeconfig; in-cluster configuration or $KUBECONFIG when empty")
	fl.StringVar(&f.namespace, "namespace", "default", "namespace of objects that name none")
	fl.StringVar(&f.username, "as", "", "username the policies see in input.userInfo")
	fl.StringVar(&f.groups, "as-group", "", "comma-separated groups the policies see in input.userInfo")
	cli.CompleteWords(cmd, "output", "text", "json", "sarif", "junit")
	_ = cmd.MarkFlagDirname("kustomize")
	_ = cmd.MarkFlagDirname("policy-dir")
	_ = cmd.MarkFlagFilename("config", "yaml", "yml")
	cmd.ValidArgsFunction = cobra.NoFileCompletions
	return cmd
}

func run(f checkFlags, stdin io.Reader, stdout, stderr io.Writer) int {
	cfg, err := config.Load(f.configFile)
	if err != nil {
		fmt.Fprintf(stderr, "deployguard check: %v\n", err)
		return exitUsage
	}
	eng, _, err := cli.NewPolicyEngine(context.Background(), cfg, f.policyDir)
	if err != nil {
		fmt.Fprintf(stderr, "deployguard check: %v\n", err)
		return exitUsage
	}
	pipe := newPipeline(cfg, review.RegoPolicies{Engine: eng})
	if f.exceptions != "" || f.clusterExceptions {
		idx, err := exceptionIndex(f, cfg, config.PolicyNames(eng))
		if err != nil {
			fmt.Fprintf(stderr, "deployguard check: %v\n", err)
			return exitUsage
		}
		pipe.review.Exceptions = idx
	}
	user := authenticationv1.UserInfo{Username: f.username, Groups: vocab.SplitList(f.groups)}

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
	for _, dir := range f.kustomize {
		docs, err := buildKustomization(dir)
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
	tool := report.Tool{Name: "deployguard", Version: cli.Version, InformationURI: "https://github.com/deployguard/deployguard"}
	switch f.output {
	case "sarif":
		if err := report.WriteSARIF(stdout, tool, reportResults(results)); err != nil {
			fmt.Fprintf(stderr, "deployguard check: %v\n", err)
			return exitUsage
		}
		return code
	case "junit":
		if err := report.WriteJUnit(stdout, tool, reportResults(results), f.strict); err != nil {
			fmt.Fprintf(stderr, "deployguard check: %v\n", err)
			return exitUsage
		}
		return code
	}
	if f.output == "json" {
		if results == nil {
			results = []checkResult{}
		}
		cli.WriteJSON(stdout, results)
		return code
	}
	printText(stdout, results)
	return code
}

func reportResults(results []checkResult) []report.Result {
	out := make([]report.Result, 0, len(results))
	for _, r := range results {
		rr := report.Result{File: r.File, Document: r.Document, Line: r.Line, Kind: r.Kind, Namespace: r.Namespace, Name: r.Name, Verdict: r.Verdict, Note: r.Note}
		for _, f := range r.Findings {
			rr.Findings = append(rr.Findings, report.Finding{Level: f.Level, Rule: f.Rule, Field: f.Field, File: f.File, Line: f.Line, Message: f.Message})
		}
		out = append(out, rr)
	}
	return out
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
		for _, f := range r.Findings {
			at := ""
			switch {
			case f.File != "":
				at = fmt.Sprintf(" (%s:%d)", f.File, f.Line)
			case f.Line > 0:
				at = fmt.Sprintf(" (line %d)", f.Line)
			}
			if f.Level == "error" {
				fmt.Fprintf(w, "  error   %s: %s%s\n", f.Field, f.Message, at)
			} else {
				fmt.Fprintf(w, "  warning %s%s\n", f.Message, at)
			}
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
	// raw is the document's own text and line the line of the file it starts
	// on, so that a finding's field path can be resolved to a line.
	raw  []byte
	line int
	// path is where the object sits in the document: "" for the document
	// itself, "items[2]" for an item of a List.
	path string
	// patchOf names the kustomization that lists this file as a patch; its
	// documents are fragments, not objects.
	patchOf string
	// patches are, for an object kustomize rendered, the patch documents that
	// may have set its fields, in the order applied.
	patches []document
}

// maxManifestBytes bounds one input file: a manifest larger than this is not
// a manifest, and reading it whole must not exhaust CI's memory.
const maxManifestBytes = 64 << 20

// readDocuments reads a file, every manifest of a directory (recursively), or
// stdin for "-". Files that a kustomization of the tree (or, for a single
// file, of a directory above it) lists as patches are marked as such.
func readDocuments(path string, stdin io.Reader) ([]document, error) {
	if path == "-" {
		return splitDocuments("<stdin>", stdin)
	}
	info, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !info.IsDir() {
		patches, err := kustomizationPatches(ancestors(path))
		if err != nil {
			return nil, err
		}
		return readFile(path, patches)
	}
	var files, dirs []string
	err = filepath.WalkDir(path, func(p string, e os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() {
			dirs = append(dirs, p)
			return nil
		}
		switch strings.ToLower(filepath.Ext(p)) {
		case ".yaml", ".yml", ".json":
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	patches, err := kustomizationPatches(dirs)
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	var out []document
	for _, p := range files {
		docs, err := readFile(p, patches)
		if err != nil {
			return nil, err
		}
		out = append(out, docs...)
	}
	return out, nil
}

// ancestors are the directories above a file, up to the root of its
// repository (the first with .git) or of the file system: where a
// kustomization that lists the file as a patch can be.
func ancestors(path string) []string {
	var out []string
	for dir := filepath.Dir(cleanPath(path)); ; dir = filepath.Dir(dir) {
		out = append(out, dir)
		if _, err := os.Stat(filepath.Join(dir, ".git")); err == nil || filepath.Dir(dir) == dir {
			return out
		}
	}
}

func readFile(path string, patches map[string]string) ([]document, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	docs, err := splitDocuments(path, fh)
	if err != nil {
		return nil, err
	}
	if k, ok := patches[cleanPath(path)]; ok {
		for i := range docs {
			docs[i].patchOf = k
		}
	}
	return docs, nil
}

func cleanPath(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return filepath.Clean(p)
}

// splitDocuments splits a YAML or JSON stream into its documents, as
// kubectl's reader (k8s.io/apimachinery's YAMLReader) does: a line that starts
// with "---" followed by nothing but blanks or a comment separates documents.
// Each document keeps its text and the line it starts on.
func splitDocuments(name string, r io.Reader) ([]document, error) {
	all, err := io.ReadAll(io.LimitReader(r, maxManifestBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if len(all) > maxManifestBytes {
		return nil, fmt.Errorf("%s: larger than %d MiB; not a manifest", name, maxManifestBytes>>20)
	}
	var out []document
	index := 0
	flush := func(raw []byte, line int) error {
		if len(bytes.TrimSpace(stripComments(raw))) == 0 {
			return nil
		}
		index++
		j, err := yaml.YAMLToJSON(raw)
		if err != nil {
			return fmt.Errorf("%s: document %d (line %d): %w", name, index, line, err)
		}
		out = append(out, document{file: name, index: index, json: j, raw: raw, line: line})
		return nil
	}
	var cur []byte
	start, lineNo := 1, 0
	for rest := all; len(rest) > 0; {
		lineNo++
		l := rest
		if i := bytes.IndexByte(rest, '\n'); i >= 0 {
			l, rest = rest[:i+1], rest[i+1:]
		} else {
			rest = nil
		}
		if isSeparator(l) {
			if err := flush(cur, start); err != nil {
				return nil, err
			}
			cur, start = nil, lineNo+1
			continue
		}
		if len(cur) == 0 {
			start = lineNo
		}
		cur = append(cur, l...)
	}
	if err := flush(cur, start); err != nil {
		return nil, err
	}
	return out, nil
}

// isSeparator is YAMLReader's rule: "---" at the start of a line, then only
// blanks or a comment.
func isSeparator(line []byte) bool {
	if !bytes.HasPrefix(line, []byte("---")) {
		return false
	}
	rest := bytes.TrimSpace(line[3:])
	return len(rest) == 0 || rest[0] == '#'
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
// server's built-in defaults, then the webhooks' review (defaults, Go checks,
// policies) as a CREATE.
type pipeline struct {
	review *review.Reviewer
	// seen indexes the Deployments admitted so far, as the webhook's index
	// does the cluster's, so that a later manifest that overlaps an earlier
	// one is refused as the cluster would refuse it.
	seen *review.OverlapIndex
	// budgets indexes the PodDisruptionBudgets met so far, for the drain check.
	budgets *review.BudgetIndex
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
	res := checkResult{File: doc.file, Document: doc.index, Line: fieldLine(doc, "")}
	if err := json.Unmarshal(doc.json, &head); err != nil || head.Kind == "" {
		res.Kind, res.Verdict = "unknown", "skipped"
		res.Note = "not a Kubernetes object (no kind); passed over"
		switch {
		case doc.patchOf != "":
			res.Note = "a patch that " + doc.patchOf + " lists; passed over (check -k checks what the kustomization renders)"
		case slices.Contains(konfig.RecognizedKustomizationFileNames(), filepath.Base(doc.file)):
			res.Kind, res.Note = "Kustomization", "a kustomization; passed over (check -k "+filepath.Dir(doc.file)+" checks what it renders)"
		}
		return []checkResult{res}
	}
	res.Kind, res.Name, res.Namespace = head.Kind, head.Metadata.Name, head.Metadata.Namespace
	if strings.HasSuffix(head.Kind, "List") && head.APIVersion == "v1" {
		var out []checkResult
		for i, item := range head.Items {
			sub := doc
			sub.json = item
			sub.path = strings.TrimPrefix(doc.path+".items["+strconv.Itoa(i)+"]", ".")
			out = append(out, p.check(ctx, sub, defaultNS, user)...)
		}
		return out
	}
	// A strategic-merge patch is a fragment kustomize merges into a base: it
	// lacks what an object needs and would be refused for it. Its rendered
	// result is what check -k checks.
	switch {
	case hasPatchDirective(doc.json):
		res.Verdict = "skipped"
		res.Note = "a strategic-merge patch ($patch directive), not an object; passed over (check -k checks what a kustomization renders with it)"
		return []checkResult{res}
	case doc.patchOf != "":
		res.Verdict = "skipped"
		res.Note = "a patch that " + doc.patchOf + " lists, not an object; passed over (check -k checks what the kustomization renders)"
		return []checkResult{res}
	}
	if head.APIVersion == "policy/v1" && head.Kind == "PodDisruptionBudget" {
		return []checkResult{p.checkBudget(doc, res, defaultNS, user)}
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
		res.Findings = []checkFinding{locate(doc, checkFinding{Level: "error", Rule: ruleID("", res.Problems[0].Field),
			Field: res.Problems[0].Field, Message: res.Problems[0].Message})}
		return []checkResult{res}
	}
	if d.Namespace == "" {
		d.Namespace = defaultNS
	}
	res.Namespace = d.Namespace
	review.APIServerDefaults(d)
	rev := p.review.Review(ctx, review.Request{Operation: admissionv1.Create, Object: d, UserInfo: user}, review.Offline)
	res.Verdict, res.Warnings, res.Defaulted = "admitted", rev.Findings.Warnings(), rev.Defaulted
	for _, f := range rev.Findings {
		if f.Severity != review.SeverityError {
			continue
		}
		res.Verdict = "denied"
		// A native policy's refusal in the API server's words.
		msg := f.Err.ErrorBody()
		if f.Native {
			msg = f.Message
		}
		res.Problems = append(res.Problems, checkProblem{Field: f.Err.Field, Message: msg})
	}
	res.Findings = findingsOf(doc, rev.Findings)
	if res.Verdict == "admitted" {
		p.seen.Set(d)
	}
	return []checkResult{res}
}

// checkBudget judges a PodDisruptionBudget as its webhook does, against the
// Deployments admitted so far, and keeps it for the Deployments after it: a
// budget and a Deployment that together allow no eviction are reported on
// whichever comes second, as the cluster reports them.
func (p *pipeline) checkBudget(doc document, res checkResult, defaultNS string, user authenticationv1.UserInfo) checkResult {
	pdb := &policyv1.PodDisruptionBudget{}
	if err := json.Unmarshal(doc.json, pdb); err != nil {
		res.Verdict = "denied"
		res.Problems = []checkProblem{{Field: "<document>", Message: "cannot be read as a policy/v1 PodDisruptionBudget: " + err.Error()}}
		res.Findings = []checkFinding{locate(doc, checkFinding{Level: "error", Rule: ruleID("", res.Problems[0].Field),
			Field: res.Problems[0].Field, Message: res.Problems[0].Message})}
		return res
	}
	if pdb.Namespace == "" {
		pdb.Namespace = defaultNS
	}
	res.Namespace = pdb.Namespace
	f := p.review.ReviewBudget(pdb, nil, user.Username, user.Groups)
	res.Verdict, res.Warnings = "admitted", f.Warnings()
	if errs := f.Refusals(); len(errs) > 0 {
		res.Verdict = "denied"
		for _, e := range errs {
			res.Problems = append(res.Problems, checkProblem{Field: e.Field, Message: e.ErrorBody()})
		}
	}
	res.Findings = findingsOf(doc, f)
	if res.Verdict == "admitted" {
		p.budgets.Set(pdb)
	}
	return res
}

// newPipeline builds the offline pipeline from the same config file and policy
// sources as serve.
func newPipeline(cfg config.Config, policies review.Policies) *pipeline {
	seen := review.NewOverlapIndex(nil)
	budgets := review.NewBudgetIndex(seen)
	return &pipeline{
		review:  &review.Reviewer{Options: cfg.WebhookOptions(""), Overlaps: seen, Budgets: budgets, Policies: policies},
		seen:    seen,
		budgets: budgets,
	}
}
