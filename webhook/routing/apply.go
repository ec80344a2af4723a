package routing

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ErrNotSplit says the installed validating webhook configuration has none
// of the layouts the guard routes (EnforceWebhook with CreateWebhook and
// UpdateWebhook, or with CreateWebhook and PreviousUpdateWebhook, or with
// ValidateWebhook): an install older than the split, or edited. The guard
// leaves it as it is, since narrowing one entry without the others could
// send a request that must be judged nowhere. A guard of an earlier release
// finds none of its own layouts in this release's configuration, so it
// leaves this release's routing alone too.
var ErrNotSplit = errors.New("the validating webhook configuration does not have " + EnforceWebhook + " with " +
	CreateWebhook + " and " + UpdateWebhook + " (or with " + CreateWebhook + " and " + PreviousUpdateWebhook + ", or with " + ValidateWebhook + ")")

// Route writes e's routing into the validating webhook configuration name:
// EnforceWebhook's operations and each entry's condition, in one update so
// that no request ever matches two entries, nor none when the guard must
// decide it. It writes only when they differ, and reports whether it did.
// The read goes to the API server (c reads uncached), so that a write never
// starts from a stale copy.
func Route(ctx context.Context, c ReadWriter, name string, e Enforced) (bool, error) {
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	if err := c.Get(ctx, client.ObjectKey{Name: name}, vwc); err != nil {
		return false, fmt.Errorf("reading ValidatingWebhookConfiguration %s: %w", name, err)
	}
	entry := func(name string) *admissionregistrationv1.ValidatingWebhook {
		if i := slices.IndexFunc(vwc.Webhooks, func(w admissionregistrationv1.ValidatingWebhook) bool { return w.Name == name }); i >= 0 {
			return &vwc.Webhooks[i]
		}
		return nil
	}
	enforce, create, update, validate := entry(EnforceWebhook), entry(CreateWebhook), entry(UpdateWebhook), entry(ValidateWebhook)
	previous := entry(PreviousUpdateWebhook)
	before := vwc.DeepCopy()
	var changed []bool
	// Two layouts at once (an apply that merged a later release's entries
	// into an earlier configuration): creates and updates would reach two
	// entries, whatever the guard wrote. The earlier layout's entries are
	// the ones to remove.
	var stale []string
	switch {
	case update != nil:
		for _, w := range []*admissionregistrationv1.ValidatingWebhook{previous, validate} {
			if w != nil {
				stale = append(stale, w.Name)
			}
		}
	case previous != nil && validate != nil:
		stale = append(stale, validate.Name)
	}
	switch {
	case enforce != nil && len(stale) > 0:
		return false, fmt.Errorf("%w: it has %s of an earlier layout beside the later one's; remove them (kubectl edit validatingwebhookconfiguration %s)",
			ErrNotSplit, strings.Join(stale, " and "), name)
	case enforce != nil && create != nil && previous != nil:
		// The previous release's layout: no selector (its guard would
		// not keep the update entry's condition in line with one).
		changed = append(changed,
			setOperations(enforce, EnforceOperations(e)),
			setObjectSelector(enforce, nil),
			setCondition(enforce, MustDecideCondition, MustDecide(e)),
			setCondition(create, MayAdviseCondition, MayAdviseCreate(e)),
			setCondition(previous, MayAdviseCondition, mayAdvise(e, false)))
	case enforce != nil && create != nil && update != nil:
		changed = append(changed,
			setOperations(enforce, EnforceOperations(e)),
			setObjectSelector(enforce, EnforceObjectSelector(e)),
			setCondition(enforce, MustDecideCondition, MustDecide(e)),
			setCondition(create, MayAdviseCondition, MayAdviseCreate(e)),
			setCondition(update, MayAdviseCondition, MayAdvise(e)))
	case enforce != nil && validate != nil:
		// The earlier layout: its enforce entry takes every operation (as
		// it did, should it keep this release's narrowed ones after a
		// partial downgrade), and its conditions route.
		changed = append(changed,
			setOperations(enforce, allOperations),
			setObjectSelector(enforce, nil),
			setCondition(enforce, MustDecideCondition, MustDecide(e)),
			setCondition(validate, MayAdviseCondition, mayAdvise(e, false)))
	default:
		return false, ErrNotSplit
	}
	if !slices.Contains(changed, true) {
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
// missing and removing it when expr is empty, and reports whether it changed.
func setCondition(w *admissionregistrationv1.ValidatingWebhook, name, expr string) bool {
	i := slices.IndexFunc(w.MatchConditions, func(mc admissionregistrationv1.MatchCondition) bool { return mc.Name == name })
	switch {
	case i < 0 && expr == "":
		return false
	case i < 0:
		w.MatchConditions = append(w.MatchConditions, admissionregistrationv1.MatchCondition{Name: name, Expression: expr})
	case expr == "":
		w.MatchConditions = slices.Delete(w.MatchConditions, i, i+1)
	case w.MatchConditions[i].Expression == expr:
		return false
	default:
		w.MatchConditions[i].Expression = expr
	}
	return true
}

// setOperations sets the operations of w's rules to ops, and reports
// whether they changed.
func setOperations(w *admissionregistrationv1.ValidatingWebhook, ops []admissionregistrationv1.OperationType) bool {
	changed := false
	for i := range w.Rules {
		if !slices.Equal(w.Rules[i].Operations, ops) {
			w.Rules[i].Operations = slices.Clone(ops)
			changed = true
		}
	}
	return changed
}

// setObjectSelector sets w's objectSelector to sel, nil selecting every
// object (as the API server's default, the empty selector, does), and
// reports whether it changed.
func setObjectSelector(w *admissionregistrationv1.ValidatingWebhook, sel *metav1.LabelSelector) bool {
	empty := func(s *metav1.LabelSelector) bool {
		return s == nil || len(s.MatchLabels) == 0 && len(s.MatchExpressions) == 0
	}
	if empty(w.ObjectSelector) && empty(sel) || apiequality.Semantic.DeepEqual(w.ObjectSelector, sel) {
		return false
	}
	w.ObjectSelector = sel.DeepCopy()
	return true
}
