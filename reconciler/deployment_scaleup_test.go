package reconciler

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestDecideScaleUp(t *testing.T) {
	now := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	deadline := 10 * time.Minute
	ready := func(name string) ScaleUpPod {
		return ScaleUpPod{PodState: PodState{Name: name, Ready: true}, Created: now.Add(-time.Hour)}
	}
	unschedulable := func(name string, age time.Duration) ScaleUpPod {
		return ScaleUpPod{PodState: PodState{Name: name, Failure: &PodFailure{Pod: name, Reason: "Unschedulable", Message: "0/3 nodes are available"}}, Created: now.Add(-age)}
	}
	starting := func(name string, age time.Duration) ScaleUpPod {
		return ScaleUpPod{PodState: PodState{Name: name}, Created: now.Add(-age)}
	}
	quota := &PodFailure{Pod: "web-abc", Reason: "FailedCreate", Message: `pods "web-abc-x" is forbidden: exceeded quota`}
	for _, tc := range []struct {
		name           string
		in             ScaleUpInput
		stalled, clear bool
		requeue        time.Duration
		evidence       int
	}{
		{name: "at its replicas", in: ScaleUpInput{Desired: 3, Available: 3, Pods: []ScaleUpPod{ready("a"), ready("b"), ready("c")}}},
		{name: "scaled to zero", in: ScaleUpInput{Desired: 0, Available: 0}},
		{name: "short, pods starting: look again", requeue: scaleUpRecheck,
			in: ScaleUpInput{Desired: 6, Available: 2, Pods: []ScaleUpPod{ready("a"), ready("b"), starting("c", time.Hour), unschedulable("d", time.Hour)}}},
		{name: "short, all missing pods failing, within the deadline", requeue: 4*time.Minute + time.Second, evidence: 2,
			in: ScaleUpInput{Desired: 4, Available: 2, Pods: []ScaleUpPod{ready("a"), ready("b"), unschedulable("c", 6*time.Minute), unschedulable("d", 5*time.Minute)}}},
		{name: "short, all missing pods failing, past the deadline", stalled: true, evidence: 2,
			in: ScaleUpInput{Desired: 4, Available: 2, Pods: []ScaleUpPod{ready("a"), ready("b"), unschedulable("c", 11*time.Minute), unschedulable("d", 30*time.Second)}}},
		{name: "pods that cannot be created, past the deadline", stalled: true, evidence: 1,
			in: ScaleUpInput{Desired: 4, Available: 2, Pods: []ScaleUpPod{ready("a"), ready("b")}, CreateFailure: quota, CreateFailureSince: now.Add(-11 * time.Minute)}},
		{name: "reported, still short: stays reported whatever the evidence", stalled: true,
			in: ScaleUpInput{Desired: 8, Available: 2, Reported: true, Pods: []ScaleUpPod{ready("a"), ready("b"), starting("c", time.Second)}}},
		{name: "reported, back at its replicas: cleared", clear: true,
			in: ScaleUpInput{Desired: 3, Available: 3, Reported: true}},
		{name: "reported, scaled down to what is available: cleared", clear: true,
			in: ScaleUpInput{Desired: 2, Available: 2, Reported: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.in.Now, tc.in.Deadline = now, deadline
			v := DecideScaleUp(tc.in)
			assert.Equal(t, tc.stalled, v.Stalled, "stalled")
			assert.Equal(t, tc.clear, v.Clear, "clear")
			assert.Equal(t, tc.requeue, v.RequeueAfter, "requeue")
			if tc.evidence > 0 {
				assert.Len(t, v.Evidence, tc.evidence)
			}
		})
	}
}

func TestScaleUpMessage(t *testing.T) {
	now := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	v := ScaleUpVerdict{Stalled: true, Since: now.Add(-62 * time.Second), Evidence: []PodFailure{
		{Pod: "c", Reason: "Unschedulable", Message: "0/2 nodes are available: 2 node(s) didn't match pod anti-affinity rules."},
		{Pod: "d", Reason: "Unschedulable"},
	}}
	assert.Equal(t, "2/6 replicas available; the missing pods have not come for 1m2s, past the progress deadline of 30s: 2 Unschedulable "+
		"(0/2 nodes are available: 2 node(s) didn't match pod anti-affinity rules.). "+
		"The template did not change, so there is nothing to roll back: give the pods what they lack, or scale back to 2.",
		ScaleUpMessage(6, 2, v, 30*time.Second, now))
}
