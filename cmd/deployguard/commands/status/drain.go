package status

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/webhook/review"
)

// drainStatus is what `deployguard status --drain NODE` tells: the
// Deployments whose pods on the node the Eviction API would refuse now.
type drainStatus struct {
	Node string `json:"node"`
	// Pods is how many pods of Deployments run on the node.
	Pods    int            `json:"pods"`
	Blocked []drainBlocked `json:"blocked"`
}

// drainBlocked is one Deployment with pods on the node that cannot be
// evicted now, and why.
type drainBlocked struct {
	Namespace  string   `json:"namespace"`
	Deployment string   `json:"deployment"`
	Pods       []string `json:"pods"`
	// Budgets are the PodDisruptionBudgets that refuse the eviction.
	Budgets []string `json:"budgets"`
	Reason  string   `json:"reason"`
	// Never is set when the budget allows no eviction even with every pod
	// healthy: waiting does not help, the budget or the replicas must change.
	Never bool `json:"never,omitempty"`
}

// evictionRefusal says why the Eviction API would refuse to evict pod now,
// given the budgets of its namespace, as the API server decides it
// (pkg/registry/core/pod/storage/eviction.go; the caller passes over the pods
// it evicts without asking a budget): more than one budget selecting
// it, a budget whose status the disruption controller has not caught up with,
// or one that allows no disruption. An unready pod is let go when the budget
// says so (unhealthyPodEvictionPolicy) or is healthy. ok is false when the
// eviction would go through.
func evictionRefusal(pod *corev1.Pod, budgets []policyv1.PodDisruptionBudget) (names []string, reason string, never, ok bool) {
	var match []*policyv1.PodDisruptionBudget
	for i := range budgets {
		p := &budgets[i]
		if p.Spec.Selector == nil {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector)
		if err != nil || !sel.Matches(labels.Set(pod.Labels)) {
			continue
		}
		match = append(match, p)
	}
	switch len(match) {
	case 0:
		return nil, "", false, false
	case 1:
	default:
		for _, p := range match {
			names = append(names, p.Name)
		}
		slices.Sort(names)
		return names, fmt.Sprintf("%d PodDisruptionBudgets select its pods (%s): the Eviction API refuses a pod with more than one; keep one",
			len(names), strings.Join(names, ", ")), true, true
	}
	p := match[0]
	names = []string{p.Name}
	b, _ := review.BudgetOf(p)
	// In the API server's order: an unready pod first, then the status.
	if !podReady(pod) {
		if p.Spec.UnhealthyPodEvictionPolicy != nil && *p.Spec.UnhealthyPodEvictionPolicy == policyv1.AlwaysAllow {
			return nil, "", false, false
		}
		if p.Status.CurrentHealthy >= p.Status.DesiredHealthy && p.Status.DesiredHealthy > 0 {
			return nil, "", false, false
		}
	}
	if p.Status.ObservedGeneration < p.Generation {
		return names, fmt.Sprintf("PodDisruptionBudget %q (%s) was changed and the disruption controller has not counted its pods yet; try again shortly", p.Name, b.Rule()), false, true
	}
	if p.Status.DisruptionsAllowed > 0 {
		return nil, "", false, false
	}
	reason = fmt.Sprintf("PodDisruptionBudget %q (%s) allows no disruption now: %d of %d expected pods healthy, %d must stay",
		p.Name, b.Rule(), p.Status.CurrentHealthy, p.Status.ExpectedPods, p.Status.DesiredHealthy)
	if review.AllowsNoDisruption(b, p.Status.ExpectedPods) {
		never = true
		reason += "; it allows none even with every pod healthy"
		if n := review.ReplicasToDrain(b, p.Status.ExpectedPods); n > 0 {
			reason += fmt.Sprintf(": set maxUnavailable: 1, or run %d pods or more", n)
		} else {
			reason += ": set maxUnavailable: 1"
		}
	} else {
		reason += "; it allows one once more pods are Ready"
	}
	return names, reason, never, true
}

func podReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// fetchDrain reads the pods on node, their ReplicaSets' owners and the
// budgets of their namespaces, and says which Deployments' pods the Eviction
// API would refuse now. It costs the node's pods and one list of budgets per
// namespace, never the cluster's pods.
func fetchDrain(ctx context.Context, c client.Client, node string) (drainStatus, error) {
	st := drainStatus{Node: node, Blocked: []drainBlocked{}}
	var podList corev1.PodList
	if err := c.List(ctx, &podList, client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("spec.nodeName", node)}); err != nil {
		return st, fmt.Errorf("listing the pods on node %s: %w", node, err)
	}
	budgets := map[string][]policyv1.PodDisruptionBudget{}
	owners := map[client.ObjectKey]string{} // ReplicaSet → Deployment ("" for none)
	byDeployment := map[client.ObjectKey]*drainBlocked{}
	for i := range podList.Items {
		pod := &podList.Items[i]
		// What the Eviction API lets go without asking a budget (canIgnorePDB):
		// pods being deleted, finished or still Pending.
		if pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodPending {
			continue
		}
		deployment, err := deploymentOf(ctx, c, pod, owners)
		if err != nil {
			return st, err
		}
		if deployment == "" {
			continue
		}
		st.Pods++
		bs, seen := budgets[pod.Namespace]
		if !seen {
			var list policyv1.PodDisruptionBudgetList
			if err := c.List(ctx, &list, client.InNamespace(pod.Namespace)); err != nil {
				return st, fmt.Errorf("listing the PodDisruptionBudgets of namespace %s: %w", pod.Namespace, err)
			}
			bs = list.Items
			budgets[pod.Namespace] = bs
		}
		names, reason, never, refused := evictionRefusal(pod, bs)
		if !refused {
			continue
		}
		key := client.ObjectKey{Namespace: pod.Namespace, Name: deployment}
		b := byDeployment[key]
		if b == nil {
			b = &drainBlocked{Namespace: pod.Namespace, Deployment: deployment, Budgets: names, Reason: reason, Never: never}
			byDeployment[key] = b
		}
		b.Pods = append(b.Pods, pod.Name)
	}
	for _, b := range byDeployment {
		slices.Sort(b.Pods)
		st.Blocked = append(st.Blocked, *b)
	}
	slices.SortFunc(st.Blocked, func(x, y drainBlocked) int {
		return strings.Compare(x.Namespace+"/"+x.Deployment, y.Namespace+"/"+y.Deployment)
	})
	return st, nil
}

// deploymentOf names the Deployment that owns pod through its ReplicaSet, or
// "" for a pod no Deployment owns.
func deploymentOf(ctx context.Context, c client.Client, pod *corev1.Pod, owners map[client.ObjectKey]string) (string, error) {
	ref := metav1.GetControllerOf(pod)
	if ref == nil || ref.Kind != "ReplicaSet" {
		return "", nil
	}
	key := client.ObjectKey{Namespace: pod.Namespace, Name: ref.Name}
	if name, ok := owners[key]; ok {
		return name, nil
	}
	rs := &metav1.PartialObjectMetadata{}
	rs.SetGroupVersionKind(appsv1.SchemeGroupVersion.WithKind("ReplicaSet"))
	name := ""
	if err := c.Get(ctx, key, rs); err != nil {
		if client.IgnoreNotFound(err) != nil {
			return "", fmt.Errorf("reading ReplicaSet %s: %w", key, err)
		}
	} else if o := metav1.GetControllerOfNoCopy(rs); o != nil && o.Kind == "Deployment" {
		name = o.Name
	}
	owners[key] = name
	return name, nil
}

func printDrain(w io.Writer, st drainStatus) {
	if len(st.Blocked) == 0 {
		fmt.Fprintf(w, "Node %s: every pod of a Deployment on it can be evicted now (%d checked).\n", st.Node, st.Pods)
		return
	}
	n := "Deployments"
	if len(st.Blocked) == 1 {
		n = "Deployment"
	}
	fmt.Fprintf(w, "Node %s: a drain would stop at %d %s whose pods cannot be evicted now (%d pods of Deployments on the node):\n\n", st.Node, len(st.Blocked), n, st.Pods)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tDEPLOYMENT\tPODS\tWHY")
	for _, b := range st.Blocked {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", b.Namespace, b.Deployment, strings.Join(b.Pods, ","), b.Reason)
	}
	_ = tw.Flush()
}
