// Package webhook serves deployguard's admission webhooks over HTTP: the
// mutating webhook of apps/v1 Deployments, which fills in the cluster's
// defaults and the guard's finalizers; the validating webhook, which refuses
// dangerous specs; the status webhook that ends a rollback's verdict; and the
// validating webhook of PodDisruptionBudgets. Each decodes its request, has
// the review (package review) judge it, and translates what it found into an
// AdmissionResponse. The controllers that route the guard's own webhook
// configurations (routing*.go) and check that the API server enforces the
// native floor (native_*.go) live here too.
package webhook

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/deployguard/deployguard/webhook/boundedlog"
	"github.com/deployguard/deployguard/webhook/review"
)

// Paths the webhooks are served at; config/webhook uses the same.
const (
	MutatePath   = "/mutate-apps-v1-deployment"
	ValidatePath = "/validate-apps-v1-deployment"
)

// Hooks are the guard's admission webhooks, served over HTTP: the mutating
// and validating webhooks of Deployments, the status webhook that ends the
// rollback verdict, and the validating webhook of PodDisruptionBudgets. Each
// decodes its request, has the Reviewer judge it, and translates what it
// found into an AdmissionResponse.
type Hooks struct {
	Reviewer *review.Reviewer
	// ServeVerdicts serves the status webhook that ends the rollback verdict
	// (VerdictPath).
	ServeVerdicts bool
	// BodyTimeout bounds how long each webhook request's body may take to
	// arrive; zero is DefaultBodyTimeout.
	BodyTimeout time.Duration
}

// Handlers returns the mutating and validating handlers, instrumented, ready to
// be registered on a webhook server or called in-process.
func (h *Hooks) Handlers(m *Metrics) (mutating, validating *Endpoint) {
	mutating = &Endpoint{Webhook: newWebhook(instrument("mutating", deploymentKind, mutator{reviewer: h.Reviewer}.handle, m)), Deployments: true, BodyTimeout: h.BodyTimeout}
	validating = &Endpoint{Webhook: newWebhook(instrument("validating", deploymentKind, validator{reviewer: h.Reviewer}.handle, m)),
		Deployments: true, SkipCreatePodSpec: true, SkipManagedFields: true, BodyTimeout: h.BodyTimeout}
	return mutating, validating
}

// VerdictHandler returns the status webhook's handler (see verdict),
// instrumented.
func (h *Hooks) VerdictHandler(m *Metrics) *Endpoint {
	return &Endpoint{Webhook: newWebhook(neverRefuse(instrument("verdict", deploymentKind, verdict{}.handle, m))),
		Deployments: true, BodyTimeout: h.BodyTimeout}
}

// newWebhook serves h as controller-runtime does, every line it logs
// bounded (boundedlog): the request's strings are the client's.
func newWebhook(h admission.Handler) *admission.Webhook {
	return &admission.Webhook{Handler: h, LogConstructor: boundedlog.Constructor}
}

// neverRefuse admits, unchanged, whatever next refuses or fails on
// (counted and logged by instrument): the API server takes a webhook's
// refusal as final whatever its failurePolicy, and a status write refused
// would stop the Deployment controller's rollout of that Deployment.
func neverRefuse(next admission.Handler) admission.Handler {
	return admission.HandlerFunc(func(ctx context.Context, req admission.Request) (resp admission.Response) {
		defer func() {
			// The Webhook would answer a panic with an error: a refusal.
			if p := recover(); p != nil {
				ctrl.LoggerFrom(ctx).Error(fmt.Errorf("%v", p), "Panic in the verdict webhook; the status write is admitted unchanged")
				resp = admission.Allowed("")
			}
		}()
		if resp = next.Handle(ctx, req); resp.Allowed {
			return resp
		}
		return admission.Allowed("")
	})
}

// SetupWithManager registers both webhooks on the manager's webhook server,
// each through wrap when it is set (serve's closes kept-alive connections
// while it stops). serve and the integration tier both set them up here.
func (h *Hooks) SetupWithManager(mgr ctrl.Manager, m *Metrics, wrap func(http.Handler) http.Handler) {
	mutating, validating := h.Handlers(m)
	if wrap == nil {
		wrap = func(h http.Handler) http.Handler { return h }
	}
	srv := mgr.GetWebhookServer()
	srv.Register(MutatePath, wrap(mutating))
	srv.Register(ValidatePath, wrap(validating))
	if h.ServeVerdicts {
		srv.Register(VerdictPath, wrap(h.VerdictHandler(m)))
	}
	if h.Reviewer.Budgets != nil {
		srv.Register(BudgetPath, wrap(&Endpoint{Webhook: h.BudgetHandler(m), BodyTimeout: h.BodyTimeout}))
	}
}

// admittedKind is the one kind a webhook admits, and its name in messages.
type admittedKind struct {
	gvk  metav1.GroupVersionKind
	name string
}

var (
	deploymentKind = admittedKind{metav1.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"}, "apps/v1 Deployments"}
	budgetKind     = admittedKind{metav1.GroupVersionKind{Group: "policy", Version: "v1", Kind: "PodDisruptionBudget"}, "policy/v1 PodDisruptionBudgets"}
)

// instrument refuses what is not of the webhook's kind before decoding, counts and times
// every admission, and logs every refusal with its reason. next answers a
// request and says why it refused (reasonNone when it did not).
//
// What the request holds is the client's choice: it is counted under labels
// of a fixed set (Metrics.observe), logged through the bounded logger the
// Webhook puts in ctx (boundedlog), and kept nowhere.
func instrument(name string, kind admittedKind, next func(context.Context, admission.Request) (admission.Response, string), m *Metrics) admission.Handler {
	return admission.HandlerFunc(func(ctx context.Context, req admission.Request) admission.Response {
		start := time.Now()

		var (
			resp   admission.Response
			reason string
		)
		switch {
		case req.Operation == "" && req.Kind == (metav1.GroupVersionKind{}):
			resp, reason = malformed(fmt.Errorf("the body holds no AdmissionReview request"))
		case req.Kind != kind.gvk:
			// The kind is the client's: echoed cut, as it is logged.
			resp, reason = malformed(fmt.Errorf("deployguard admits %s only here, got %s", kind.name, boundedlog.String(gvkString(req.Kind))))
		case operationLabel(req.Operation) == operationUnknown:
			// No API server sends it: the webhook configurations name
			// their operations.
			resp, reason = malformed(fmt.Errorf("the request's operation is none of CREATE, UPDATE, DELETE, CONNECT"))
		case req.Operation != admissionv1.Delete && len(req.Object.Raw) == 0:
			resp, reason = malformed(fmt.Errorf("the request carries no object to admit"))
		case req.Operation == admissionv1.Update && len(req.OldObject.Raw) == 0,
			req.Operation == admissionv1.Delete && len(req.OldObject.Raw) == 0:
			resp, reason = malformed(fmt.Errorf("the %s request carries no oldObject", req.Operation))
		default:
			resp, reason = next(ctx, req)
		}

		m.observe(name, req.Operation, resultOf(resp), reason, time.Since(start))
		if !resp.Allowed {
			status, msg := "", ""
			if resp.Result != nil {
				status, msg = string(resp.Result.Reason), resp.Result.Message
			}
			boundedlog.Logger(ctrl.LoggerFrom(ctx)).Info("refused", "webhook", name, "operation", req.Operation,
				strings.ToLower(kind.gvk.Kind), klog.KRef(req.Namespace, req.Name), "user", req.UserInfo.Username, "uid", req.UID,
				"reason", reason, "message", msg, "statusReason", status, "code", codeOf(resp), "dryRun", req.DryRun != nil && *req.DryRun)
		}
		return resp
	})
}

func gvkString(k metav1.GroupVersionKind) string {
	if k.Kind == "" {
		return "no kind"
	}
	return fmt.Sprintf("%s/%s %s", k.Group, k.Version, k.Kind)
}

func resultOf(r admission.Response) string {
	switch {
	case !r.Allowed && codeOf(r) >= 400 && codeOf(r) != http.StatusForbidden && codeOf(r) != http.StatusUnprocessableEntity:
		return "error"
	case !r.Allowed:
		return "denied"
	case len(r.Patches) > 0:
		return "patched"
	default:
		return "allowed"
	}
}

func codeOf(r admission.Response) int32 {
	if r.Result == nil {
		return 0
	}
	return r.Result.Code
}

// CacheNamespaceLabels reads a namespace's labels from the manager's cache, for
// the policies' input.namespaceLabels.
func CacheNamespaceLabels(r client.Reader) func(ctx context.Context, namespace string) (map[string]string, error) {
	return func(ctx context.Context, namespace string) (map[string]string, error) {
		ns := &metav1.PartialObjectMetadata{}
		ns.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Namespace"))
		if err := r.Get(ctx, client.ObjectKey{Name: namespace}, ns); err != nil {
			return nil, err
		}
		return ns.Labels, nil
	}
}
