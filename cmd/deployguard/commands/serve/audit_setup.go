package serve

import (
	"context"
	"fmt"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/deployguard/deployguard/cmd/deployguard/config"
	"github.com/deployguard/deployguard/cmd/deployguard/health"
	"github.com/deployguard/deployguard/cmd/deployguard/leader"
	"github.com/deployguard/deployguard/policy"
	guardwebhook "github.com/deployguard/deployguard/webhook"
	"github.com/deployguard/deployguard/webhook/audit"
	"github.com/deployguard/deployguard/webhook/exception"
	"github.com/deployguard/deployguard/webhook/review"
)

// setupAudit runs the background audit in each leader term: one replica
// evaluates the stored Deployments and writes the reports, away from the
// admission path. Its metrics outlive the terms. budgets is the webhook's
// budget index, with its overlap index: the audit looks candidates up there,
// and marks those of a changed Deployment or budget for a new audit.
func setupAudit(mgr ctrl.Manager, pr *health.Probes, terms *leader.Terms, cfg config.Config, opts *review.Options, eng *policy.Engine, budgets *review.BudgetIndex, exceptions *exception.Index, ignored []string) error {
	am, err := audit.NewMetrics(metrics.Registry)
	if err != nil {
		return err
	}
	// Shown in /readyz?verbose on the leader, which writes the reports.
	status := &audit.Status{}
	pr.AddReadyzNote("audit", status.Note)
	ev := &audit.Evaluator{Options: opts, Engine: eng, NamespaceLabels: guardwebhook.CacheNamespaceLabels(mgr.GetClient()),
		Overlaps: budgets.Deployments, Budgets: budgets}
	if exceptions != nil {
		ev.Exceptions = exceptions
	}
	// The cache's Deployments lack their pod templates and trimmed
	// annotations: the audit judges them as the API server has them, through
	// a reader of its own, so that a full pass's reads never wait behind (or
	// hold up) the reconciler's on a client-side limit. Made once: its
	// transport serves every term, as the process's own clients do.
	reader, err := client.New(mgr.GetConfig(), client.Options{Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper()})
	if err != nil {
		return fmt.Errorf("the audit's API reader: %w", err)
	}
	terms.Setup = append(terms.Setup, func(_ context.Context, lm ctrl.Manager) error {
		r := &audit.Runner{
			Client: lm.GetClient(), Cache: lm.GetCache(), Evaluator: ev, Metrics: am,
			APIReader: reader,
			Options: audit.Options{
				Period: cfg.Audit.Period.Duration, Rate: cfg.Audit.Rate, Format: cfg.Audit.ReportFormat,
				IgnoredNamespaces: ignored,
			},
			Log:    ctrl.Log.WithName("audit"),
			Status: status,
		}
		if err := lm.Add(r); err != nil {
			return fmt.Errorf("adding the audit: %w", err)
		}
		return nil
	})
	return nil
}
