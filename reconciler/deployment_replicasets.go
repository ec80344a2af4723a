package reconciler

import (
	"context"
	"fmt"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// replicaSetControllerKey indexes ReplicaSets by the name of the Deployment that
// controls them, so that a reconcile lists a Deployment's ReplicaSets from the
// cache without scanning the namespace.
const replicaSetControllerKey = ".metadata.controller.deployment"

// indexReplicaSetByController is the index function for replicaSetControllerKey.
func indexReplicaSetByController(o client.Object) []string {
	ref := metav1.GetControllerOf(o)
	if ref == nil || ref.Kind != "Deployment" || !strings.HasPrefix(ref.APIVersion, appsv1.GroupName+"/") {
		return nil
	}
	return []string{ref.Name}
}

// listReplicaSets returns the ReplicaSets the Deployment controls (controller
// reference with the Deployment's UID): allRSs in upstream's words. Orphans that
// merely match the selector are left to the Deployment controller to adopt; they
// come back here through the ReplicaSet watch once adopted.
func (r *DeploymentReconciler) listReplicaSets(ctx context.Context, d *appsv1.Deployment) ([]*appsv1.ReplicaSet, error) {
	var list appsv1.ReplicaSetList
	if err := r.Client.List(ctx, &list,
		client.InNamespace(d.Namespace),
		client.MatchingFields{replicaSetControllerKey: d.Name},
	); err != nil {
		return nil, fmt.Errorf("listing ReplicaSets of Deployment %s/%s: %w", d.Namespace, d.Name, err)
	}
	allRSs := make([]*appsv1.ReplicaSet, 0, len(list.Items))
	for i := range list.Items {
		rs := &list.Items[i]
		if ref := metav1.GetControllerOf(rs); ref != nil && ref.UID == d.UID {
			allRSs = append(allRSs, rs)
		}
	}
	return allRSs, nil
}
