package exception

import (
	"fmt"
	"io"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
)

// Covered is one exception as `deployguard audit` lists it: its state at the
// moment of listing and the Deployments it covers then.
type Covered struct {
	Name      string    `json:"name"` // namespace/name
	State     string    `json:"state"`
	ExpiresAt time.Time `json:"expiresAt"`
	Owner     string    `json:"owner"`
	Reason    string    `json:"reason"`
	Policies  []string  `json:"policies,omitempty"`
	Checks    []string  `json:"checks,omitempty"`
	Scope     string    `json:"scope"`
	// Deployments are those the scope matches now (namespace/name); none
	// for an expired exception, which applies to nothing.
	Deployments []string `json:"deployments"`
}

// Coverage lists each exception with the Deployments of deployments it
// covers at now; pure.
func Coverage(list []*Exception, deployments []appsv1.Deployment, now time.Time, warning time.Duration) []Covered {
	out := make([]Covered, 0, len(list))
	for _, e := range list {
		c := Covered{Name: e.Name.String(), State: StateOf(e, now, warning), ExpiresAt: e.ExpiresAt.UTC(),
			Owner: e.Owner, Reason: e.Reason, Policies: e.Policies, Checks: e.Checks, Scope: e.Scope(), Deployments: []string{}}
		if c.State != StateExpired {
			for i := range deployments {
				if e.Covers(&deployments[i]) {
					c.Deployments = append(c.Deployments, deployments[i].Namespace+"/"+deployments[i].Name)
				}
			}
		}
		out = append(out, c)
	}
	return out
}

// WriteCoverage writes the list for a terminal, at now.
func WriteCoverage(w io.Writer, list []Covered, now time.Time) {
	if len(list) == 0 {
		fmt.Fprintln(w, "No PolicyExceptions.")
		return
	}
	counts := map[string]int{}
	for _, c := range list {
		counts[c.State]++
	}
	fmt.Fprintf(w, "PolicyExceptions: %d active, %d expiring, %d expired\n", counts[StateActive], counts[StateExpiring], counts[StateExpired])
	for _, c := range list {
		if c.State == StateExpired {
			fmt.Fprintf(w, "  %s: expired at %s, applies to nothing: delete it (owner %s)\n", c.Name, c.ExpiresAt.Format(time.RFC3339), c.Owner)
			continue
		}
		soon := ""
		if c.State == StateExpiring {
			soon = ", expiring soon"
		}
		rules := (&Exception{Policies: c.Policies, Checks: c.Checks}).Rules()
		fmt.Fprintf(w, "  %s: until %s (in %s%s), owner %s, reason %q\n", c.Name, c.ExpiresAt.Format(time.RFC3339),
			left(c.ExpiresAt.Sub(now)), soon, c.Owner, c.Reason)
		fmt.Fprintf(w, "    exempts %s for %s\n", rules, c.Scope)
		if len(c.Deployments) == 0 {
			fmt.Fprintln(w, "    covers no Deployment now")
			continue
		}
		fmt.Fprintf(w, "    covers %d: %s\n", len(c.Deployments), strings.Join(c.Deployments, ", "))
	}
}
