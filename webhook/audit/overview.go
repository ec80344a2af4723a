package audit

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strings"
)

// Overview is what the reports say, grouped by policy then namespace: what
// `deployguard audit` prints for a platform team deciding whether to enforce.
type Overview struct {
	Policies []PolicyOverview `json:"policies"`
	// Omitted counts results the full reports had no room for.
	Omitted int `json:"omittedResults,omitempty"`
	// Namespaces is how many reports were read.
	Namespaces int `json:"namespaces"`
}

// PolicyOverview is one policy's non-pass results across namespaces.
type PolicyOverview struct {
	Policy     string              `json:"policy"`
	Severity   string              `json:"severity,omitempty"`
	Category   string              `json:"category,omitempty"`
	Counts     map[string]int      `json:"deployments"` // result → distinct Deployments
	Namespaces []NamespaceOverview `json:"namespaces"`
}

// NamespaceOverview is one policy's results in one namespace.
type NamespaceOverview struct {
	Namespace string         `json:"namespace"`
	Counts    map[string]int `json:"deployments"` // result → distinct Deployments
	Failing   []string       `json:"failing,omitempty"`
}

// OverviewOf reads stored reports into an Overview; pure.
func OverviewOf(reports []Stored) Overview {
	type key struct{ policy, ns string }
	seen := map[key]map[string]map[string]bool{} // → result → Deployment
	meta := map[string][2]string{}
	o := Overview{Namespaces: len(reports)}
	for _, s := range reports {
		o.Omitted += s.Omitted
		for _, r := range s.Results {
			k := key{r.Policy, s.Namespace}
			if seen[k] == nil {
				seen[k] = map[string]map[string]bool{}
			}
			if seen[k][r.Result.Result] == nil {
				seen[k][r.Result.Result] = map[string]bool{}
			}
			seen[k][r.Result.Result][r.Resource.Name] = true
			if r.Severity != "" || r.Category != "" {
				meta[r.Policy] = [2]string{r.Severity, r.Category}
			}
		}
	}
	byPolicy := map[string]*PolicyOverview{}
	for k, results := range seen {
		p := byPolicy[k.policy]
		if p == nil {
			p = &PolicyOverview{Policy: k.policy, Severity: meta[k.policy][0], Category: meta[k.policy][1], Counts: map[string]int{}}
			byPolicy[k.policy] = p
		}
		n := NamespaceOverview{Namespace: k.ns, Counts: map[string]int{}}
		for result, names := range results {
			n.Counts[result] = len(names)
			p.Counts[result] += len(names)
			if result == ResultFail {
				for name := range names {
					n.Failing = append(n.Failing, name)
				}
				slices.Sort(n.Failing)
			}
		}
		p.Namespaces = append(p.Namespaces, n)
	}
	for _, p := range byPolicy {
		slices.SortFunc(p.Namespaces, func(a, b NamespaceOverview) int { return strings.Compare(a.Namespace, b.Namespace) })
		o.Policies = append(o.Policies, *p)
	}
	// Most refusals first: the policies that need work before enforcing.
	slices.SortFunc(o.Policies, func(a, b PolicyOverview) int {
		return cmp.Or(cmp.Compare(b.Counts[ResultFail], a.Counts[ResultFail]), strings.Compare(a.Policy, b.Policy))
	})
	return o
}

// namespacesWith counts the namespaces where the policy has a result.
func (p PolicyOverview) namespacesWith(result string) int {
	n := 0
	for _, ns := range p.Namespaces {
		if ns.Counts[result] > 0 {
			n++
		}
	}
	return n
}

// WriteText prints the overview for a terminal.
func (o Overview) WriteText(w io.Writer) {
	if len(o.Policies) == 0 {
		fmt.Fprintf(w, "No Deployment fails or warns in the %d reports read.\n", o.Namespaces)
		return
	}
	for _, p := range o.Policies {
		line := p.Policy
		var tags []string
		if p.Severity != "" {
			tags = append(tags, "severity "+p.Severity)
		}
		if p.Category != "" {
			tags = append(tags, "category "+p.Category)
		}
		if len(tags) > 0 {
			line += " (" + strings.Join(tags, ", ") + ")"
		}
		var parts []string
		if n := p.Counts[ResultFail]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d Deployments in %d namespaces would be refused", n, p.namespacesWith(ResultFail)))
		}
		for _, r := range []string{ResultWarn, ResultError, ResultSkip} {
			if n := p.Counts[r]; n > 0 {
				parts = append(parts, fmt.Sprintf("%d %s", n, r))
			}
		}
		fmt.Fprintf(w, "%s: %s\n", line, strings.Join(parts, "; "))
		for _, ns := range p.Namespaces {
			var c []string
			for _, r := range []string{ResultFail, ResultWarn, ResultError, ResultSkip} {
				if n := ns.Counts[r]; n > 0 {
					c = append(c, fmt.Sprintf("%d %s", n, r))
				}
			}
			names := ""
			if len(ns.Failing) > 0 {
				shown := ns.Failing
				more := ""
				if len(shown) > 5 {
					shown, more = shown[:5], fmt.Sprintf(", … %d more", len(ns.Failing)-5)
				}
				names = "  (" + strings.Join(shown, ", ") + more + ")"
			}
			fmt.Fprintf(w, "  %s: %s%s\n", ns.Namespace, strings.Join(c, ", "), names)
		}
	}
	if o.Omitted > 0 {
		fmt.Fprintf(w, "\n%d results did not fit in their reports (deployguard.io/omitted-results); the counts above are a lower bound.\n", o.Omitted)
	}
}
