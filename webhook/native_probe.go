package webhook

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/deployguard/deployguard/webhook/native"
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

// FloorProbeFinalizer is what the probe asks for: a finalizer in the guard's
// domain that is none of its own, which deployguard-refusals refuses for
// every user but the control plane's controllers.
const FloorProbeFinalizer = "deployguard.io/floor-probe"

// floorProbeName is the probe's generated name's prefix and its label.
const floorProbeName = "deployguard-floor-probe"

// FloorProbe is the Deployment the probe creates, in a dry run only, in
// namespace. It is valid for the API server's own validation, so that
// only admission can refuse it.
func FloorProbe(namespace string) *appsv1.Deployment {
	l := map[string]string{"app.kubernetes.io/name": floorProbeName}
	zero := int32(0)
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: floorProbeName + "-", Namespace: namespace, Labels: l,
			Finalizers: []string{FloorProbeFinalizer},
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

// FloorProbeRefusal is the line deployguard-refusals refuses d with, as
// this guard evaluates it with its own params: what the API server must
// say when it enforces the policy as this guard would. "" when the guard
// would admit d.
func (o *Options) FloorProbeRefusal(ctx context.Context, d *appsv1.Deployment) string {
	req := Request{Operation: admissionv1.Create, Object: d, DryRun: true,
		UserInfo: authenticationv1.UserInfo{Username: o.GuardUsername}}
	rules, err := native.Load()
	if err != nil {
		return ""
	}
	for _, f := range rules.Evaluate(ctx, nativeRequest(req), o.NativeSettings().Params(), native.Refusals) {
		if !f.Error {
			return f.Line()
		}
	}
	return ""
}

// ProbeVerdict is what one probe found out.
type ProbeVerdict int

const (
	// ProbeUnknown: something else answered first (a transport error, RBAC,
	// another admission plugin or webhook): the probe tells nothing.
	ProbeUnknown ProbeVerdict = iota
	// ProbeEnforced: deployguard-refusals refused it, as this guard would.
	ProbeEnforced
	// ProbeNotEnforced: deployguard-refusals let it through, or refused it
	// otherwise than this guard would.
	ProbeNotEnforced
)

// JudgeFloorProbe reads the API server's answer to the probe's dry-run
// create (err; nil when admitted) against want, FloorProbeRefusal's line.
// ValidatingAdmissionPolicies are evaluated after every mutating webhook and
// before every validating one, so a refusal by this guard's validating
// webhook means the policy let the probe through; any other refusal may
// have come first.
func JudgeFloorProbe(err error, want string) (ProbeVerdict, string) {
	if err == nil {
		return ProbeNotEnforced, fmt.Sprintf("kube-apiserver admitted a dry-run create that %s refuses (a Deployment with the finalizer %s)",
			native.Refusals, FloorProbeFinalizer)
	}
	var s apierrors.APIStatus
	if !errors.As(err, &s) {
		return ProbeUnknown, "the dry-run create failed: " + err.Error()
	}
	st := s.Status()
	prefix := "ValidatingAdmissionPolicy '" + native.Refusals + "' with binding '"
	if st.Details != nil {
		for _, c := range st.Details.Causes {
			if !strings.HasPrefix(c.Message, prefix) {
				continue
			}
			_, got, _ := strings.Cut(c.Message, " denied request: ")
			if got == want {
				return ProbeEnforced, ""
			}
			return ProbeNotEnforced, fmt.Sprintf("kube-apiserver refused a dry-run create with %s's %q where this guard says %q: it evaluates the policy with other params",
				native.Refusals, got, want)
		}
	}
	if name, ok := deniedByWebhook(st.Message); ok && slices.Contains([]string{EnforceWebhook, ValidateWebhook}, name) {
		return ProbeNotEnforced, fmt.Sprintf("kube-apiserver let through to this guard's webhook %s a dry-run create that %s refuses (a Deployment with the finalizer %s)",
			name, native.Refusals, FloorProbeFinalizer)
	}
	return ProbeUnknown, "the dry-run create was answered before " + native.Refusals + " could be seen: " + st.Message
}

// deniedByWebhook is the name of the webhook that refused, from the API
// server's words: admission webhook "NAME" denied the request.
func deniedByWebhook(msg string) (string, bool) {
	rest, ok := strings.CutPrefix(msg, `admission webhook "`)
	if !ok {
		return "", false
	}
	name, _, ok := strings.Cut(rest, `" denied the request`)
	return name, ok
}

// ProbeNamespace picks where the probe can see the policy: a namespace the
// binding's namespaceSelector matches (nil matches all) that is not being
// deleted, "default" when it is one, else the first by name. "" when none is.
func ProbeNamespace(selector *metav1.LabelSelector, namespaces []metav1.PartialObjectMetadata) (string, error) {
	sel := labels.Everything()
	if selector != nil {
		s, err := metav1.LabelSelectorAsSelector(selector)
		if err != nil {
			return "", err
		}
		sel = s
	}
	var fit []string
	for i := range namespaces {
		ns := &namespaces[i]
		if ns.DeletionTimestamp != nil {
			continue
		}
		l := labels.Set(ns.Labels)
		// The API server labels every namespace with its name; a
		// namespace of the cache may predate it.
		if _, ok := l[corev1.LabelMetadataName]; !ok {
			l = labels.Merge(l, labels.Set{corev1.LabelMetadataName: ns.Name})
		}
		if sel.Matches(l) {
			fit = append(fit, ns.Name)
		}
	}
	if slices.Contains(fit, metav1.NamespaceDefault) {
		return metav1.NamespaceDefault, nil
	}
	slices.Sort(fit)
	if len(fit) == 0 {
		return "", nil
	}
	return fit[0], nil
}
