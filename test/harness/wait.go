package harness

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// WaitFor polls cond every 50 ms until it holds, and fails the test with msg
// and the last state cond described when timeout passes first or cond
// returns an error.
func WaitFor(t *testing.T, timeout time.Duration, msg string, cond func(ctx context.Context) (ok bool, state string, err error)) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		ok, state, err := cond(ctx)
		last = state
		return ok, err
	})
	require.NoError(t, err, "%s (last seen: %s)", msg, last)
}

// GuardEventReasons are the reasons of the guard's events about Deployment
// ns/name, each as often as it happened (an event's series counts), sorted.
func GuardEventReasons(ctx context.Context, t *testing.T, c client.Client, ns, name string) []string {
	t.Helper()
	var list eventsv1.EventList
	require.NoError(t, c.List(ctx, &list, client.InNamespace(ns)))
	var out []string
	for _, e := range list.Items {
		if e.Regarding.Kind != "Deployment" || e.Regarding.Name != name || !strings.Contains(e.ReportingController, "deployguard") {
			continue
		}
		n := 1
		if e.Series != nil {
			n = int(e.Series.Count)
		}
		for range n {
			out = append(out, e.Reason)
		}
	}
	slices.Sort(out)
	return out
}
