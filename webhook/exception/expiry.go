package exception

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
)

// The Events the guard puts on a PolicyException as its expiry nears.
const (
	// ReasonExpiringSoon: the exception enters its warning window
	// (exceptions.expiryWarning before expiresAt).
	ReasonExpiringSoon = "ExceptionExpiringSoon"
	// ReasonExpired: the exception no longer applies anywhere.
	ReasonExpired = "ExceptionExpired"
)

// The states the metric counts exceptions by.
const (
	StateActive   = "active"
	StateExpiring = "expiring"
	StateExpired  = "expired"
)

// StateOf is e's state at now with a warning window of warning.
func StateOf(e *Exception, now time.Time, warning time.Duration) string {
	switch {
	case !e.Active(now):
		return StateExpired
	case !now.Before(e.ExpiresAt.Add(-warning)):
		return StateExpiring
	}
	return StateActive
}

// Notice is an Event due on one exception.
type Notice struct {
	Exception *Exception
	Reason    string
}

// noticeKey identifies a notice already given: a renewed exception (a new
// expiresAt) is warned about again.
type noticeKey struct {
	name      string
	expiresAt time.Time
	reason    string
}

// Due returns the notices due at now that given does not hold, and when the
// next one falls due (zero when none will without a change to the list). It
// only decides: the caller gives the notices and records them in given.
func Due(list []*Exception, now time.Time, warning time.Duration, given map[noticeKey]bool) (due []Notice, next time.Time) {
	later := func(t time.Time) {
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	for _, e := range list {
		reason := ""
		switch StateOf(e, now, warning) {
		case StateActive:
			later(e.ExpiresAt.Add(-warning))
			continue
		case StateExpiring:
			reason = ReasonExpiringSoon
			later(e.ExpiresAt)
		case StateExpired:
			reason = ReasonExpired
		}
		if !given[noticeKey{e.Name.String(), e.ExpiresAt, reason}] {
			due = append(due, Notice{Exception: e, Reason: reason})
		}
	}
	return due, next
}

// Message is the Event's note for n at now: what expires, when, what it
// lets through, and what to do.
func (n Notice) Message(now time.Time) string {
	e := n.Exception
	if n.Reason == ReasonExpired {
		return fmt.Sprintf("PolicyException %s expired at %s: it no longer applies; what it covered (%s) is judged again by %s. Delete it, or fix what it covered",
			e.Name, e.ExpiresAt.UTC().Format(time.RFC3339), e.Scope(), e.Rules())
	}
	return fmt.Sprintf("PolicyException %s expires at %s (in %s): %s is then enforced again on %s (owner %s, reason %q). Fix what it covers, or renew it with a later expiresAt",
		e.Name, e.ExpiresAt.UTC().Format(time.RFC3339), left(e.ExpiresAt.Sub(now)), e.Rules(), e.Scope(), e.Owner, e.Reason)
}

// left rounds the time left for a reader: to the minute, or to the second
// in the last minute.
func left(d time.Duration) time.Duration {
	if d < time.Minute {
		return d.Round(time.Second)
	}
	return d.Round(time.Minute)
}

// Scope says which Deployments e covers: "Deployments a, b in ns",
// "Deployments selected by app=x in ns" or "every Deployment in ns".
func (e *Exception) Scope() string {
	switch {
	case len(e.Names) > 0:
		return fmt.Sprintf("Deployments %s in %s", strings.Join(e.Names, ", "), e.Namespace)
	case e.Selector != nil:
		return fmt.Sprintf("Deployments selected by %s in %s", e.Selector, e.Namespace)
	}
	return "every Deployment in " + e.Namespace
}

// Rules says which rules e exempts: "policy resources, check
// revision-history".
func (e *Exception) Rules() string {
	var parts []string
	for _, p := range e.Policies {
		parts = append(parts, "policy "+p)
	}
	for _, c := range e.Checks {
		parts = append(parts, "check "+c)
	}
	return strings.Join(parts, ", ")
}

// Notifier puts an Event on each exception when it enters its warning window
// and when it expires. It runs on the leader only, so that one replica
// speaks; a new leader gives the notices that are due again, once.
type Notifier struct {
	Index    *Index
	Warning  time.Duration
	Recorder events.EventRecorder
	Log      logr.Logger
}

// NeedLeaderElection: one replica gives the notices.
func (n *Notifier) NeedLeaderElection() bool { return true }

// Start gives the notices until ctx ends, waking at the next one due and at
// every change to the index.
func (n *Notifier) Start(ctx context.Context) error {
	changed := make(chan struct{}, 1)
	stop := n.Index.Watch(func(_, _ *Exception) {
		select {
		case changed <- struct{}{}:
		default:
		}
	})
	defer stop()
	given := map[noticeKey]bool{}
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-timer.C:
		}
		now := time.Now()
		list := n.Index.List()
		due, next := Due(list, now, n.Warning, given)
		for _, d := range due {
			e := d.Exception
			given[noticeKey{e.Name.String(), e.ExpiresAt, d.Reason}] = true
			n.Recorder.Eventf(e.object(), nil, corev1.EventTypeWarning, d.Reason, "Expire", "%s", d.Message(now))
			n.Log.Info("PolicyException "+strings.TrimPrefix(d.Reason, "Exception"), "exception", e.Name.String(),
				"expiresAt", e.ExpiresAt.UTC().Format(time.RFC3339), "owner", e.Owner, "reason", d.Reason)
		}
		forget(given, list)
		timer.Stop()
		if !next.IsZero() {
			timer.Reset(max(time.Until(next), 0))
		}
	}
}

// forget drops what was given about exceptions that are gone, so that the
// map grows only with the exceptions that exist.
func forget(given map[noticeKey]bool, list []*Exception) {
	live := make(map[string]bool, len(list))
	for _, e := range list {
		live[e.Name.String()] = true
	}
	for k := range given {
		if !live[k.name] {
			delete(given, k)
		}
	}
}

// object is the PolicyException an Event is about.
func (e *Exception) object() *PolicyException {
	return &PolicyException{
		TypeMeta:   metav1.TypeMeta{APIVersion: GroupVersion.String(), Kind: Kind},
		ObjectMeta: metav1.ObjectMeta{Namespace: e.Name.Namespace, Name: e.Name.Name, UID: e.UID},
	}
}

// Collector exports deployguard_policy_exceptions{state}: the exceptions
// the guard honours, active, expiring (inside the warning window) and expired
// (no longer applied, still in the cluster), computed at each scrape.
type Collector struct {
	Index   *Index
	Warning time.Duration
}

var exceptionsDesc = prometheus.NewDesc("deployguard_policy_exceptions",
	"PolicyExceptions in the exceptions namespace by state: active, expiring (within exceptions.expiryWarning of expiresAt) or expired (no longer applied).",
	[]string{"state"}, nil)

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) { ch <- exceptionsDesc }

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	counts := map[string]int{StateActive: 0, StateExpiring: 0, StateExpired: 0}
	now := time.Now()
	for _, e := range c.Index.List() {
		counts[StateOf(e, now, c.Warning)]++
	}
	states := make([]string, 0, len(counts))
	for s := range counts {
		states = append(states, s)
	}
	sort.Strings(states)
	for _, s := range states {
		ch <- prometheus.MustNewConstMetric(exceptionsDesc, prometheus.GaugeValue, float64(counts[s]), s)
	}
}
