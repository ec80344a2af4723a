package checks

import (
	"sort"
	"sync"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Invalid is a check that selects a Deployment but cannot be measured (it
// was stored before the webhook judged it, or with the webhook down).
type Invalid struct {
	Kind, Name string
	// UID and Generation say which check, as written, is invalid: the
	// reconciler tells each once per generation and revision.
	UID        types.UID
	Generation int64
	Errs       field.ErrorList
}

// Select returns the metrics of every check that selects d, the platform's
// and d's namespace's, sorted by Key, and the selecting checks that are
// invalid. nsLabels are d's namespace's labels. The caller applies them all:
// the verdict is the worst of them, and nothing a team writes removes or
// relaxes a platform check (they are never merged by name).
func Select(d *appsv1.Deployment, nsLabels map[string]string, lib *Library, cluster []ClusterDeploymentCheck, team []DeploymentCheck) ([]Metric, []Invalid) {
	var out []Metric
	var invalid []Invalid
	for i := range cluster {
		c := &cluster[i]
		if !selects(c.Spec.NamespaceSelector, nsLabels) || !selects(c.Spec.Selector, d.Labels) {
			continue
		}
		ms, errs := lib.Cluster(c)
		if len(errs) > 0 {
			invalid = append(invalid, Invalid{Kind: ClusterKind, Name: c.Name, UID: c.UID, Generation: c.Generation, Errs: errs})
			continue
		}
		out = append(out, ms...)
	}
	for i := range team {
		c := &team[i]
		if c.Namespace != d.Namespace || !selects(c.Spec.Selector, d.Labels) {
			continue
		}
		ms, errs := lib.Namespaced(c)
		if len(errs) > 0 {
			invalid = append(invalid, Invalid{Kind: NamespacedKind, Name: c.Name, UID: c.UID, Generation: c.Generation, Errs: errs})
			continue
		}
		out = append(out, ms...)
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Kind != out[j].Kind {
			return out[i].Kind == ClusterKind // the platform's first
		}
		return out[i].Key() < out[j].Key()
	})
	return out, invalid
}

// selects reports whether s selects set; nil selects everything. A selector
// that does not parse selects nothing (the webhook refuses it).
func selects(s *metav1.LabelSelector, set map[string]string) bool {
	if s == nil {
		return true
	}
	sel, err := metav1.LabelSelectorAsSelector(s)
	if err != nil {
		return false
	}
	return sel.Matches(labels.Set(set))
}

// maxCompiled bounds the Library: checks are few (a platform's tens, a
// team's few), so past it the memo is simply started again.
const maxCompiled = 1024

// Library compiles each check once per generation, for the reconciler,
// which looks at a Deployment's checks on every pass. Safe for concurrent
// use.
type Library struct {
	mu   sync.Mutex
	memo map[compiledKey]compiled
}

type compiledKey struct {
	uid types.UID
	gen int64
}

type compiled struct {
	metrics []Metric
	errs    field.ErrorList
}

// Cluster is CompileCluster, memoized.
func (l *Library) Cluster(c *ClusterDeploymentCheck) ([]Metric, field.ErrorList) {
	return l.get(compiledKey{c.UID, c.Generation}, func() ([]Metric, field.ErrorList) { return CompileCluster(c) })
}

// Namespaced is CompileNamespaced, memoized.
func (l *Library) Namespaced(c *DeploymentCheck) ([]Metric, field.ErrorList) {
	return l.get(compiledKey{c.UID, c.Generation}, func() ([]Metric, field.ErrorList) { return CompileNamespaced(c) })
}

func (l *Library) get(k compiledKey, compile func() ([]Metric, field.ErrorList)) ([]Metric, field.ErrorList) {
	if k.uid == "" {
		return compile() // not stored: nothing to key it by
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if c, ok := l.memo[k]; ok {
		return c.metrics, c.errs
	}
	if l.memo == nil || len(l.memo) >= maxCompiled {
		l.memo = map[compiledKey]compiled{}
	}
	ms, errs := compile()
	l.memo[k] = compiled{ms, errs}
	return ms, errs
}
