package review

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/webhook/origin"
)

// The overlap check: two Deployments whose selectors select each other's
// pods fight over them. Admission refuses an overlap where it starts; the
// candidates come from an index (overlap_index.go), the decision is made
// here, exactly.

// Selection is what the overlap check knows of another Deployment: its name,
// its selector and the labels of its pods.
type Selection struct {
	Name           string
	Selector       labels.Selector
	TemplateLabels labels.Set
	// Deleting: being deleted; its pods go with it, so it overlaps nothing.
	Deleting bool
	// Replicas it asks for, for the disruption budgets that select its pods.
	Replicas int32
}

// SelectionOf summarises a Deployment for the overlap check; ok is false when
// its selector is empty or does not parse (such a Deployment selects nothing
// the check could compare).
func SelectionOf(d *appsv1.Deployment) (Selection, bool) {
	if emptySelector(d.Spec.Selector) {
		return Selection{}, false
	}
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil {
		return Selection{}, false
	}
	return Selection{Name: d.Name, Selector: sel, TemplateLabels: labels.Set(d.Spec.Template.Labels), Deleting: d.DeletionTimestamp != nil, Replicas: rollout.Replicas(d)}, true
}

// OverlapSource finds the Deployments of d's namespace whose selector or pods
// may overlap d's: every Deployment that does is among them, and few others
// are. The webhook's comes from an index kept by the Deployment informer, so
// the cost of a request does not grow with the namespace.
type OverlapSource interface {
	OverlapCandidates(ctx context.Context, d *appsv1.Deployment) ([]Selection, error)
}

// StartsAnOverlap: the write makes the Deployment's selector select the
// pods of another Deployment of the namespace, or its pods selected by
// another's selector. The selector is immutable, so only a new object or
// new template labels can. An overlap that predates an update only warns:
// refusing it would block unrelated changes such as a rollback.
func StartsAnOverlap(ctx context.Context, in Input) Findings {
	d, old := in.Request.Object, in.Request.OldObject
	if in.Overlaps == nil || !OverlapMayChange(old, d) {
		return nil
	}
	now := checkOverlap(ctx, in.Overlaps, d)
	if old != nil && overlapping(now) && overlapping(checkOverlap(ctx, in.Overlaps, old)) {
		// The overlap predates this update.
		now = overlapPredates(now)[:1]
	}
	return now
}

// OverlapsAnotherDeployment: a stored Deployment overlaps another. It
// warns: admission refuses an overlap only where it starts.
func OverlapsAnotherDeployment(ctx context.Context, in Input) Findings {
	if in.Overlaps == nil {
		return nil
	}
	return overlapPredates(checkOverlap(ctx, in.Overlaps, in.Request.Object))
}

// CheckOverlap refuses a Deployment whose selector selects the pods of another
// Deployment in the namespace, or whose pods another Deployment's selector
// selects: two Deployments would then fight over the same pods. others are
// the candidates an OverlapSource found; the decision is made here, exactly.
func CheckOverlap(d *appsv1.Deployment, others []Selection) Findings {
	var f Findings
	p := specPath.Child("selector")
	mine, ok := SelectionOf(d)
	if !ok {
		return f // reported by checkSelector
	}
	// In name order, so that the message does not depend on the index.
	others = slices.SortedFunc(slices.Values(others), func(a, b Selection) int { return strings.Compare(a.Name, b.Name) })
	for _, o := range others {
		if o.Name == d.Name || o.Deleting {
			continue
		}
		switch {
		case mine.Selector.Matches(o.TemplateLabels):
			f = append(f, refuse(field.Invalid(p, mine.Selector.String(), fmt.Sprintf(
				"this selector also selects the pods of Deployment %q (labels %s): add a label that tells the two apart, such as app.kubernetes.io/instance, to the template and the selector",
				o.Name, o.TemplateLabels.String())), origin.Overlap))
		case o.Selector.Matches(mine.TemplateLabels):
			f = append(f, refuse(field.Invalid(specPath.Child("template", "metadata", "labels"), mine.TemplateLabels.String(), fmt.Sprintf(
				"these pods would be selected by Deployment %q (selector %s) too: add a label that tells the two apart, such as app.kubernetes.io/instance, to the template and the selector",
				o.Name, o.Selector.String())), origin.Overlap))
		}
	}
	return f
}

// checkOverlap checks d against the candidates overlaps finds.
func checkOverlap(ctx context.Context, overlaps OverlapSource, d *appsv1.Deployment) Findings {
	others, err := overlaps.OverlapCandidates(ctx, d)
	if err != nil {
		f := refuse(field.InternalError(specPath.Child("selector"),
			fmt.Errorf("could not look up the namespace's Deployments to check for overlapping selectors, try again: %w", err)), origin.Overlap)
		f.Message = "could not look up the namespace's Deployments to check for overlapping selectors: " + err.Error()
		return Findings{f}
	}
	return CheckOverlap(d, others)
}

// overlapping reports whether the overlap check found an overlap (not a
// failed lookup).
func overlapping(f Findings) bool {
	for _, x := range f {
		if x.Severity == SeverityError && x.Err.Type != field.ErrorTypeInternal {
			return true
		}
	}
	return false
}

// overlapPredates turns overlap refusals into the warnings of an overlap that
// predates the request: admission refuses an overlap only where it starts.
func overlapPredates(f Findings) Findings {
	out := make(Findings, 0, len(f))
	for _, x := range f {
		if x.Severity == SeverityError && x.Err.Type != field.ErrorTypeInternal {
			x = warn(origin.Overlap, specPath.Child("selector"), "this Deployment's pods overlap with another Deployment's; "+x.Err.Detail)
		}
		out = append(out, x)
	}
	return out
}

// OverlapMayChange reports whether a write from old to d may change which
// Deployments d overlaps: a new Deployment (old nil), new template labels
// (the selector is immutable), or the start of its deletion (a Deployment
// being deleted overlaps nothing; only the audit's watch sees that change,
// admission never does).
func OverlapMayChange(old, d *appsv1.Deployment) bool {
	return old == nil || !maps.Equal(old.Spec.Template.Labels, d.Spec.Template.Labels) ||
		(old.DeletionTimestamp == nil) != (d.DeletionTimestamp == nil)
}
