// Package routing keeps the guard's own webhook configurations routed by
// what it enforces: which entry of the validating webhook takes which
// request (MustDecide, MayAdvise, Route), which creates the mutating
// webhook's default entry takes (RouteMutating), and the leader's loops that
// write them (Validating, Mutating).
package routing

import (
	"slices"
	"strconv"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deployguard/deployguard/policy"
	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/webhook/review"
)

// The validating webhook for Deployments is three entries of one
// configuration that call the same handler: the API server sends each
// request to at most one of them, by their operations and matchConditions.
//
//   - EnforceWebhook (failurePolicy Fail) receives the requests that an
//     enforced rule needing the guard's state may refuse: a quarantined
//     template brought back, and, when the configuration or the loaded
//     policies enforce them, the Rego policies, the bounds and the disruption
//     budgets; the DELETEs of Deployments, when an enforced policy judges
//     deletions. With the guard down those requests are refused. Its rules
//     list only the operations such a rule can apply to
//     (EnforceOperations): the API server does not evaluate its condition
//     for the others. When the quarantine is the only such rule, it also
//     selects the Deployments labelled quarantined (EnforceObjectSelector).
//   - CreateWebhook and UpdateWebhook (failurePolicy Ignore) receive the
//     rest of the CREATEs and of the UPDATEs: overlaps, warnings, advice.
//     No Ignore entry takes a DELETE: a warn- or audit-mode policy judges
//     the DELETEs that come to EnforceWebhook, and no other.
//     With the guard down they are admitted; the native policies still
//     refuse what needs only the object, and the audit reports an overlap
//     once the guard is back. An update that leaves the spec as it was
//     reaches no entry when no enforced rule applies and no loaded policy
//     reads more than the spec: the guard would have nothing to add to what
//     it said when the spec was written (an annotation, a label, a finalizer
//     written by a GitOps tool or by the guard itself).
//
// CreateWebhook has no matchCondition unless an enforced rule can apply to a
// CREATE: kube-apiserver 1.36 converts the whole object for every entry
// with matchConditions it evaluates, which on an ordinary create costs it
// more CPU than the condition could save.
//
// The operations and conditions depend on the configuration and on the
// loaded policies, so the guard rewrites them (Route) when they change.
const (
	EnforceWebhook = "enforce.deployments.deployguard.io"
	CreateWebhook  = "create.deployments.deployguard.io"
	UpdateWebhook  = "advise-update.deployments.deployguard.io"
	// PreviousUpdateWebhook is UpdateWebhook of the configurations
	// installed before the enforce entry had an objectSelector: renamed so
	// that a guard of that release, whose routing knows no selector, finds
	// its layout gone and leaves this one alone (ErrNotSplit) instead of
	// rewriting UpdateWebhook's condition under this release's selector.
	// Route routes that layout too, without a selector.
	PreviousUpdateWebhook = "update.deployments.deployguard.io"
	// ValidateWebhook is the one Ignore entry, for CREATE and UPDATE, of
	// the webhook configurations installed before CreateWebhook and
	// UpdateWebhook; Route routes that layout too.
	ValidateWebhook = "validate.deployments.deployguard.io"
	// MustDecideCondition is EnforceWebhook's matchCondition and
	// MayAdviseCondition that of the others: the negation of the first,
	// narrowed (MayAdvise, MayAdviseCreate).
	MustDecideCondition = "guard-must-decide"
	MayAdviseCondition  = "guard-may-advise"
)

// Enforced is what, of the guard's configuration and policies, refuses writes
// that the API server cannot judge without the guard.
type Enforced struct {
	// Refusals: the API server does not enforce the native refusals, so the
	// guard must judge every write, deletes included.
	Refusals bool
	// Quarantine refuses bringing back a template whose rollout failed.
	Quarantine bool
	// Policies: a loaded Rego policy is in enforce mode.
	Policies bool
	// PoliciesOnDelete: a loaded Rego policy in enforce mode is evaluated
	// on a DELETE (policy.PolicyInfo.Deletes), and may refuse one.
	PoliciesOnDelete bool
	// PoliciesBeyondSpec: a loaded Rego policy, whatever its mode, reads
	// more of a request than the object's spec (policy.Set.ReadsOnlySpec),
	// so that an update of the metadata alone may get findings. Not an
	// enforced rule: it widens only UpdateWebhook (ValidateWebhook).
	PoliciesBeyondSpec bool
	// Bounds refuse a revision history or progress deadline outside them.
	Bounds bool
	// Budgets refuse a Deployment that a PodDisruptionBudget makes
	// undrainable.
	Budgets bool
	// Who the policies, bounds and budgets skip.
	ExemptNamespaces, ExemptUsernames, ExemptGroups []string
	GuardUsername                                   string
}

// LoadedPolicies is what the routing needs to know of the loaded Rego
// policies.
type LoadedPolicies struct {
	// Enforce: one of them is in enforce mode.
	Enforce bool
	// EnforceSkipsDelete: none of those in enforce mode is evaluated on a
	// DELETE (policy.PolicyInfo.Deletes), so that a DELETE need not reach
	// the guard for them. The zero value routes every DELETE to the guard
	// while a policy is enforced: a caller that cannot tell leaves no
	// deletion rule unjudged.
	EnforceSkipsDelete bool
	// BeyondSpec: one of them reads more of a request than the object's
	// spec (policy.Set.ReadsOnlySpec is false).
	BeyondSpec bool
}

// LoadedPoliciesOf is what the routing needs to know of the policy set s.
func LoadedPoliciesOf(s policy.Set) LoadedPolicies {
	l := LoadedPolicies{EnforceSkipsDelete: true, BeyondSpec: !s.ReadsOnlySpec()}
	for _, p := range s.Policies() {
		if p.Mode == policy.ModeEnforce {
			l.Enforce = true
			l.EnforceSkipsDelete = l.EnforceSkipsDelete && !p.Deletes
		}
	}
	return l
}

// EnforcedOf is what o enforces, with the loaded policies p.
func EnforcedOf(o *review.Options, p LoadedPolicies) Enforced {
	return Enforced{
		Refusals:           !o.NativeEnforced(),
		Quarantine:         o.Quarantine == review.QuarantineEnforce,
		Policies:           p.Enforce,
		PoliciesOnDelete:   p.Enforce && !p.EnforceSkipsDelete,
		PoliciesBeyondSpec: p.BeyondSpec,
		Bounds:             o.BoundsEnforce,
		Budgets:            o.DisruptionBudgets == review.BudgetsEnforce,
		ExemptNamespaces:   o.ExemptNamespaces, ExemptUsernames: o.ExemptUsernames, ExemptGroups: o.ExemptGroups,
		GuardUsername: o.GuardUsername,
	}
}

// MustDecide is the CEL matchCondition of EnforceWebhook: true for a request
// that e may refuse. It never errors, whatever the request, since an error in
// a Fail entry's condition refuses the request. DELETE is matched when the
// API server does not enforce deletion protection itself, or when an
// enforced policy judges deletions (the policies read the Deployment being
// deleted, oldObject).
func MustDecide(e Enforced) string {
	if e.Refusals {
		return "true"
	}
	var terms []string
	if e.Quarantine {
		// BringsBackAQuarantinedTemplate: an update that changes the
		// template of a Deployment with quarantined templates.
		terms = append(terms, `(request.operation == "UPDATE" && has(oldObject.metadata.annotations) && `+
			quote(vocab.AnnotationQuarantinedTemplates)+" in oldObject.metadata.annotations && "+
			"object.spec.template != oldObject.spec.template)")
	}
	var judged []string
	if e.Policies {
		// The policies read anything, metadata included.
		judged = append(judged, "true")
	}
	if e.Bounds {
		judged = append(judged, specChanged)
	}
	if e.Budgets {
		// drainMayChange: new replicas or new template labels.
		judged = append(judged, `request.operation == "CREATE" || `+changed("spec.replicas")+" || "+changed("spec.template.metadata.labels"))
	}
	if len(judged) > 0 {
		terms = append(terms, `(request.operation != "DELETE" && `+subject(e)+" && ("+strings.Join(judged, " || ")+"))")
	}
	if e.PoliciesOnDelete {
		terms = append(terms, `(request.operation == "DELETE" && `+subject(e)+")")
	}
	if len(terms) == 0 {
		return "false"
	}
	return strings.Join(terms, " || ")
}

// MayAdvise is UpdateWebhook's condition (and ValidateWebhook's, which takes
// the CREATEs too): the other requests, but an
// update that leaves the spec, the finalizers and the cleanup annotation as
// they were. On such an update the guard's own checks have nothing to say
// (check: the overlap, the quarantine, the bounds, the warnings and the
// budgets all follow the spec), so only a policy that reads more than the
// spec could; the policies that read only the spec judged it when it was
// written. The finalizer rules judge the metadata: a replica that finds the
// API server no longer enforcing them evaluates them itself until the leader
// routes every request to EnforceWebhook, so those updates still come.
func MayAdvise(e Enforced) string {
	return mayAdvise(e, EnforceObjectSelector(e) != nil)
}

// mayAdvise is MayAdvise beside an EnforceWebhook that selects (selected)
// or does not select on vocab.LabelQuarantined: when it does, this entry
// takes what it leaves out, the requests MustDecide matches on Deployments
// without the label (one quarantined by an earlier release, or whose label
// a client removed), so that the guard still judges them while it is up.
func mayAdvise(e Enforced, selected bool) string {
	rest := "!(" + MustDecide(e) + ")"
	if selected {
		rest = "!((" + MustDecide(e) + ") && " + quarantineLabelled + ")"
	}
	if e.PoliciesBeyondSpec || e.Refusals {
		return rest
	}
	cleanup := "metadata.?annotations[?" + quote(vocab.AnnotationCleanup) + "]"
	return rest + " && (" + specChanged + " || " + changed("metadata.finalizers") + " || " +
		"(object." + cleanup + " != oldObject." + cleanup + "))"
}

// EnforceOperations are the operations of EnforceWebhook's rules: those
// MustDecide(e) can be true for, so that the API server evaluates its
// condition on no other request: DELETE only while the native refusals are
// not the API server's or an enforced policy judges deletions, so that a
// deletion costs no condition otherwise. With nothing enforced, DELETE alone
// (a webhook rule lists at least one operation), the rarest write of a
// Deployment, under the condition "false".
func EnforceOperations(e Enforced) []admissionregistrationv1.OperationType {
	if e.Refusals {
		return slices.Clone(allOperations)
	}
	var ops []admissionregistrationv1.OperationType
	switch {
	case e.Policies || e.Bounds || e.Budgets:
		ops = []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update}
	case e.Quarantine:
		ops = []admissionregistrationv1.OperationType{admissionregistrationv1.Update}
	}
	if e.PoliciesOnDelete || len(ops) == 0 {
		ops = append(ops, admissionregistrationv1.Delete)
	}
	return ops
}

// EnforceObjectSelector is EnforceWebhook's objectSelector: the Deployments
// labelled quarantined (vocab.LabelQuarantined, which the reconciler keeps
// with the quarantine list) when the quarantine is the only enforced rule,
// so that kube-apiserver evaluates the entry's condition, and converts the
// object and the stored one for it, on no update of any other Deployment.
// An objectSelector matches an update when the stored object or the new one
// matches, so an update that removes the label is still sent. None (nil)
// when any other rule is enforced: those apply to every Deployment.
func EnforceObjectSelector(e Enforced) *metav1.LabelSelector {
	if !e.Quarantine || e.Refusals || e.Policies || e.PoliciesOnDelete || e.Bounds || e.Budgets {
		return nil
	}
	return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
		{Key: vocab.LabelQuarantined, Operator: metav1.LabelSelectorOpExists},
	}}
}

// quarantineLabelled: EnforceObjectSelector(e) matches the request.
var quarantineLabelled = "(" + quote(vocab.LabelQuarantined) + " in object.metadata.?labels.orValue({}) || " +
	"(oldObject != null && " + quote(vocab.LabelQuarantined) + " in oldObject.metadata.?labels.orValue({})))"

// allOperations are a Deployment's writes. Not to be modified.
var allOperations = []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update, admissionregistrationv1.Delete}

// MayAdviseCreate is CreateWebhook's condition: none ("") when EnforceWebhook
// takes no CREATE, so that every CREATE reaches the guard at the cost of no
// CEL evaluation; the negation of MustDecide otherwise.
func MayAdviseCreate(e Enforced) string {
	for _, op := range EnforceOperations(e) {
		if op == admissionregistrationv1.Create {
			return "!(" + MustDecide(e) + ")"
		}
	}
	return ""
}

// specChanged: a CREATE, or an update that changes the spec (the gate of
// check).
const specChanged = `(request.operation == "CREATE" || object.spec != oldObject.spec)`

// changed compares one optional field of an UPDATE's object and old object.
func changed(path string) string {
	return "(" + opt("object."+path) + " != " + opt("oldObject."+path) + ")"
}

// opt reads an optional field as an optional value, so that a missing field
// compares as missing and never errors.
func opt(path string) string {
	i := strings.LastIndex(path, ".")
	return path[:i] + ".?" + path[i+1:]
}

// subject: the request is not one the spec checks and policies skip (the
// exempt namespaces, users and groups, and the guard's own writes).
func subject(e Enforced) string {
	var not []string
	if len(e.ExemptNamespaces) > 0 {
		not = append(not, "request.namespace in "+list(e.ExemptNamespaces))
	}
	users := e.ExemptUsernames
	if e.GuardUsername != "" {
		users = append(append([]string(nil), users...), e.GuardUsername)
	}
	if len(users) > 0 {
		not = append(not, "request.userInfo.username in "+list(users))
	}
	if len(e.ExemptGroups) > 0 {
		not = append(not, "(has(request.userInfo.groups) && request.userInfo.groups.exists(g, g in "+list(e.ExemptGroups)+"))")
	}
	if len(not) == 0 {
		return "true"
	}
	return "!(" + strings.Join(not, " || ") + ")"
}

func list(xs []string) string {
	q := make([]string, len(xs))
	for i, x := range xs {
		q[i] = quote(x)
	}
	return "[" + strings.Join(q, ", ") + "]"
}

// quote is a CEL string literal: Go's quoting is a subset of CEL's.
func quote(s string) string { return strconv.Quote(s) }
