// Package upstream is the upstream compatibility tier: Kubernetes' own e2e
// specs for Deployments, built from the same k8s.io/kubernetes module as the
// control plane (test/tools/kube/upstreame2e), run against a local cluster
// without the guard and then against one with the guard as installed. Every
// spec that passes without the guard must pass with it, unless
// differences.yaml names it with the deliberate behaviour that explains it.
package upstream

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/deployguard/deployguard/test/harness"
)

// selected are the upstream specs this tier runs: a whole group where the
// entry ends with a space, else one spec by its full name.
var selected = []string{
	"[sig-apps] Deployment ",
	"[sig-apps] ReplicaSet ",
	// Specs of other groups that create, update or delete Deployments.
	"[sig-api-machinery] ValidatingAdmissionPolicy [Privileged:ClusterAdmin] should validate against a Deployment [Conformance]",
	"[sig-api-machinery] MutatingAdmissionPolicy [Privileged:ClusterAdmin] should mutate a Deployment [Conformance]",
	"[sig-api-machinery] MutatingAdmissionPolicy [Privileged:ClusterAdmin] should mutate a Deployment with annotations [Conformance]",
	"[sig-api-machinery] Garbage collector should delete RS created by deployment when not orphaning [Conformance]",
	"[sig-api-machinery] Garbage collector should orphan RS created by deployment when deleteOptions.PropagationPolicy is Orphan [Conformance]",
	"[sig-api-machinery] ServerSideApply should remove a field if it is owned but removed in the apply request",
	"[sig-api-machinery] ServerSideApply should not remove a field if an owner unsets the field but other managers still have ownership of the field",
	"[sig-api-machinery] ServerSideApply should ignore conflict errors if force apply is used",
	"[sig-api-machinery] ServerSideApply should give up ownership of a field if forced applied by a controller",
	"[sig-api-machinery] FieldValidation should detect unknown and duplicate fields of a typed object [Conformance]",
	"[sig-api-machinery] FieldValidation should detect unknown metadata fields of a typed object [Conformance]",
}

// excluded are selected specs that cannot run on a local kwok cluster, with
// the reason (README.md lists them too).
var excluded = map[string]string{
	"[sig-apps] ReplicaSet should serve a basic image on each replica with a public image [Conformance]":                    "sends HTTP requests to the pods through the API server's proxy; kwok pods run no containers",
	"[sig-apps] ReplicaSet should serve a basic image on each replica with a private image [Provider:gce]":                  "needs the gce provider (skips itself elsewhere)",
	"[sig-apps] Deployment should not disrupt a cloud load-balancer's connectivity during rollout [Provider:aws,azure,gce]": "needs a cloud load balancer (skips itself without aws, azure or gce)",
}

// difference is an entry of differences.yaml: a spec that passes without the
// guard and may fail with it, because of a deliberate, documented behaviour.
type difference struct {
	Spec      string `json:"spec"`
	Behaviour string `json:"behaviour"`
	README    string `json:"readme"`
}

// result is one spec's outcome in one run, as ginkgo reports it, with the
// admission warnings its client printed.
type result struct {
	State    string   `json:"state"`
	Failure  string   `json:"failure,omitempty"`
	Seconds  int      `json:"seconds"`
	Warnings []string `json:"warnings,omitempty"`
}

// row is a line of the table the tier prints and writes under bin/.
type row struct {
	Spec         string  `json:"spec"`
	WithoutGuard result  `json:"withoutGuard"`
	WithGuard    result  `json:"withGuard"`
	Verdict      string  `json:"verdict"`
	Difference   *string `json:"difference,omitempty"`
}

// tier has the control plane and the guard binary; its work folder is
// bin/upstream, which keeps the tier's report.
var tier *harness.Tier

func TestMain(m *testing.M) {
	os.Exit(harness.RunTier(m, harness.TierOptions{
		Name: "upstream",
		// The specs' output, the clusters' logs and the table stay there.
		WorkDir: filepath.Join(harness.RepoRoot(), "bin", "upstream"),
		Setup: func(_ context.Context, tr *harness.Tier) error {
			tier = tr
			return nil
		},
	}))
}

func TestUpstreamCompatibility(t *testing.T) {
	tools, guard, out := tier.Tools, tier.Guard, tier.WorkDir
	e2e := os.Getenv("DEPLOYGUARD_UPSTREAM_E2E")
	if e2e == "" {
		e2e = filepath.Join(tools, "e2e-upstream.test")
	}
	_, err := os.Stat(e2e)
	require.NoError(t, err, "the upstream e2e binary is missing: run `make upstream-e2e` (or `make test-upstream`, which builds it)")
	// The install's own configuration (config/manager), not make run's.
	installConfig, err := os.ReadFile(filepath.Join(harness.RepoRoot(), "config", "manager", "guard.yaml"))
	require.NoError(t, err)
	diffs := readDifferences(t)

	work := t.TempDir()
	start := time.Now()

	without := func(ctx context.Context, log io.Writer) (string, func(), error) {
		c, err := harness.StartCluster(ctx, tools, fmt.Sprintf("dg-up-plain-%d", os.Getpid()), filepath.Join(work, "plain"), 2, log)
		if err != nil {
			return "", nil, err
		}
		return c.Kubeconfig, func() { _ = c.Stop() }, nil
	}
	with := func(ctx context.Context, log io.Writer) (string, func(), error) {
		l, err := harness.StartLocal(ctx, harness.LocalOptions{
			Tools: tools, Guard: guard, Name: fmt.Sprintf("dg-up-guard-%d", os.Getpid()),
			WorkDir: filepath.Join(work, "guard"), Nodes: 2, GuardConfig: string(installConfig), Log: log,
		})
		if err != nil {
			return "", nil, err
		}
		return l.Cluster.Kubeconfig, l.Stop, nil
	}
	before := runSuite(t, e2e, out, "without-guard", without)
	after := runSuite(t, e2e, out, "with-guard", with)

	assert.Empty(t, unmatched(before), "selected upstream specs that did not run: did upstream rename them?")
	rows, problems := compare(before, after, diffs)
	writeTable(t, out, rows, time.Since(start))
	for _, p := range problems {
		assert.Fail(t, p)
	}
}

// runSuite starts a cluster, runs the selected specs against it and returns
// their results by full name. The e2e output, the cluster's log and ginkgo's
// JSON report stay in out, named after the run.
func runSuite(t *testing.T, e2e, out, name string, start func(context.Context, io.Writer) (string, func(), error)) map[string]result {
	t.Helper()
	log, err := os.Create(filepath.Join(out, name+".cluster.log"))
	require.NoError(t, err)
	defer log.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	kubeconfig, stop, err := start(ctx, log)
	cancel()
	require.NoError(t, err, "starting the cluster %s (log: %s)", name, log.Name())
	defer stop()

	report := filepath.Join(out, name+".report.json")
	args := []string{
		"--kubeconfig", kubeconfig,
		// No cloud: the framework's null provider.
		"--provider", "skeleton",
		"--ginkgo.json-report", report,
		"--ginkgo.no-color", "--ginkgo.v",
		// Within the tier's budget; a spec that hangs is reported as such.
		"--ginkgo.timeout", "25m",
	}
	for _, s := range selected {
		args = append(args, "--ginkgo.focus", regexp.QuoteMeta(s))
	}
	for s := range excluded {
		args = append(args, "--ginkgo.skip", regexp.QuoteMeta(s))
	}
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, e2e, args...)
	cmd.Dir = out
	e2eLog, err := os.Create(filepath.Join(out, name+".e2e.log"))
	require.NoError(t, err)
	defer e2eLog.Close()
	cmd.Stdout, cmd.Stderr = e2eLog, e2eLog
	began := time.Now()
	// A failing spec makes the binary exit 1: the report says which.
	runErr := cmd.Run()
	t.Logf("%s: the upstream specs ran in %s (exit: %v; output: %s)", name, time.Since(began).Round(time.Second), runErr, e2eLog.Name())
	results, err := readReport(report)
	require.NoError(t, err, "reading ginkgo's report of %s (output: %s)", name, e2eLog.Name())
	return results
}

// ginkgoReport is the part of ginkgo's JSON report the tier reads.
type ginkgoReport []struct {
	SpecReports []struct {
		ContainerHierarchyTexts    []string
		LeafNodeText               string
		LeafNodeType               string
		State                      string
		RunTime                    time.Duration
		Failure                    *struct{ Message string }
		CapturedGinkgoWriterOutput string
	}
}

// warningLine is how client-go's warning handler, logging through klog into
// the spec's output, prints an admission warning.
var warningLine = regexp.MustCompile(`warnings\.go:\d+\] ("Warning: .*")$`)

func warnings(output string) []string {
	var ws []string
	for _, l := range strings.Split(output, "\n") {
		m := warningLine.FindStringSubmatch(strings.TrimSpace(l))
		if m == nil {
			continue
		}
		w, err := strconv.Unquote(m[1])
		if err != nil {
			w = m[1]
		}
		ws = append(ws, strings.TrimPrefix(w, "Warning: "))
	}
	return ws
}

func readReport(path string) (map[string]result, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r ginkgoReport
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	results := map[string]result{}
	for _, suite := range r {
		for _, s := range suite.SpecReports {
			name := strings.Join(append(slices.Clone(s.ContainerHierarchyTexts), s.LeafNodeText), " ")
			if s.LeafNodeType != "It" || !isSelected(name) {
				// Suite nodes, and the specs the focus left out.
				if s.LeafNodeType != "It" && s.State != "passed" && s.Failure != nil {
					return nil, fmt.Errorf("the suite's %s %s: %s", s.LeafNodeType, s.State, s.Failure.Message)
				}
				continue
			}
			res := result{State: s.State, Seconds: int(s.RunTime.Round(time.Second).Seconds()), Warnings: warnings(s.CapturedGinkgoWriterOutput)}
			if s.Failure != nil && s.State != "passed" {
				res.Failure = firstLine(s.Failure.Message)
			}
			results[name] = res
		}
	}
	return results, nil
}

func isSelected(name string) bool {
	if _, ok := excluded[name]; ok {
		return false
	}
	for _, s := range selected {
		if strings.HasPrefix(name, s) {
			return true
		}
	}
	return false
}

// compare applies the pass rule to the results of the two runs: the table's
// rows, and every breach of the rule in words.
func compare(before, after map[string]result, diffs map[string]difference) (rows []row, problems []string) {
	var names []string
	for n := range before {
		names = append(names, n)
	}
	for n := range after {
		if _, ok := before[n]; !ok {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	for _, n := range names {
		b, a := before[n], after[n]
		r := row{Spec: n, WithoutGuard: b, WithGuard: a}
		d, listed := diffs[n]
		if listed {
			r.Difference = &d.Behaviour
		}
		switch {
		case b.State != "passed":
			// The local cluster cannot run it, or upstream flaked: nothing is
			// proven. Specs the cluster cannot run belong in excluded.
			r.Verdict = "not comparable"
			problems = append(problems, fmt.Sprintf("%s is %s without the guard: %s\n  fix the local cluster, or exclude the spec with the reason (excluded, README.md)", n, b.State, b.Failure))
		case a.State == "passed" && listed:
			r.Verdict = "same (listed as a difference)"
			problems = append(problems, fmt.Sprintf("%s is listed in differences.yaml but passes with the guard: remove the entry", n))
		case a.State == "passed":
			r.Verdict = "same"
		case listed:
			r.Verdict = "listed difference"
		default:
			r.Verdict = "BROKEN BY THE GUARD"
			problems = append(problems, fmt.Sprintf("%s passes without the guard and is %s with it: %s", n, a.State, a.Failure))
		}
		rows = append(rows, r)
	}
	for n := range diffs {
		if _, ok := before[n]; !ok {
			problems = append(problems, fmt.Sprintf("differences.yaml names %q, which this tier does not run", n))
		}
	}
	return rows, problems
}

// unmatched are the entries of selected that no spec in results answers to:
// upstream renamed or removed them.
func unmatched(results map[string]result) []string {
	names := slices.Collect(maps.Keys(results))
	var missing []string
	for _, s := range selected {
		if !slices.ContainsFunc(names, func(n string) bool { return strings.HasPrefix(n, s) }) {
			missing = append(missing, s)
		}
	}
	return missing
}

func readDifferences(t *testing.T) map[string]difference {
	t.Helper()
	b, err := os.ReadFile("differences.yaml")
	require.NoError(t, err)
	var doc struct {
		Differences []difference `json:"differences"`
	}
	require.NoError(t, yaml.UnmarshalStrict(b, &doc), "differences.yaml")
	diffs := map[string]difference{}
	for _, d := range doc.Differences {
		require.NotEmpty(t, d.Spec, "differences.yaml: an entry without a spec")
		require.NotEmpty(t, d.Behaviour, "differences.yaml: %s: say which deliberate behaviour causes the difference", d.Spec)
		require.NotEmpty(t, d.README, "differences.yaml: %s: name the README section that documents it", d.Spec)
		diffs[d.Spec] = d
	}
	return diffs
}

// writeTable prints the table and writes it, with the failures, as
// bin/upstream/results.json.
func writeTable(t *testing.T, out string, rows []row, took time.Duration) {
	t.Helper()
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SPEC\tWITHOUT GUARD\tWITH GUARD\tVERDICT\tGUARD'S WARNINGS")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\n", r.Spec, r.WithoutGuard.State, r.WithGuard.State, r.Verdict, len(guardWarnings(r)))
	}
	require.NoError(t, tw.Flush())
	fmt.Fprintf(&buf, "\nupstream tier: %d specs in %s\n", len(rows), took.Round(time.Second))
	for _, r := range rows {
		if r.WithGuard.Failure != "" && r.WithoutGuard.State == "passed" {
			fmt.Fprintf(&buf, "\n%s, with the guard:\n  %s\n", r.Spec, r.WithGuard.Failure)
		}
	}
	// Every distinct admission warning the specs' clients got from the guard:
	// what users of upstream's own manifests would read.
	seen := map[string]int{}
	for _, r := range rows {
		for _, w := range guardWarnings(r) {
			seen[w]++
		}
	}
	if len(seen) > 0 {
		fmt.Fprintf(&buf, "\nadmission warnings with the guard (count, message):\n")
		ws := slices.Sorted(maps.Keys(seen))
		for _, w := range ws {
			fmt.Fprintf(&buf, "  %4d  %s\n", seen[w], w)
		}
	}
	t.Log("\n" + buf.String())
	require.NoError(t, os.WriteFile(filepath.Join(out, "results.txt"), buf.Bytes(), 0o644))
	j, err := json.MarshalIndent(struct {
		WallSeconds int   `json:"wallSeconds"`
		Specs       []row `json:"specs"`
	}{int(took.Seconds()), rows}, "", "  ")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(out, "results.json"), append(j, '\n'), 0o644))
}

// guardWarnings are the warnings of a spec with the guard that it did not get
// without: the API server's own (a Deployment name with dots, say) are not
// the guard's.
func guardWarnings(r row) []string {
	var ws []string
	for _, w := range r.WithGuard.Warnings {
		if !slices.Contains(r.WithoutGuard.Warnings, w) {
			ws = append(ws, w)
		}
	}
	return ws
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
