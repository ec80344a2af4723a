package checks

import (
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
		errs = append(errs, field.TooMany(mp, len(s.Metrics), MaxMetrics))
	}
	seen := map[string]bool{}
	out := make([]Metric, 0, len(s.Metrics))
	for i, m := range s.Metrics {
		p := mp.Index(i)
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

func validSelector(s *metav1.LabelSelector, path *field.Path) field.ErrorList {
	if s == nil {
		return nil
	}
	if _, err := metav1.LabelSelectorAsSelector(s); err != nil {
		return field.ErrorList{field.Invalid(path, s.String(), err.Error())}
	}
	return nil
}
