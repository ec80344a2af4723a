package reconciler

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/rollout"
)

// LedgerSinceConfigMap, in the guard's namespace (the platform team's, which
// tenants cannot write), records when a release that keeps the ledger first
// ran in the cluster: Options.LegacyCutoff.
const LedgerSinceConfigMap = "deployguard-ledger"

// ledgerSinceKey is the ConfigMap's key, an RFC 3339 time.
const ledgerSinceKey = "since"

// LedgerSince returns the time recorded in LedgerSinceConfigMap, creating it
// with now the first time. Written once and never updated: a later start
// must not let Deployments created since adopt annotations.
func LedgerSince(ctx context.Context, c client.Client, namespace string, now time.Time) (time.Time, error) {
	cm := &corev1.ConfigMap{}
	err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: LedgerSinceConfigMap}, cm)
	if apierrors.IsNotFound(err) {
		cm = &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: LedgerSinceConfigMap},
			Data:       map[string]string{ledgerSinceKey: now.UTC().Format(time.RFC3339)},
		}
		err = c.Create(ctx, cm)
		if apierrors.IsAlreadyExists(err) {
			err = c.Get(ctx, client.ObjectKeyFromObject(cm), cm)
		}
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("reading when the guard's ledger began (ConfigMap %s/%s): %w", namespace, LedgerSinceConfigMap, err)
	}
	t, ok := rollout.ParseTime(cm.Data[ledgerSinceKey])
	if !ok {
		return time.Time{}, fmt.Errorf("ConfigMap %s/%s: %q is not an RFC 3339 time", namespace, LedgerSinceConfigMap, cm.Data[ledgerSinceKey])
	}
	return t, nil
}
