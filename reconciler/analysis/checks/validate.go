package checks

import (
	"fmt"
	"time"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/deployguard/deployguard/reconciler/analysis"
	"github.com/deployguard/deployguard/reconciler/analysis/promscope"
)

// Limits of one check: they keep what the guard records per revision (one
// entry per metric, in the Deployment's ledger) and the queries of one
// rollout bounded.
const (
	MaxMetrics    = 10
	MaxBakeWindow = 24 * time.Hour
)

// Lengths of what a check's author writes, in characters as the CRDs'
// maxLength counts them (config/crd/checks says the same). The guard sends
// each query to Prometheus on every interval of every revision measured,
// and a tenant may write a DeploymentCheck: unbounded, a 1 MiB query would
// be parsed, sent and logged on each of them. Real queries (a ratio of two
// sums, a burn rate over a few windows) stay under 2 KiB, so 8 KiB leaves
// room; a condition compares a result with a threshold, so 1 KiB is
// generous. A name is a DNS label. With at most MaxMetrics metrics, a
// check's spec stays under 100 KiB.
const (
	MaxQueryLength     = 8192
	MaxConditionLength = 1024
	MaxNameLength      = validation.DNS1123LabelMaxLength
)

// Metric is one compiled metric of a check, ready to measure.
type Metric struct {
	// Kind and Name (and Namespace, for a DeploymentCheck) name the check.
	Kind, Namespace, Name string
	// Check is the compiled metric.
	Check *analysis.Check
	// Query is its template; a DeploymentCheck's is scoped to its namespace.
	Query *promscope.Query
	// BakeWindow is the check's own (nil: the guard's default).
	BakeWindow *metav1.Duration
}

// Key names the metric in the ledger, in Events and in status:
// "ClusterDeploymentCheck/<name>/<metric>" or
// "DeploymentCheck/<name>/<metric>" (a team's check is always of the
// Deployment's own namespace).
func (m Metric) Key() string {
	return m.Kind + "/" + m.Name + "/" + m.Check.Metric.Name
}

// CompileCluster validates a ClusterDeploymentCheck and compiles its
// metrics. Every problem is returned at once, each at its field path.
func CompileCluster(c *ClusterDeploymentCheck) ([]Metric, field.ErrorList) {
	spec := field.NewPath("spec")
	errs := validSelector(c.Spec.NamespaceSelector, spec.Child("namespaceSelector"))
	ms, more := compileSpec(&c.Spec.Spec, spec, ClusterKind, "", c.Name)
	return ms, append(errs, more...)
}

// CompileNamespaced validates a DeploymentCheck and compiles its metrics:
// each query is scoped to the check's namespace, and one that names another
// namespace is refused.
func CompileNamespaced(c *DeploymentCheck) ([]Metric, field.ErrorList) {
	return compileSpec(&c.Spec, field.NewPath("spec"), NamespacedKind, c.Namespace, c.Name)
}

func compileSpec(s *Spec, path *field.Path, kind, namespace, name string) ([]Metric, field.ErrorList) {
	errs := validSelector(s.Selector, path.Child("selector"))
	if b := s.BakeWindow; b != nil && (b.Duration < 0 || b.Duration > MaxBakeWindow) {
		errs = append(errs, field.Invalid(path.Child("bakeWindow"), b.Duration.String(), fmt.Sprintf("must be between 0s and %s", MaxBakeWindow)))
	}
	mp := path.Child("metrics")
	switch {
	case len(s.Metrics) == 0:
		errs = append(errs, field.Required(mp, "a check measures at least one metric"))
	case len(s.Metrics) > MaxMetrics:
		// None is compiled: a check stored before the schema said
		// maxItems costs nothing more than saying so.
		return nil, append(errs, field.TooMany(mp, len(s.Metrics), MaxMetrics))
	}
	seen := map[string]bool{}
	out := make([]Metric, 0, len(s.Metrics))
	for i, m := range s.Metrics {
		p := mp.Index(i)
		if lerrs := tooLong(m, p); len(lerrs) > 0 {
			// Neither parsed nor quoted back: the error names the
			// field and the limit, not a megabyte of query.
			errs = append(errs, lerrs...)
			continue
		}
		if m.Name != "" && seen[m.Name] {
			errs = append(errs, field.Duplicate(p.Child("name"), m.Name))
		}
		seen[m.Name] = true
		check, cerrs := analysis.Compile(m, p)
		errs = append(errs, cerrs...)
		var q *promscope.Query
		if m.Query != "" {
			var err error
			if kind == ClusterKind {
				q, err = promscope.ParseUnscoped(m.Query)
			} else {
				q, err = promscope.ParseIn(m.Query, namespace)
			}
			if err != nil {
				errs = append(errs, field.Invalid(p.Child("query"), m.Query, err.Error()))
			}
		}
		if check != nil && q != nil {
			out = append(out, Metric{Kind: kind, Namespace: namespace, Name: name, Check: check, Query: q, BakeWindow: s.BakeWindow})
		}
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return out, nil
}

// tooLong returns a metric's fields longer than their limits.
func tooLong(m analysis.Metric, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, f := range []struct {
		name, value string
		limit       int
	}{
		{"name", m.Name, MaxNameLength},
		{"query", m.Query, MaxQueryLength},
		{"successCondition", m.SuccessCondition, MaxConditionLength},
		{"failureCondition", m.FailureCondition, MaxConditionLength},
	} {
		if utf8.RuneCountInString(f.value) > f.limit {
			errs = append(errs, field.TooLongCharacters(path.Child(f.name), f.value, f.limit))
		}
	}
	return errs
}

func validSelector(s *metav1.LabelSelector, path *field.Path) field.ErrorList {
	if s == nil {
		return nil
	}
	if _, err := metav1.LabelSelectorAsSelector(s); err != nil {
		return field.ErrorList{field.Invalid(path, s.String(), err.Error())}
	}
	return nil
}
