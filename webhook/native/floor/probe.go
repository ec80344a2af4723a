package floor

import (
	"context"
	"errors"
	"fmt"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nativeconfig "github.com/deployguard/deployguard/config/native"
	"github.com/deployguard/deployguard/webhook/native"
	"github.com/deployguard/deployguard/webhook/review"
	"github.com/deployguard/deployguard/webhook/routing"
)

// The floor probe. The objects that make up the native refusals (the
// policy, its binding, its params) can all be there and current while
// kube-apiserver does not enforce them: it stops reading a ConfigMap
// paramKind for good once no binding names it, and does not read it again
// when the binding comes back, so the policy then finds no params and, by
// parameterNotFoundAction: Allow, admits everything
// (kubernetes/kubernetes#130887). Only the API server's answer tells: a
// dry-run create of a Deployment that deployguard-refusals refuses for
// every user, whatever its params say.

// Probe asks kube-apiserver itself whether it enforces
// deployguard-refusals: a dry-run create (through w) of ProbeDeployment in
// o.NativeProbeNamespace, which must be a namespace the refusals' binding
// applies to, whose answer JudgeProbe reads. Everything else is read
// through r, uncached: it also runs before the guard's caches start.
// PoliciesEnforced reads the objects; this reads the behaviour, which
// can differ, as said above.
func Probe(ctx context.Context, r client.Reader, w client.Client, o *review.Options) (ProbeVerdict, string) {
	// The binding that takes the probe, a create: the one for creates where
	// the refusals' own does not. deployguard-selector labels the probe
	// (its finalizer is in the guard's domain) as every create the policy
	// refuses, so the label stands for them; any other label does not.
	b := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
	if err := r.Get(ctx, client.ObjectKey{Name: native.Refusals}, b); err != nil {
		return ProbeUnknown, "reading ValidatingAdmissionPolicyBinding " + native.Refusals + ": " + err.Error()
	}
	if !bindsOperation(b, admissionregistrationv1.Create) {
		b = &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
		if err := r.Get(ctx, client.ObjectKey{Name: native.RefusalsCreateBinding}, b); err != nil {
			return ProbeUnknown, "reading ValidatingAdmissionPolicyBinding " + native.RefusalsCreateBinding + ": " + err.Error()
		}
	}
	var nsSelector *metav1.LabelSelector
	if mr := b.Spec.MatchResources; mr != nil {
		if _, other := createsSelected(b); other || b.Name == native.Refusals && mr.ObjectSelector != nil &&
			(len(mr.ObjectSelector.MatchLabels) > 0 || len(mr.ObjectSelector.MatchExpressions) > 0) {
			return ProbeUnknown, "ValidatingAdmissionPolicyBinding " + b.Name + " selects Deployments by their labels: no probe can stand for them"
		}
		nsSelector = mr.NamespaceSelector
	}
	name := o.NativeProbeNamespace
	if name == "" {
		name = metav1.NamespaceDefault
	}
	ns := &metav1.PartialObjectMetadata{}
	ns.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Namespace"))
	if err := r.Get(ctx, client.ObjectKey{Name: name}, ns); err != nil {
		return ProbeUnknown, "reading namespace " + name + " (nativePolicies.probeNamespace): " + err.Error()
	}
	switch applies, err := BindingApplies(nsSelector, ns); {
	case err != nil:
		return ProbeUnknown, "ValidatingAdmissionPolicyBinding " + b.Name + "'s namespaceSelector: " + err.Error()
	case !applies:
		return ProbeUnknown, "namespace " + name + " (nativePolicies.probeNamespace) is being deleted, or is not one ValidatingAdmissionPolicyBinding " +
			b.Name + " applies to: set nativePolicies.probeNamespace to one it does"
	}
	d := ProbeDeployment(name)
	want := o.FloorProbeRefusal(ctx, d)
	if want == "" {
		return ProbeUnknown, "this guard would admit the probe itself"
	}
	// The params' resourceVersion, read before and after the probe, to
	// compare with the one the policy read.
	paramsRV := func() string {
		params := &metav1.PartialObjectMetadata{}
		params.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("ConfigMap"))
		if r.Get(ctx, client.ObjectKey{Namespace: paramsNamespace(b), Name: nativeconfig.ParamsName}, params) != nil {
			return ""
		}
		return params.ResourceVersion
	}
	before := paramsRV()
	answer := w.Create(ctx, d, client.DryRunAll)
	return JudgeProbe(answer, want, before, paramsRV(), func(hook string) bool {
		if hook == routing.EnforceWebhook || hook == routing.CreateWebhook || hook == routing.UpdateWebhook || hook == routing.PreviousUpdateWebhook || hook == routing.ValidateWebhook {
			return true
		}
		// Names are unique only within a configuration: a name that a
		// mutating webhook has too could have refused before the policy.
		var mutating admissionregistrationv1.MutatingWebhookConfigurationList
		var validating admissionregistrationv1.ValidatingWebhookConfigurationList
		if r.List(ctx, &mutating) != nil || r.List(ctx, &validating) != nil {
			return false
		}
		for _, c := range mutating.Items {
			for _, wh := range c.Webhooks {
				if wh.Name == hook {
					return false
				}
			}
		}
		for _, c := range validating.Items {
			for _, wh := range c.Webhooks {
				if wh.Name == hook {
					return true
				}
			}
		}
		return false
	})
}

// paramsNamespace is where b reads its params ConfigMap.
func paramsNamespace(b *admissionregistrationv1.ValidatingAdmissionPolicyBinding) string {
	if b.Spec.ParamRef != nil {
		return b.Spec.ParamRef.Namespace
	}
	return ""
}

// ProbeFinalizer is what the probe asks for: a finalizer in the guard's
// domain that is none of its own, which deployguard-refusals refuses for
// every user but the control plane's controllers.
const ProbeFinalizer = "deployguard.io/floor-probe"

// probeName is the probe's generated name's prefix and its label.
const probeName = "deployguard-floor-probe"

// ProbeDeployment is the Deployment the probe creates, in a dry run only, in
// namespace. It is valid for the API server's own validation, so that
// only admission can refuse it.
func ProbeDeployment(namespace string) *appsv1.Deployment {
	l := map[string]string{"app.kubernetes.io/name": probeName}
	zero := int32(0)
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: probeName + "-", Namespace: namespace, Labels: l,
			Finalizers: []string{ProbeFinalizer},
		},
		Spec: appsv1.DeploymentSpec{
			Replicas: &zero,
			Selector: &metav1.LabelSelector{MatchLabels: l},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: l},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "probe", Image: "deployguard.invalid/floor-probe"}}},
			},
		},
	}
}

// ProbeVerdict is what one probe found out.
type ProbeVerdict int

const (
	// ProbeUnknown: something that runs before the policy answered (a
	// transport error, RBAC, a mutating webhook, the namespace), or the
	// probe could not be sent: it tells nothing.
	ProbeUnknown ProbeVerdict = iota
	// ProbeEnforced: deployguard-refusals refused it.
	ProbeEnforced
	// ProbeNotEnforced: deployguard-refusals let it through: it was
	// admitted, or reached what runs after the policy.
	ProbeNotEnforced
)

// ProbeConfirmations is how many probes in a row must find the
// refusals enforced before a replica that found them not enforced, or
// found their objects missing or changed, leaves them to the API server
// again: one refusal right after a change may be a moment's. (The probes
// share the replica's connection, so they reach the kube-apiserver it
// talks to, not each of several.)
const ProbeConfirmations = 3

// JudgeProbe reads the API server's answer to the probe's dry-run
// create (err; nil when admitted). The admission chain stops at its first
// refusal, and runs mutating webhooks, then ValidatingAdmissionPolicies,
// then validating webhooks, then ResourceQuota: a refusal by the policy
// says it is enforced (in whatever words: its finalizer rule reads no
// params, and without params the policy does not run at all); a refusal by,
// or a failed call to, a validating webhook (validating says which names
// are) or a quota says the policy let the probe through. Anything else came
// first, or from elsewhere. why says what was seen.
//
// The policy's refusal of the probe names the resourceVersion of the params
// it read; before and after, when known, are the params ConfigMap's own,
// read before and after the probe: a kube-apiserver that stopped reading
// the params keeps evaluating an older one. Params written during the
// probe tell nothing.
func JudgeProbe(err error, want, before, after string, validating func(name string) bool) (ProbeVerdict, string) {
	if err == nil {
		return ProbeNotEnforced, fmt.Sprintf("kube-apiserver admitted a dry-run create that %s refuses (a Deployment with the finalizer %s)",
			native.Refusals, ProbeFinalizer)
	}
	var s apierrors.APIStatus
	if !errors.As(err, &s) {
		return ProbeUnknown, "the dry-run create failed: " + err.Error()
	}
	st := s.Status()
	lines := []string{st.Message}
	if st.Details != nil {
		for _, c := range st.Details.Causes {
			lines = append(lines, c.Message)
		}
	}
	for _, l := range lines {
		if i, by := refusedBy(l); i >= 0 {
			got, rv, named := paramsVersion(l[i+len(by):])
			switch {
			case !named || after == "" || rv == after:
			case before != after:
				return ProbeUnknown, fmt.Sprintf("ConfigMap %s was written during the probe (resourceVersion %q, then %q)", nativeconfig.ParamsName, before, after)
			default:
				return ProbeNotEnforced, fmt.Sprintf("kube-apiserver evaluates %s with params at resourceVersion %q, while ConfigMap %s is at %q: "+
					"it no longer reads them", native.Refusals, rv, nativeconfig.ParamsName, after)
			}
			if w, _, _ := paramsVersion(want); got != w {
				return ProbeEnforced, fmt.Sprintf("%s refused the probe in other words than this guard's: %q, not %q", native.Refusals, got, w)
			}
			return ProbeEnforced, ""
		}
	}
	if name, failed, ok := webhookOf(st.Message); ok && validating(name) {
		what := "refused"
		if failed {
			what = "was called for"
		}
		return ProbeNotEnforced, fmt.Sprintf("the validating webhook %s %s a dry-run create that %s refuses (a Deployment with the finalizer %s): "+
			"kube-apiserver calls validating webhooks only after the policy admitted the request", name, what, native.Refusals, ProbeFinalizer)
	}
	if strings.Contains(st.Message, "exceeded quota: ") {
		return ProbeNotEnforced, fmt.Sprintf("a ResourceQuota refused a dry-run create that %s refuses (a Deployment with the finalizer %s): "+
			"kube-apiserver checks quotas only after the policy admitted the request", native.Refusals, ProbeFinalizer)
	}
	return ProbeUnknown, "the dry-run create was answered before " + native.Refusals + " could be seen: " + st.Message
}

// refusedBy finds where, in line, deployguard-refusals refused, through
// either of its bindings (the probe is a create: the one for creates,
// or the one for every operation of an earlier layout), and the words
// before its message; -1 when it did not.
func refusedBy(line string) (int, string) {
	for _, binding := range []string{native.RefusalsCreateBinding, native.Refusals} {
		by := "ValidatingAdmissionPolicy '" + native.Refusals + "' with binding '" + binding + "' denied request: "
		if i := strings.Index(line, by); i >= 0 {
			return i, by
		}
	}
	return -1, ""
}

// paramsVersion splits the probe's refusal into its words and the params'
// resourceVersion it names: "… (params RV)".
func paramsVersion(line string) (words, rv string, named bool) {
	const mark = " (params "
	i := strings.LastIndex(line, mark)
	if i < 0 || !strings.HasSuffix(line, ")") {
		return line, "", false
	}
	return line[:i], line[i+len(mark) : len(line)-1], true
}

// webhookOf is the webhook the API server's words name: one that refused
// (admission webhook "NAME" denied the request) or whose call failed
// (failed calling webhook "NAME").
func webhookOf(msg string) (name string, failed, ok bool) {
	for _, m := range []struct {
		prefix string
		failed bool
	}{{`admission webhook "`, false}, {`failed calling webhook "`, true}} {
		if _, rest, found := strings.Cut(msg, m.prefix); found {
			if name, _, found := strings.Cut(rest, `"`); found {
				return name, m.failed, true
			}
		}
	}
	return "", false, false
}

// Enforced is one check's finding from its probe's verdict v and the
// last conclusive verdict: a probe that cannot tell keeps the last
// conclusive one (a blip of the API server, or of the guard's own webhook,
// must not hand the refusals back to an API server that does not enforce
// them), and with none yet the objects' finding, enforced, stands.
func Enforced(v, lastConclusive ProbeVerdict) (enforced bool, conclusive ProbeVerdict) {
	if v == ProbeUnknown {
		v = lastConclusive
	}
	return v != ProbeNotEnforced, v
}

// BindingApplies reports whether a binding whose namespaceSelector is
// selector (nil: every namespace) applies to ns, and ns is not being
// deleted (no create is admitted there).
func BindingApplies(selector *metav1.LabelSelector, ns *metav1.PartialObjectMetadata) (bool, error) {
	if ns.DeletionTimestamp != nil {
		return false, nil
	}
	sel := labels.Everything()
	if selector != nil {
		s, err := metav1.LabelSelectorAsSelector(selector)
		if err != nil {
			return false, err
		}
		sel = s
	}
	l := labels.Set(ns.Labels)
	// The API server labels every namespace with its name, which the
	// shipped selector reads.
	if _, ok := l[corev1.LabelMetadataName]; !ok {
		l = labels.Merge(l, labels.Set{corev1.LabelMetadataName: ns.Name})
	}
	return sel.Matches(l), nil
}
