package reconciler

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// A scale-up that never completes is a rollout failure upstream never
// reports: the template did not change, so the Deployment controller keeps
// Progressing=True (NewReplicaSetAvailable) and no progress deadline runs,
// while the Deployment stays short of its replicas for ever. The guard
// applies the progress deadline to it, and reports it: there is nothing to
// roll back.

// ScaleUpPod is one pod of the current ReplicaSet, as the scale-up decision
// reads it: its readiness and evidence, and when it was created.
type ScaleUpPod struct {
	PodState
	Created time.Time
}

// ScaleUpInput is what DecideScaleUp decides from.
type ScaleUpInput struct {
	Now time.Time
	// Desired is spec.replicas, Available status.availableReplicas.
	Desired, Available int32
	// Deadline is the Deployment's progressDeadlineSeconds.
	Deadline time.Duration
	// Pods are the current ReplicaSet's pods, not terminating.
	Pods []ScaleUpPod
	// CreateFailure is the ReplicaSet's ReplicaFailure condition (pods it
	// cannot create: a quota, an admission refusal), with its time; nil
	// without one.
	CreateFailure      *PodFailure
	CreateFailureSince time.Time
	// Reported: the guard already reports this Deployment's scale-up as
	// stalled.
	Reported bool
}

// ScaleUpVerdict is what DecideScaleUp concluded.
type ScaleUpVerdict struct {
	// Stalled: report it (or keep reporting it).
	Stalled bool
	// Clear: stop reporting it (Reported, and the Deployment is back at
	// its replicas or was scaled down to what is available).
	Clear bool
	// Evidence is why the missing replicas do not come; Since when the
	// oldest of the pods that are not Ready was created.
	Evidence []PodFailure
	Since    time.Time
	// RequeueAfter is when to look again while short and not yet stalled.
	RequeueAfter time.Duration
}

// scaleUpRecheck is how often a Deployment short of replicas without
// evidence is looked at again: pods that are merely slow may turn into
// evidence.
const scaleUpRecheck = 30 * time.Second

// DecideScaleUp decides whether a Deployment whose template has not changed
// is stuck short of its replicas. It is stalled when it has been short for
// its progress deadline, counted from the creation of the oldest of its
// pods that are not Ready, and every one of those shows evidence (or its
// ReplicaSet cannot create pods). Once reported it stays reported until it
// is back at its replicas or scaled down to what is available: an autoscaler
// that scales while the pods cannot come does not make it flap, and the
// time is read from the pods, so a restarted guard decides the same.
func DecideScaleUp(in ScaleUpInput) ScaleUpVerdict {
	short := in.Desired > 0 && in.Available < in.Desired
	if !short {
		return ScaleUpVerdict{Clear: in.Reported}
	}
	var v ScaleUpVerdict
	waiting := 0
	for _, p := range in.Pods {
		if p.Ready {
			continue
		}
		waiting++
		if v.Since.IsZero() || p.Created.Before(v.Since) {
			v.Since = p.Created
		}
		if p.Failure != nil {
			v.Evidence = append(v.Evidence, *p.Failure)
		}
	}
	complete := waiting > 0 && len(v.Evidence) == waiting
	if in.CreateFailure != nil {
		v.Evidence = append(v.Evidence, *in.CreateFailure)
		if v.Since.IsZero() || in.CreateFailureSince.Before(v.Since) {
			v.Since = in.CreateFailureSince
		}
		complete = waiting == len(v.Evidence)-1
	}
	slices.SortFunc(v.Evidence, func(a, b PodFailure) int { return strings.Compare(a.Pod, b.Pod) })
	if in.Reported {
		v.Stalled = true
		return v
	}
	if !complete || v.Since.IsZero() {
		v.RequeueAfter = scaleUpRecheck
		return v
	}
	// The API server keeps creation times to the second: a pod counts from
	// the end of its second, so the report never comes before the deadline.
	held := in.Now.Sub(v.Since) - time.Second
	if held >= in.Deadline {
		v.Stalled = true
		return v
	}
	v.RequeueAfter = in.Deadline - held
	return v
}

// ScaleUpMessage says what is stuck and why, for the condition and the
// Event: "3/6 replicas available; 3 pods not Ready for 1m2s (past the
// progress deadline of 30s): 3 Unschedulable (0/3 nodes are available: …).
// Nothing to roll back: give the pods room, or scale back to 3."
func ScaleUpMessage(desired, available int32, v ScaleUpVerdict, deadline time.Duration, now time.Time) string {
	detail := ""
	if len(v.Evidence) > 0 {
		detail = whereOf(v.Evidence[0])
	}
	return fmt.Sprintf("%d/%d replicas available; the missing pods have not come for %s, past the progress deadline of %s: %s%s. "+
		"The template did not change, so there is nothing to roll back: give the pods what they lack, or scale back to %d.",
		available, desired, now.Sub(v.Since).Round(time.Second), deadline, strings.Join(reasonCounts(v.Evidence), ", "), detail, available)
}
