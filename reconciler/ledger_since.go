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
// ran in the cluster, and whether it adopts an earlier release's annotations
// (LedgerAdoptKey): Options.LegacyCutoff.
const LedgerSinceConfigMap = "deployguard-ledger"

// ledgerSinceKey is the ConfigMap's key, an RFC 3339 time.
const ledgerSinceKey = "since"

// LedgerAdoptKey, set to "true" in LedgerSinceConfigMap by a person before
// this release first starts, asks it to take over from an earlier release:
// the Deployments created before that start adopt the earlier release's
// annotations as their first ledger (AdoptLegacy). Without it nothing is
// adopted. An earlier release's annotations are the tenant's to write, so
// the guard cannot tell them from forgeries: only the platform team, who
// knows that an earlier release ran, may ask for them to be believed, once.
// `deployguard uninstall` deletes the ConfigMap with the ledgers, so that a
// guard installed again believes nothing written meanwhile.
const LedgerAdoptKey = "adopt-earlier-release"

// LedgerSince returns the time before which Deployments adopt an earlier
// release's annotations: when this release first ran, if LedgerAdoptKey asks
// for a takeover, or zero (adopt nothing). The time is recorded in
// LedgerSinceConfigMap the first time, creating it (or filling in the one
// the platform team wrote with LedgerAdoptKey alone); written once and
// never moved: a later start must not let Deployments created since adopt
// annotations.
func LedgerSince(ctx context.Context, c client.Client, namespace string, now time.Time) (time.Time, error) {
	cm := &corev1.ConfigMap{}
	key := client.ObjectKey{Namespace: namespace, Name: LedgerSinceConfigMap}
	err := c.Get(ctx, key, cm)
	switch {
	case apierrors.IsNotFound(err):
		cm = &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: LedgerSinceConfigMap},
			Data:       map[string]string{ledgerSinceKey: now.UTC().Format(time.RFC3339)},
		}
		err = c.Create(ctx, cm)
		if apierrors.IsAlreadyExists(err) {
			err = c.Get(ctx, key, cm)
		}
	case err == nil && cm.Data[ledgerSinceKey] == "":
		// Written by a person to ask for a takeover: the first start fills
		// in its time. Conditional on the resourceVersion read, so two
		// replicas starting at once record one time.
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		cm.Data[ledgerSinceKey] = now.UTC().Format(time.RFC3339)
		err = c.Update(ctx, cm)
		if apierrors.IsConflict(err) {
			err = c.Get(ctx, key, cm)
		}
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("reading when the guard's ledger began (ConfigMap %s/%s): %w", namespace, LedgerSinceConfigMap, err)
	}
	t, ok := rollout.ParseTime(cm.Data[ledgerSinceKey])
	if !ok {
		return time.Time{}, fmt.Errorf("ConfigMap %s/%s: %q is not an RFC 3339 time", namespace, LedgerSinceConfigMap, cm.Data[ledgerSinceKey])
	}
	if cm.Data[LedgerAdoptKey] != "true" {
		return time.Time{}, nil
	}
	return t, nil
}
