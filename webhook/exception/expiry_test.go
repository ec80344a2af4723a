package exception

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func exceptionAt(name string, expires time.Time) *Exception {
	return &Exception{Name: types.NamespacedName{Namespace: "deployguard-system", Name: name}, Namespace: "shop",
		Names: []string{"web"}, Policies: []string{"resources"}, ExpiresAt: expires, Owner: "platform", Reason: "OPS-1"}
}

func TestDue(t *testing.T) {
	now := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	week := 7 * 24 * time.Hour
	far := exceptionAt("far", now.Add(30*24*time.Hour))
	soon := exceptionAt("soon", now.Add(2*24*time.Hour))
	edge := exceptionAt("edge", now.Add(week)) // enters its window now
	gone := exceptionAt("gone", now.Add(-time.Minute))
	given := func(e *Exception, reason string) map[noticeKey]bool {
		return map[noticeKey]bool{{e.Name.String(), e.ExpiresAt, reason}: true}
	}
	renewed := exceptionAt("soon", now.Add(3*24*time.Hour))
	for _, tc := range []struct {
		name  string
		list  []*Exception
		given map[noticeKey]bool
		due   []string // name/reason
		next  time.Time
	}{
		{name: "none", next: time.Time{}},
		{name: "outside the window: nothing yet, wake at its start", list: []*Exception{far}, next: far.ExpiresAt.Add(-week)},
		{name: "inside the window: warn, wake at expiry", list: []*Exception{soon}, due: []string{"soon/" + ReasonExpiringSoon}, next: soon.ExpiresAt},
		{name: "at the window's start: warn", list: []*Exception{edge}, due: []string{"edge/" + ReasonExpiringSoon}, next: edge.ExpiresAt},
		{name: "warned already: quiet until expiry", list: []*Exception{soon}, given: given(soon, ReasonExpiringSoon), next: soon.ExpiresAt},
		{name: "renewed: warned again for the new date", list: []*Exception{renewed}, given: given(soon, ReasonExpiringSoon),
			due: []string{"soon/" + ReasonExpiringSoon}, next: renewed.ExpiresAt},
		{name: "expired: said once, nothing more to wait for", list: []*Exception{gone}, due: []string{"gone/" + ReasonExpired}},
		{name: "expired and said", list: []*Exception{gone}, given: given(gone, ReasonExpired)},
		{name: "the earliest wake-up of several", list: []*Exception{far, soon, gone},
			due: []string{"soon/" + ReasonExpiringSoon, "gone/" + ReasonExpired}, next: soon.ExpiresAt},
	} {
		t.Run(tc.name, func(t *testing.T) {
			due, next := Due(tc.list, now, week, tc.given)
			var got []string
			for _, d := range due {
				got = append(got, d.Exception.Name.Name+"/"+d.Reason)
			}
			assert.Equal(t, tc.due, got)
			assert.Equal(t, tc.next, next)
		})
	}
}

func TestNoticeMessage(t *testing.T) {
	now := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	e := exceptionAt("shop-web-resources", now.Add(48*time.Hour))
	e.Checks = []string{"revision-history"}
	msg := Notice{Exception: e, Reason: ReasonExpiringSoon}.Message(now)
	for _, want := range []string{"deployguard-system/shop-web-resources", "2026-11-26T12:00:00Z", "in 48h0m0s",
		"policy resources, check revision-history", "Deployments web in shop", "owner platform", `"OPS-1"`, "renew"} {
		assert.Contains(t, msg, want)
	}
	sel, err := metav1.LabelSelectorAsSelector(&metav1.LabelSelector{MatchLabels: map[string]string{"team": "legacy"}})
	assert.NoError(t, err)
	e.Names, e.Selector = nil, sel
	msg = Notice{Exception: e, Reason: ReasonExpired}.Message(now.Add(72 * time.Hour))
	assert.True(t, strings.HasPrefix(msg, "PolicyException deployguard-system/shop-web-resources expired at 2026-11-26T12:00:00Z: it no longer applies"), msg)
	assert.Contains(t, msg, "Deployments selected by team=legacy in shop")
}

func TestCollectorCountsByState(t *testing.T) {
	idx := NewIndex("deployguard-system")
	now := time.Now()
	for name, at := range map[string]time.Time{"a": now.Add(30 * 24 * time.Hour), "b": now.Add(24 * time.Hour), "c": now.Add(-time.Hour)} {
		idx.Set(&PolicyException{
			ObjectMeta: metav1.ObjectMeta{Namespace: "deployguard-system", Name: name},
			Spec:       Spec{Match: Match{Namespace: "shop", Names: []string{"web"}}, Policies: []string{"resources"}, ExpiresAt: metav1.NewTime(at), Owner: "o", Reason: "r"},
		})
	}
	want := `# HELP deployguard_policy_exceptions PolicyExceptions in the exceptions namespace by state: active, expiring (within exceptions.expiryWarning of expiresAt) or expired (no longer applied).
# TYPE deployguard_policy_exceptions gauge
deployguard_policy_exceptions{state="active"} 1
deployguard_policy_exceptions{state="expired"} 1
deployguard_policy_exceptions{state="expiring"} 1
`
	assert.NoError(t, testutil.CollectAndCompare(&Collector{Index: idx, Warning: 7 * 24 * time.Hour}, strings.NewReader(want)))
}

func TestCoverage(t *testing.T) {
	now := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	dep := func(ns, name string, labels map[string]string) appsv1.Deployment {
		return appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels}}
	}
	deployments := []appsv1.Deployment{dep("shop", "web", nil), dep("shop", "api", map[string]string{"tier": "legacy"}), dep("other", "web", nil)}
	byName := exceptionAt("by-name", now.Add(30*24*time.Hour))
	sel, err := metav1.LabelSelectorAsSelector(&metav1.LabelSelector{MatchLabels: map[string]string{"tier": "legacy"}})
	assert.NoError(t, err)
	bySelector := exceptionAt("by-selector", now.Add(24*time.Hour))
	bySelector.Names, bySelector.Selector = nil, sel
	whole := exceptionAt("whole", now.Add(-time.Hour))
	whole.Names = nil
	got := Coverage([]*Exception{byName, bySelector, whole}, deployments, now, 7*24*time.Hour)
	assert.Equal(t, []string{"shop/web"}, got[0].Deployments)
	assert.Equal(t, StateActive, got[0].State)
	assert.Equal(t, []string{"shop/api"}, got[1].Deployments)
	assert.Equal(t, StateExpiring, got[1].State)
	assert.Equal(t, []string{}, got[2].Deployments, "an expired exception covers nothing")
	assert.Equal(t, StateExpired, got[2].State)

	var b strings.Builder
	WriteCoverage(&b, got, now)
	assert.Equal(t, `PolicyExceptions: 1 active, 1 expiring, 1 expired
  deployguard-system/by-name: until 2026-12-24T12:00:00Z (in 720h0m0s), owner platform, reason "OPS-1"
    exempts policy resources for Deployments web in shop
    covers 1: shop/web
  deployguard-system/by-selector: until 2026-11-25T12:00:00Z (in 24h0m0s, expiring soon), owner platform, reason "OPS-1"
    exempts policy resources for Deployments selected by tier=legacy in shop
    covers 1: shop/api
  deployguard-system/whole: expired at 2026-11-24T11:00:00Z, applies to nothing: delete it (owner platform)
`, b.String())
}
