package reconciler

import (
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// FailFastOptions say when a rollout in progress counts as failing, before
// its progress deadline: the failure evidence its new pods show, how long it
// must hold, and on how many of them.
type FailFastOptions struct {
	// Enabled turns fail-fast on cluster-wide; a Deployment turns it off or
	// lengthens its window with vocab.AnnotationFailFast.
	Enabled bool
	// Window is how long the evidence must hold, uninterrupted, before the
	// revision is failing.
	Window time.Duration
	// TransientWindow replaces Window when every piece of evidence is a
	// transient failure (a registry unreachable or overloaded): long enough
	// for the kubelet's pull back-off (at most 5 min between attempts) to
	// try again after a blip.
	TransientWindow time.Duration
	// Reasons are the container waiting reasons that are evidence.
	Reasons []string
	// RestartThreshold: a container restarted this many times is evidence
	// (a crash loop that the kubelet has not yet put in back-off).
	RestartThreshold int32
	// OOMKills: a container whose last termination was OOMKilled and that has
	// restarted at least this many times is evidence.
	OOMKills int32
	// UnschedulableAfter: a pod unschedulable (PodScheduled=False, reason
	// Unschedulable) for this long is evidence.
	UnschedulableAfter time.Duration
	// MinFailingPods is how many of the new pods must show evidence; 0 means
	// all of those that exist (and at least one).
	MinFailingPods int
}

// Defaults of fail-fast, the same as the config file's.
const (
	DefaultFailFastWindow             = 60 * time.Second
	DefaultFailFastTransientWindow    = 5 * time.Minute
	DefaultFailFastRestartThreshold   = 3
	DefaultFailFastOOMKills           = 2
	DefaultFailFastUnschedulableAfter = 5 * time.Minute
)

// DefaultFailFastReasons are the container waiting reasons that show a
// revision cannot start: its image cannot be pulled, its configuration
// references what does not exist, its binary crashes. Slow but healthy
// states (ContainerCreating, PodInitializing, a pull in progress) are not
// among them.
func DefaultFailFastReasons() []string {
	return []string{"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "RegistryUnavailable", "SignatureValidationFailed",
		"CreateContainerConfigError", "CreateContainerError", "RunContainerError", "CrashLoopBackOff"}
}

// DefaultFailFastOptions returns fail-fast as a guard nobody has configured
// runs it.
func DefaultFailFastOptions() FailFastOptions {
	return FailFastOptions{
		Enabled: true, Window: DefaultFailFastWindow, TransientWindow: DefaultFailFastTransientWindow, Reasons: DefaultFailFastReasons(),
		RestartThreshold: DefaultFailFastRestartThreshold, OOMKills: DefaultFailFastOOMKills,
		UnschedulableAfter: DefaultFailFastUnschedulableAfter,
	}
}

// PodFailure is the evidence one pod shows that its revision cannot run.
type PodFailure struct {
	Pod       string `json:"pod"`
	Container string `json:"container,omitempty"`
	Image     string `json:"image,omitempty"`
	// Reason is the waiting reason (ImagePullBackOff, …), "Restarts",
	// "OOMKilled" or "Unschedulable".
	Reason   string `json:"reason"`
	Restarts int32  `json:"restarts,omitempty"`
	Message  string `json:"message,omitempty"`
	// Class is ClassPermanent, ClassTransient or "" (ClassifyFailure), and
	// Cause the words of the message that decided it.
	Class string `json:"class,omitempty"`
	Cause string `json:"cause,omitempty"`
}

// PodState is what fail-fast reads of one pod of the newRS.
type PodState struct {
	Name  string
	Ready bool
	// Failure is the pod's evidence; nil when it shows none.
	Failure *PodFailure
}

// PodStateOf reads a pod's readiness and failure evidence. Init containers
// fail the same ways as containers, and are looked at first (a pod whose init
// container crash-loops never starts its containers).
func PodStateOf(p *corev1.Pod, now time.Time, o FailFastOptions) PodState {
	st := PodState{Name: p.Name, Ready: podReady(p)}
	if st.Ready {
		return st
	}
	images := map[string]string{}
	for _, c := range p.Spec.InitContainers {
		images[c.Name] = c.Image
	}
	for _, c := range p.Spec.Containers {
		images[c.Name] = c.Image
	}
	for _, statuses := range [][]corev1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses} {
		for i := range statuses {
			if f := containerFailure(p.Name, &statuses[i], images, o); f != nil {
				st.Failure = f
				return st
			}
		}
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable &&
			!c.LastTransitionTime.IsZero() && now.Sub(c.LastTransitionTime.Time) >= o.UnschedulableAfter {
			st.Failure = &PodFailure{Pod: p.Name, Reason: corev1.PodReasonUnschedulable, Message: c.Message}
		}
	}
	return st
}

func containerFailure(pod string, cs *corev1.ContainerStatus, images map[string]string, o FailFastOptions) *PodFailure {
	image := images[cs.Name]
	if image == "" {
		image = cs.Image
	}
	f := &PodFailure{Pod: pod, Container: cs.Name, Image: image, Restarts: cs.RestartCount}
	if w := cs.State.Waiting; w != nil && slices.Contains(o.Reasons, w.Reason) {
		f.Reason, f.Message = w.Reason, w.Message
		f.Class, f.Cause = ClassifyFailure(w.Reason, w.Message)
		return f
	}
	if t := cs.LastTerminationState.Terminated; t != nil && !cs.Ready {
		switch {
		case t.Reason == "OOMKilled":
			if o.OOMKills > 0 && cs.RestartCount >= o.OOMKills {
				f.Reason = "OOMKilled"
				return f
			}
		case t.ExitCode != 0 && cs.RestartCount >= 1 && slices.Contains(o.Reasons, "CrashLoopBackOff"):
			// A crash loop between two back-offs: the kubelet runs the
			// container again for a moment. Still the same loop, so the
			// window goes on.
			f.Reason, f.Message = "CrashLoopBackOff", fmt.Sprintf("restarted after exit code %d (%s)", t.ExitCode, t.Reason)
			return f
		}
	}
	if o.RestartThreshold > 0 && cs.RestartCount >= o.RestartThreshold && !cs.Ready {
		f.Reason = "Restarts"
		return f
	}
	return nil
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// FailFastInput is what DecideFailFast decides from: the pods of the newRS
// (not terminating), and when failure evidence was first seen on them, as
// recorded on the Deployment (zero: not yet).
type FailFastInput struct {
	Now          time.Time
	Pods         []PodState
	FailingSince time.Time
	Window       time.Duration
	// TransientWindow is the window when all the evidence is transient
	// (never shorter than Window).
	TransientWindow time.Duration
	// MinFailingPods as in FailFastOptions.
	MinFailingPods int
}

// FailFastVerdict is what DecideFailFast concluded.
type FailFastVerdict struct {
	// Failing: the evidence holds now, on enough pods and with none Ready.
	Failing bool
	// Since is when it was first seen (Failing only).
	Since time.Time
	// Failed: it has held for the whole window: the revision is failing.
	Failed bool
	// Evidence is the failing pods' evidence, by pod name.
	Evidence []PodFailure
	// Pods is how many pods of the newRS were looked at.
	Pods int
	// RequeueAfter is when the window ends (Failing, not yet Failed).
	RequeueAfter time.Duration
	// Class is the evidence's (EvidenceClass), and Window the one that
	// applied to it.
	Class  string
	Window time.Duration
}

// DecideFailFast decides whether a rollout in progress is failing.
//
// The revision is failing when failure evidence has held for the whole window
// on enough of its new pods (by default every one that exists, at least one)
// and none of them is Ready. The window starts when that is first seen, and
// starts again whenever it stops holding: a new pod becomes Ready, fewer pods
// than required show evidence (the failing one was deleted, or a new one came
// up healthy), or there is no pod at all; a new template is another newRS,
// whose window is its own. So one bad node does not condemn a revision whose
// other pods run: their readiness, or their lack of evidence, stops the clock.
func DecideFailFast(in FailFastInput) FailFastVerdict {
	v := FailFastVerdict{Pods: len(in.Pods)}
	for _, p := range in.Pods {
		if p.Ready {
			return FailFastVerdict{Pods: len(in.Pods)}
		}
		if p.Failure != nil {
			v.Evidence = append(v.Evidence, *p.Failure)
		}
	}
	need := in.MinFailingPods
	if need <= 0 {
		need = len(in.Pods)
	}
	need = max(need, 1)
	if len(v.Evidence) < need {
		v.Evidence = nil
		return v
	}
	slices.SortFunc(v.Evidence, func(a, b PodFailure) int { return strings.Compare(a.Pod, b.Pod) })
	v.Failing = true
	v.Since = in.FailingSince
	if v.Since.IsZero() || v.Since.After(in.Now) {
		v.Since = in.Now
	}
	// The window runs from the first evidence whatever its class: a blip
	// that turns into "manifest unknown" is judged on the ordinary window
	// from the start.
	v.Class, v.Window = EvidenceClass(v.Evidence), in.Window
	if v.Class == ClassTransient {
		v.Window = max(in.Window, in.TransientWindow)
	}
	held := in.Now.Sub(v.Since)
	if held >= v.Window {
		v.Failed = true
		return v
	}
	v.RequeueAfter = v.Window - held
	return v
}

// FailFastSummary says in a sentence what the evidence is, for events and the
// rollback status, such as
// "3/3 new pods ImagePullBackOff for 62s (container web, image shop:1.4-typo)".
func FailFastSummary(v FailFastVerdict, now time.Time) string {
	if len(v.Evidence) == 0 {
		return ""
	}
	reason := v.Evidence[0].Reason
	if parts := reasonCounts(v.Evidence); len(parts) > 1 {
		reason = strings.Join(parts, ", ")
	}
	return fmt.Sprintf("%d/%d new pods %s for %s%s%s", len(v.Evidence), v.Pods, reason, now.Sub(v.Since).Round(time.Second), whereOf(v.Evidence[0]), classPhrase(v))
}

// reasonCounts counts the evidence by reason, in the order first seen:
// ["3 ImagePullBackOff", "1 CrashLoopBackOff"].
func reasonCounts(evidence []PodFailure) []string {
	counts := map[string]int{}
	var order []string
	for _, e := range evidence {
		if counts[e.Reason] == 0 {
			order = append(order, e.Reason)
		}
		counts[e.Reason]++
	}
	parts := make([]string, 0, len(order))
	for _, r := range order {
		parts = append(parts, fmt.Sprintf("%d %s", counts[r], r))
	}
	return parts
}

// whereOf says where one piece of evidence is: " (container web, image
// shop:1.4, 3 restarts)", or the pod's message, such as the scheduler's.
func whereOf(e PodFailure) string {
	switch {
	case e.Container != "":
		where := fmt.Sprintf(" (container %s, image %s", e.Container, e.Image)
		if e.Restarts > 0 {
			where += fmt.Sprintf(", %d restarts", e.Restarts)
		}
		return where + ")"
	case e.Message != "":
		return " (" + e.Message + ")"
	}
	return ""
}

// classPhrase says in the summary which kind of failure it was, and so
// which window applied: "; a permanent failure (manifest unknown)" or "; a
// transient failure (i/o timeout) for the whole transient window of 5m0s".
func classPhrase(v FailFastVerdict) string {
	causes := map[string]bool{}
	var list []string
	for _, e := range v.Evidence {
		if e.Class == v.Class && e.Cause != "" && !causes[e.Cause] {
			causes[e.Cause] = true
			list = append(list, e.Cause)
		}
	}
	switch v.Class {
	case ClassPermanent:
		return fmt.Sprintf("; a permanent failure (%s)", strings.Join(list, ", "))
	case ClassTransient:
		return fmt.Sprintf("; a transient failure (%s) for the whole transient window of %s", strings.Join(list, ", "), v.Window)
	}
	return ""
}
