package review_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/webhook/native"
	"github.com/deployguard/deployguard/webhook/origin"
	"github.com/deployguard/deployguard/webhook/review"
	"github.com/deployguard/deployguard/webhook/review/reviewtest"
)

var (
	alice = authenticationv1.UserInfo{Username: "alice", Groups: []string{"system:authenticated"}}
	guard = authenticationv1.UserInfo{Username: "system:serviceaccount:deployguard-system:deployguard"}
)

func enforceBounds(o *review.Options) { o.BoundsEnforce = true }

func beingDeleted(d *appsv1.Deployment) { d.DeletionTimestamp = &metav1.Time{} }

func TestValidate(t *testing.T) {
	other := reviewtest.Guarded(func(d *appsv1.Deployment) {
		d.Name = "web-canary"
		d.Spec.Selector.MatchLabels = map[string]string{"app.kubernetes.io/name": "web", "track": "canary"}
		d.Spec.Template.Labels = map[string]string{"app.kubernetes.io/name": "web", "track": "canary"}
	})
	failedTemplate := reviewtest.Guarded(func(d *appsv1.Deployment) { d.Spec.Template.Spec.Containers[0].Image = "nginx:broken" }).Spec.Template
	quarantinedOld := reviewtest.Guarded(func(d *appsv1.Deployment) {
		d.Annotations[vocab.AnnotationQuarantinedTemplates] = "0000," + vocab.TemplateHash(&failedTemplate)
	})

	marked := reviewtest.Guarded(func(d *appsv1.Deployment) {
		d.Spec.Selector.MatchLabels = map[string]string{native.LabelEmptySelector: native.EmptySelectorRefused}
		d.Spec.Template.Labels[native.LabelEmptySelector] = native.EmptySelectorRefused
	})

	withImage := func(d *appsv1.Deployment, image string) *appsv1.Deployment {
		d = d.DeepCopy()
		d.Spec.Template.Spec.Containers[0].Image = image
		return d
	}

	tests := []struct {
		name         string
		d, old       *appsv1.Deployment
		user         authenticationv1.UserInfo
		lister       review.OverlapSource
		opts         func(*review.Options)
		wantErrs     []string // each must appear in one error
		wantReason   string   // the check the refusal is counted under (RefusedBy); empty when wantErrs is empty
		wantWarnings []string
	}{
		{
			name: "a guarded Deployment with a probe is admitted silently",
			d:    reviewtest.Guarded(),
			user: alice,
		},
		{
			name:       "empty selector",
			d:          reviewtest.Guarded(func(d *appsv1.Deployment) { d.Spec.Selector = nil }),
			user:       alice,
			wantReason: origin.Selector,
			wantErrs:   []string{"spec.selector: Required value: an empty selector would select every pod"},
		},
		{
			name:         "an update of a Deployment that selects the mark of an unrepairable selector warns",
			d:            withImage(marked, "nginx:2"),
			old:          marked,
			user:         alice,
			wantWarnings: []string{"spec.selector: the selector is deployguard.io/empty-selector=refused, the mark of an empty selector that could not be repaired"},
		},
		{
			name:       "selector that does not select the template",
			d:          reviewtest.Guarded(func(d *appsv1.Deployment) { d.Spec.Selector.MatchLabels = map[string]string{"app": "other"} }),
			user:       alice,
			wantReason: origin.Selector,
			wantErrs:   []string{"spec.template.metadata.labels", "does not select the template's labels"},
		},
		{
			name:       "overlap: our selector selects another Deployment's pods",
			d:          reviewtest.Guarded(),
			user:       alice,
			lister:     reviewtest.Index(other),
			wantReason: origin.Overlap,
			wantErrs:   []string{`spec.selector`, `also selects the pods of Deployment "web-canary"`},
		},
		{
			name: "overlap: another selector selects our pods",
			d: reviewtest.Guarded(func(d *appsv1.Deployment) {
				d.Name = "web-2"
				d.Spec.Selector.MatchLabels = map[string]string{"app.kubernetes.io/name": "web", "track": "canary", "v": "2"}
				d.Spec.Template.Labels = map[string]string{"app.kubernetes.io/name": "web", "track": "canary", "v": "2"}
			}),
			user:       alice,
			lister:     reviewtest.Index(other),
			wantReason: origin.Overlap,
			wantErrs:   []string{`would be selected by Deployment "web-canary"`},
		},
		{
			name: "no overlap with a distinct selector",
			d: reviewtest.Guarded(func(d *appsv1.Deployment) {
				d.Spec.Selector.MatchLabels = map[string]string{"app.kubernetes.io/name": "api"}
				d.Spec.Template.Labels = map[string]string{"app.kubernetes.io/name": "api"}
			}),
			user:   alice,
			lister: reviewtest.Index(other),
		},
		{
			name:   "an overlap that predates an update only warns",
			d:      reviewtest.Guarded(func(d *appsv1.Deployment) { d.Spec.Template.Labels["extra"] = "x" }),
			old:    reviewtest.Guarded(),
			user:   alice,
			lister: reviewtest.Index(other),
			wantWarnings: []string{
				"overlap with another Deployment",
			},
		},
		{
			name: "a failing lister refuses with a retryable reason",
			d:    reviewtest.Guarded(),
			user: alice,
			lister: reviewtest.OverlapsFunc(func(context.Context, *appsv1.Deployment) ([]review.Selection, error) {
				return nil, review.ErrIndexNotSynced
			}),
			wantReason: origin.Internal,
			wantErrs:   []string{"could not look up the namespace's Deployments", "the guard has not yet seen every Deployment"},
		},
		{
			name: "maxUnavailable of every replica is refused",
			d: reviewtest.Guarded(func(d *appsv1.Deployment) {
				d.Spec.Strategy.RollingUpdate.MaxUnavailable = ptr.To(intstr.FromString("100%"))
			}),
			user:       alice,
			wantReason: origin.Strategy,
			wantErrs:   []string{"spec.strategy.rollingUpdate.maxUnavailable", "resolves to 3 of 3 replicas"},
		},
		{
			name: "maxUnavailable as a count above replicas is refused",
			d: reviewtest.Guarded(func(d *appsv1.Deployment) {
				d.Spec.Strategy.RollingUpdate.MaxUnavailable = ptr.To(intstr.FromInt32(5))
			}),
			user:       alice,
			wantReason: origin.Strategy,
			wantErrs:   []string{"resolves to 5 of 3 replicas"},
		},
		{
			name: "maxUnavailable 100% on one replica is allowed",
			d: reviewtest.Guarded(func(d *appsv1.Deployment) {
				d.Spec.Replicas = ptr.To(int32(1))
				d.Spec.Strategy.RollingUpdate.MaxUnavailable = ptr.To(intstr.FromString("100%"))
			}),
			user: alice,
		},
		{
			name: "Recreate with several replicas warns",
			d: reviewtest.Guarded(func(d *appsv1.Deployment) {
				d.Spec.Strategy = appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType}
			}),
			user:         alice,
			wantWarnings: []string{"Recreate stops all 3 replicas"},
		},
		{
			name:         "revision history above the bound warns",
			d:            reviewtest.Guarded(func(d *appsv1.Deployment) { d.Spec.RevisionHistoryLimit = ptr.To(int32(500)) }),
			user:         alice,
			wantWarnings: []string{"spec.revisionHistoryLimit: 500 is outside this cluster's bounds: keep at most 100"},
		},
		{
			name:       "revision history above the bound, bounds enforced",
			d:          reviewtest.Guarded(func(d *appsv1.Deployment) { d.Spec.RevisionHistoryLimit = ptr.To(int32(500)) }),
			user:       alice,
			opts:       enforceBounds,
			wantReason: origin.RevisionHistory,
			wantErrs:   []string{"spec.revisionHistoryLimit: Invalid value: 500 is outside this cluster's bounds: keep at most 100"},
		},
		{
			name:         "revision history of zero warns once, with the reason",
			d:            reviewtest.Guarded(func(d *appsv1.Deployment) { d.Spec.RevisionHistoryLimit = ptr.To(int32(0)) }),
			user:         alice,
			wantWarnings: []string{"spec.revisionHistoryLimit: 0 is outside this cluster's bounds: 0 keeps no old ReplicaSet once a rollout completes, so kubectl rollout undo has nothing to go back to"},
		},
		{
			name:         "progress deadline below the bound warns",
			d:            reviewtest.Guarded(func(d *appsv1.Deployment) { d.Spec.ProgressDeadlineSeconds = ptr.To(int32(5)) }),
			user:         alice,
			wantWarnings: []string{"spec.progressDeadlineSeconds: 5 is outside this cluster's bounds: set at least 30 seconds"},
		},
		{
			name:         "a long progress deadline warns: it only delays a rollback",
			d:            reviewtest.Guarded(func(d *appsv1.Deployment) { d.Spec.ProgressDeadlineSeconds = ptr.To(int32(36000)) }),
			user:         alice,
			wantWarnings: []string{"spec.progressDeadlineSeconds: 36000 is outside this cluster's bounds: set at most 7200 seconds"},
		},
		{
			name:       "progress deadline below the bound, bounds enforced",
			d:          reviewtest.Guarded(func(d *appsv1.Deployment) { d.Spec.ProgressDeadlineSeconds = ptr.To(int32(5)) }),
			user:       alice,
			opts:       enforceBounds,
			wantReason: origin.ProgressDeadline,
			wantErrs:   []string{"spec.progressDeadlineSeconds: Invalid value: 5 is outside this cluster's bounds: set at least 30 seconds"},
		},
		{
			name: "progress deadline not above minReadySeconds",
			d: reviewtest.Guarded(func(d *appsv1.Deployment) {
				d.Spec.ProgressDeadlineSeconds = ptr.To(int32(60))
				d.Spec.MinReadySeconds = 60
			}),
			user:       alice,
			wantReason: origin.ProgressDeadline,
			wantErrs:   []string{"must be greater than spec.minReadySeconds (60)"},
		},
		{
			name: "a missing readiness probe is the probes policy's to report",
			d:    reviewtest.Guarded(func(d *appsv1.Deployment) { d.Spec.Template.Spec.Containers[0].ReadinessProbe = nil }),
			user: alice,
		},
		{
			name: "every problem is reported at once",
			d: reviewtest.Guarded(func(d *appsv1.Deployment) {
				d.Spec.RevisionHistoryLimit = ptr.To(int32(500))
				d.Spec.ProgressDeadlineSeconds = ptr.To(int32(5))
				d.Spec.Strategy.RollingUpdate.MaxUnavailable = ptr.To(intstr.FromString("100%"))
			}),
			user:       alice,
			opts:       enforceBounds,
			wantReason: origin.Strategy,
			wantErrs:   []string{"spec.revisionHistoryLimit", "spec.progressDeadlineSeconds", "spec.strategy.rollingUpdate.maxUnavailable"},
		},
		{
			name: "exempt namespace skips the safety checks",
			d:    reviewtest.Guarded(func(d *appsv1.Deployment) { d.Spec.RevisionHistoryLimit = ptr.To(int32(500)) }),
			user: alice,
			opts: func(o *review.Options) { enforceBounds(o); o.ExemptNamespaces = []string{"shop"} },
		},
		{
			name: "the guard's own writes pass rules added after the Deployment was created",
			d: reviewtest.Guarded(func(d *appsv1.Deployment) {
				d.Spec.RevisionHistoryLimit = ptr.To(int32(500))
				d.Spec.Template.Spec.Containers[0].Image = "nginx:1.27.2"
			}),
			old:  reviewtest.Guarded(func(d *appsv1.Deployment) { d.Spec.RevisionHistoryLimit = ptr.To(int32(500)) }),
			user: guard,
			opts: enforceBounds,
		},
		{
			name: "a metadata-only update of a Deployment the rules now refuse passes",
			d: reviewtest.Guarded(func(d *appsv1.Deployment) {
				d.Spec.RevisionHistoryLimit = ptr.To(int32(500))
				delete(d.Annotations, vocab.AnnotationProtected)
			}),
			old: reviewtest.Guarded(func(d *appsv1.Deployment) {
				d.Spec.RevisionHistoryLimit = ptr.To(int32(500))
				d.Annotations[vocab.AnnotationProtected] = "true"
			}),
			user: alice,
			opts: enforceBounds,
		},
		{
			name:       "a spec change of such a Deployment is checked",
			d:          reviewtest.Guarded(func(d *appsv1.Deployment) { d.Spec.RevisionHistoryLimit = ptr.To(int32(400)) }),
			old:        reviewtest.Guarded(func(d *appsv1.Deployment) { d.Spec.RevisionHistoryLimit = ptr.To(int32(500)) }),
			user:       alice,
			opts:       enforceBounds,
			wantReason: origin.RevisionHistory,
			wantErrs:   []string{"spec.revisionHistoryLimit: Invalid value: 400"},
		},
		{
			// The mutating webhook puts them back and the reconciler keeps
			// them; a client that never knew them is not refused.
			name: "outside deletion, an update without the guard's finalizers is not refused",
			d:    reviewtest.Guarded(func(d *appsv1.Deployment) { d.Finalizers = nil }),
			old:  reviewtest.Guarded(),
			user: alice,
		},
		{
			name:       "while deleting, a user may not remove the guard's finalizers",
			d:          reviewtest.Guarded(beingDeleted, func(d *appsv1.Deployment) { d.Finalizers = []string{vocab.FinalizerDrain} }),
			old:        reviewtest.Guarded(beingDeleted),
			user:       alice,
			wantReason: origin.Finalizers,
			wantErrs:   []string{"metadata.finalizers: Forbidden", "being deleted", vocab.AnnotationSkipCleanup + "=true"},
		},
		{
			name:       "while deleting, a user may not reorder the guard's finalizers",
			d:          reviewtest.Guarded(beingDeleted, func(d *appsv1.Deployment) { d.Finalizers = []string{vocab.FinalizerDrain, vocab.FinalizerRecord} }),
			old:        reviewtest.Guarded(beingDeleted),
			user:       alice,
			wantReason: origin.Finalizers,
			wantErrs:   []string{"metadata.finalizers: Forbidden"},
		},
		{
			name:       "exemption does not lift the finalizer rules",
			d:          reviewtest.Guarded(beingDeleted, func(d *appsv1.Deployment) { d.Finalizers = nil }),
			old:        reviewtest.Guarded(beingDeleted),
			user:       alice,
			opts:       func(o *review.Options) { o.ExemptNamespaces = []string{"shop"} },
			wantReason: origin.Finalizers,
			wantErrs: []string{
				"metadata.finalizers: Forbidden",
			},
		},
		{
			name: "the guard removes its finalizers",
			d:    reviewtest.Guarded(beingDeleted, func(d *appsv1.Deployment) { d.Finalizers = []string{vocab.FinalizerDrain} }),
			old:  reviewtest.Guarded(beingDeleted),
			user: guard,
		},
		{
			name: "a break-glass group removes the finalizers",
			d:    reviewtest.Guarded(beingDeleted, func(d *appsv1.Deployment) { d.Finalizers = nil }),
			old:  reviewtest.Guarded(beingDeleted),
			user: authenticationv1.UserInfo{Username: "bob", Groups: []string{"platform-admins"}},
		},
		{
			name:       "an unknown cleanup step is refused with the steps there are",
			d:          reviewtest.Guarded(func(d *appsv1.Deployment) { d.Annotations[vocab.AnnotationCleanup] = "record,backup" }),
			old:        reviewtest.Guarded(),
			user:       alice,
			wantReason: origin.Finalizers,
			wantErrs:   []string{`metadata.annotations[deployguard.io/cleanup]: Invalid value: unknown cleanup step "backup"`},
		},
		{
			name:       "unknown finalizer in the guard's domain",
			d:          reviewtest.Guarded(func(d *appsv1.Deployment) { d.Finalizers = append(d.Finalizers, "deployguard.io/backup") }),
			user:       alice,
			wantReason: origin.Finalizers,
			wantErrs:   []string{`metadata.finalizers: Invalid value: "deployguard.io/backup" is not one of deployguard's finalizers`},
		},
		{
			name:       "bringing a quarantined template back is refused with the override",
			d:          reviewtest.Guarded(func(d *appsv1.Deployment) { d.Spec.Template = *failedTemplate.DeepCopy() }),
			old:        quarantinedOld,
			user:       alice,
			wantReason: origin.Quarantine,
			wantErrs:   []string{"spec.template: Forbidden", "failed its rollout before", vocab.AnnotationAllowTemplate + "=" + vocab.TemplateHash(&failedTemplate)},
		},
		{
			name: "while its rollback stands, the refusal says why the template failed",
			d:    reviewtest.Guarded(func(d *appsv1.Deployment) { d.Spec.Template = *failedTemplate.DeepCopy() }),
			old: func() *appsv1.Deployment {
				o := quarantinedOld.DeepCopy()
				o.Labels = map[string]string{vocab.LabelRolledBack: "2"}
				o.Annotations[vocab.AnnotationRollbackStatus] = "Rolled back from revision 2 (ReplicaSet web-b): 2/2 new pods ImagePullBackOff for 15s (container app, image web:2), to known-good revision 1 (ReplicaSet web-a)."
				return o
			}(),
			user:       alice,
			wantReason: origin.Quarantine,
			wantErrs:   []string{"failed its rollout before", "(deployguard: Rolled back from revision 2 (ReplicaSet web-b): 2/2 new pods ImagePullBackOff"},
		},
		{
			name: "the override lets the quarantined template back with a warning",
			d: reviewtest.Guarded(func(d *appsv1.Deployment) {
				d.Spec.Template = *failedTemplate.DeepCopy()
				d.Annotations[vocab.AnnotationAllowTemplate] = vocab.TemplateHash(&failedTemplate)
			}),
			old:          quarantinedOld,
			user:         alice,
			wantWarnings: []string{"deliberately"},
		},
		{
			name:         "quarantine in warn mode",
			d:            reviewtest.Guarded(func(d *appsv1.Deployment) { d.Spec.Template = *failedTemplate.DeepCopy() }),
			old:          quarantinedOld,
			user:         alice,
			opts:         func(o *review.Options) { o.Quarantine = review.QuarantineWarn },
			wantWarnings: []string{"failed its rollout before"},
		},
		{
			name: "removing the quarantine record in the same update does not help",
			d: reviewtest.Guarded(func(d *appsv1.Deployment) {
				d.Spec.Template = *failedTemplate.DeepCopy()
				delete(d.Annotations, vocab.AnnotationQuarantinedTemplates)
			}),
			old:        quarantinedOld,
			user:       alice,
			wantReason: origin.Quarantine,
			wantErrs:   []string{"spec.template: Forbidden"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := reviewtest.Options()
			if tt.opts != nil {
				tt.opts(o)
			}
			f := checkRequest(context.Background(), tt.d, tt.old, tt.user, o, tt.lister)
			all := f.Refusals().ToAggregate()
			assert.Equal(t, tt.wantReason, review.RefusedBy(f.Refusals()))
			if len(tt.wantErrs) == 0 {
				assert.NoError(t, all)
			} else {
				require.Error(t, all)
				for _, w := range tt.wantErrs {
					assert.Contains(t, all.Error(), w)
				}
			}
			joined := strings.Join(f.Warnings(), "\n")
			if len(tt.wantWarnings) == 0 {
				assert.Empty(t, f.Warnings())
			}
			for _, w := range tt.wantWarnings {
				assert.Contains(t, joined, w)
			}
		})
	}
}

// checkRequest runs the validating webhook's Go checks on a CREATE (old nil)
// or an UPDATE.
func checkRequest(ctx context.Context, d, old *appsv1.Deployment, user authenticationv1.UserInfo, o *review.Options, overlaps review.OverlapSource) review.Findings {
	op := admissionv1.Create
	if old != nil {
		op = admissionv1.Update
	}
	w := &review.Reviewer{Options: o, Overlaps: overlaps}
	return w.Review(ctx, review.Request{Operation: op, Object: d, OldObject: old, UserInfo: user}, review.Stage{Checks: true, Native: true}).Findings
}
