package audit

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Report formats: the wg-policy PolicyReport that Kyverno writes and Policy
// Reporter reads, or its successor, the openreports.io Report.
const (
	FormatPolicyReport = "wgpolicyk8s.io/v1alpha2"
	FormatOpenReports  = "openreports.io/v1alpha1"
)

// ReportName is the name of the guard's report in each namespace.
const ReportName = "deployguard"

// AnnotationOmitted counts the results left out of a full report.
const AnnotationOmitted = "deployguard.io/omitted-results"

// Size bounds. A report lists only what is not a pass (every result is
// counted in its summary), at most MaxResults of them, each with a message of
// at most MaxMessage bytes and names no longer than the API allows: at most
// about 0.6 MiB whatever the namespace holds, under the 1.5 MiB the API server
// takes in one object. TestReportSizeBound proves it with 5,000 Deployments.
const (
	MaxResults = 400
	MaxMessage = 512
	maxName    = 128 // policy and rule names
)

// GVK is the report kind of a format.
func GVK(format string) (schema.GroupVersionKind, error) {
	switch format {
	case FormatPolicyReport, "":
		return schema.GroupVersionKind{Group: "wgpolicyk8s.io", Version: "v1alpha2", Kind: "PolicyReport"}, nil
	case FormatOpenReports:
		return schema.GroupVersionKind{Group: "openreports.io", Version: "v1alpha1", Kind: "Report"}, nil
	}
	return schema.GroupVersionKind{}, fmt.Errorf("unknown report format %q: use %s or %s", format, FormatPolicyReport, FormatOpenReports)
}

// Summary counts a namespace's results by result.
type Summary struct{ Pass, Fail, Warn, Error, Skip int }

func (s *Summary) add(result string) {
	switch result {
	case ResultPass:
		s.Pass++
	case ResultFail:
		s.Fail++
	case ResultWarn:
		s.Warn++
	case ResultError:
		s.Error++
	case ResultSkip:
		s.Skip++
	}
}

// resultOrder puts what a reader must act on first when a report is full.
var resultOrder = map[string]int{ResultFail: 0, ResultError: 1, ResultWarn: 2, ResultSkip: 3}

// Content is a report's summary and listed results, without timestamps: what
// decides whether the stored report must be written again.
type Content struct {
	Summary Summary
	Results []Result
	Omitted int
}

// Summarize bounds a namespace's results into a report's content. It is pure
// and deterministic: the same results in any order give the same content.
func Summarize(results []Result) Content {
	var c Content
	for _, r := range results {
		c.Summary.add(r.Result)
		if r.Result == ResultPass {
			continue
		}
		r.Policy, r.Rule = truncate(r.Policy, maxName), truncate(r.Rule, maxName)
		r.Message, r.Field = truncate(r.Message, MaxMessage), truncate(r.Field, maxName)
		r.Severity, r.Category = truncate(r.Severity, 16), truncate(r.Category, maxName)
		c.Results = append(c.Results, r)
	}
	slices.SortFunc(c.Results, func(a, b Result) int {
		return cmp.Or(
			cmp.Compare(resultOrder[a.Result], resultOrder[b.Result]),
			cmp.Compare(a.Policy, b.Policy), cmp.Compare(a.Resource.Name, b.Resource.Name),
			cmp.Compare(a.Rule, b.Rule), cmp.Compare(a.Field, b.Field), cmp.Compare(a.Message, b.Message))
	})
	if len(c.Results) > MaxResults {
		c.Omitted = len(c.Results) - MaxResults
		c.Results = c.Results[:MaxResults]
	}
	return c
}

// truncate cuts s to at most n bytes on a rune boundary, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - len("…")
	for cut > 0 && (s[cut]&0xC0) == 0x80 {
		cut--
	}
	return s[:cut] + "…"
}

// resultKey identifies a listed result across passes, to keep its timestamp.
func resultKey(r Result) string {
	return r.Policy + "\x00" + r.Rule + "\x00" + string(r.Resource.UID) + "\x00" + r.Field + "\x00" + r.Message
}

// Build renders content as the report object of format in namespace. since
// holds the timestamps of results already reported (by resultKey): a result
// keeps the time it was first seen, and others get now.
func Build(format, namespace string, c Content, since map[string]time.Time, now time.Time) (*unstructured.Unstructured, error) {
	gvk, err := GVK(format)
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{Object: map[string]any{}}
	u.SetGroupVersionKind(gvk)
	u.SetNamespace(namespace)
	u.SetName(ReportName)
	u.SetLabels(map[string]string{"app.kubernetes.io/managed-by": "deployguard"})
	if c.Omitted > 0 {
		u.SetAnnotations(map[string]string{AnnotationOmitted: strconv.Itoa(c.Omitted)})
	}
	u.Object["summary"] = map[string]any{
		"pass": int64(c.Summary.Pass), "fail": int64(c.Summary.Fail), "warn": int64(c.Summary.Warn),
		"error": int64(c.Summary.Error), "skip": int64(c.Summary.Skip),
	}
	results := make([]any, 0, len(c.Results))
	for _, r := range c.Results {
		ts, ok := since[resultKey(r)]
		if !ok {
			ts = now
		}
		m := map[string]any{
			"source": "deployguard", "policy": r.Policy, "rule": r.Rule, "result": r.Result,
			"message":   r.Message,
			"timestamp": map[string]any{"seconds": ts.Unix(), "nanos": int64(0)},
			"resources": []any{map[string]any{
				"apiVersion": "apps/v1", "kind": "Deployment",
				"namespace": r.Resource.Namespace, "name": r.Resource.Name, "uid": string(r.Resource.UID),
			}},
		}
		if r.Severity != "" {
			m["severity"] = r.Severity
		}
		if r.Category != "" {
			m["category"] = r.Category
		}
		if r.Field != "" {
			m["properties"] = map[string]any{"field": r.Field}
		}
		results = append(results, m)
	}
	u.Object["results"] = results
	return u, nil
}

// Timestamps reads the first-seen times of a stored report's results.
func Timestamps(u *unstructured.Unstructured) map[string]time.Time {
	out := map[string]time.Time{}
	for _, r := range Parse(u).Results {
		out[resultKey(r.Result)] = r.Since
	}
	return out
}

// StoredResult is a result as read back from a report.
type StoredResult struct {
	Result
	Since time.Time
}

// Stored is a report as read back: what `deployguard audit` prints and what
// decides whether a new one must be written.
type Stored struct {
	Namespace string
	Summary   Summary
	Results   []StoredResult
	Omitted   int
}

// Parse reads a report written in either format; fields it does not know
// are ignored.
func Parse(u *unstructured.Unstructured) Stored {
	s := Stored{Namespace: u.GetNamespace()}
	s.Omitted, _ = strconv.Atoi(u.GetAnnotations()[AnnotationOmitted])
	sum, _, _ := unstructured.NestedMap(u.Object, "summary")
	n := func(k string) int { v, _ := sum[k].(int64); return int(v) }
	s.Summary = Summary{Pass: n("pass"), Fail: n("fail"), Warn: n("warn"), Error: n("error"), Skip: n("skip")}
	items, _, _ := unstructured.NestedSlice(u.Object, "results")
	for _, it := range items {
		m, ok := it.(map[string]any)
		if !ok {
			continue
		}
		str := func(k string) string { v, _ := m[k].(string); return v }
		r := StoredResult{Result: Result{Policy: str("policy"), Rule: str("rule"), Result: str("result"),
			Message: str("message"), Severity: str("severity"), Category: str("category")}}
		if p, ok := m["properties"].(map[string]any); ok {
			r.Field, _ = p["field"].(string)
		}
		if ts, ok := m["timestamp"].(map[string]any); ok {
			sec, _ := ts["seconds"].(int64)
			r.Since = time.Unix(sec, 0)
		}
		if rs, ok := m["resources"].([]any); ok && len(rs) > 0 {
			if rm, ok := rs[0].(map[string]any); ok {
				r.Resource.Namespace, _ = rm["namespace"].(string)
				r.Resource.Name, _ = rm["name"].(string)
				uid, _ := rm["uid"].(string)
				r.Resource.UID = typesUID(uid)
			}
		}
		s.Results = append(s.Results, r)
	}
	return s
}

// SameContent reports whether a stored report already says what c says, so
// that an unchanged namespace is never written again.
func SameContent(stored *unstructured.Unstructured, c Content) bool {
	s := Parse(stored)
	if s.Summary != c.Summary || s.Omitted != c.Omitted || len(s.Results) != len(c.Results) {
		return false
	}
	keys := map[string]int{}
	for _, r := range c.Results {
		keys[resultKey(r)+"\x00"+r.Result+"\x00"+r.Severity+"\x00"+r.Category]++
	}
	for _, r := range s.Results {
		keys[resultKey(r.Result)+"\x00"+r.Result.Result+"\x00"+r.Severity+"\x00"+r.Category]--
	}
	for v := range maps.Values(keys) {
		if v != 0 {
			return false
		}
	}
	return true
}
