package webhook

import (
	"context"
	"errors"
	"fmt"
	"slices"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ErrNotSplit says the installed validating webhook configuration does not
// have both EnforceWebhook and ValidateWebhook (an install older than the
// split, or edited): the guard leaves it as it is, since narrowing one entry
// without the other could send a request that must be judged nowhere.
var ErrNotSplit = errors.New("the validating webhook configuration does not have both " + EnforceWebhook + " and " + ValidateWebhook)

// Route writes e's conditions into the validating webhook configuration
// name, in one update so that no request ever matches both entries, nor
// neither when the guard must decide it. It writes only when they differ, and reports whether it did.
// The read goes to the API server (c reads uncached), so that a write
// never starts from a stale copy.
func Route(ctx context.Context, c ReadWriter, name string, e Enforced) (bool, error) {
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	if err := c.Get(ctx, client.ObjectKey{Name: name}, vwc); err != nil {
		return false, fmt.Errorf("reading ValidatingWebhookConfiguration %s: %w", name, err)
	}
	enforce := slices.IndexFunc(vwc.Webhooks, func(w admissionregistrationv1.ValidatingWebhook) bool { return w.Name == EnforceWebhook })
	validate := slices.IndexFunc(vwc.Webhooks, func(w admissionregistrationv1.ValidatingWebhook) bool { return w.Name == ValidateWebhook })
	if enforce < 0 || validate < 0 {
		return false, ErrNotSplit
	}
	before := vwc.DeepCopy()
	a := setCondition(&vwc.Webhooks[enforce], MustDecideCondition, MustDecide(e))
	b := setCondition(&vwc.Webhooks[validate], MayAdviseCondition, MayAdvise(e))
	if !a && !b {
		return false, nil
	}
	// The optimistic lock: a CA injected meanwhile is not written back
	// stale; the caller tries again.
	if err := c.Patch(ctx, vwc, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		return false, fmt.Errorf("routing ValidatingWebhookConfiguration %s: %w", name, err)
	}
	return true, nil
}

// ReadWriter reads and writes objects.
type ReadWriter interface {
	client.Reader
	client.Writer
}

// setCondition sets the matchCondition name of w to expr, adding it when
// missing, and reports whether it changed.
func setCondition(w *admissionregistrationv1.ValidatingWebhook, name, expr string) bool {
	for i := range w.MatchConditions {
		if w.MatchConditions[i].Name == name {
			if w.MatchConditions[i].Expression == expr {
				return false
			}
			w.MatchConditions[i].Expression = expr
			return true
		}
	}
	w.MatchConditions = append(w.MatchConditions, admissionregistrationv1.MatchCondition{Name: name, Expression: expr})
	return true
}
