package main

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/test/bench/load"
	"github.com/deployguard/deployguard/test/harness"
)

// restarted is what a restarted guard took, each time from its start.
type restarted struct {
	Deployments int `json:"deployments"`
	// Ready: /readyz answers 200 (caches synced, overlap index built).
	Ready time.Duration `json:"readyNs"`
	// Serving: the API server's first admission through the guard's
	// webhooks succeeds.
	Serving       time.Duration `json:"webhooksServingNs"`
	ReconciledAll time.Duration `json:"reconciledAllNs"`
	// AuditCaughtUp: the audit's start-up pass over every Deployment ended
	// (its pace is audit.rate).
	AuditCaughtUp time.Duration `json:"auditCaughtUpNs"`
	AuditPass     float64       `json:"auditPassSeconds"`
	Memory        memory        `json:"memory"`
}

// replaceGuard stops the guard (SIGTERM, as a rolling update does) and
// starts a new one on the same webhook port with the bench's memory limit;
// it returns when the new process was started.
func (b *bench) replaceGuard() (time.Time, error) {
	port := b.l.Guard.Opts.WebhookPort
	if err := b.l.Guard.Stop(); err != nil {
		return time.Time{}, err
	}
	start := time.Now()
	// Of two values of one variable a process gets the later (os/exec
	// keeps the last).
	env := append(harness.DeployedRuntimeEnv(), fmt.Sprintf("DEPLOYGUARD_MEMORY_LIMIT=%d", b.o.memoryLimitMiB<<20))
	g, err := harness.StartGuard(harness.GuardOptions{
		Binary: b.o.guard, Kubeconfig: b.l.GuardKubeconfig, WorkDir: filepath.Join(b.l.Opts.WorkDir, "guard"),
		WebhookPort: port, Env: env, Output: b.l.Opts.Log, ExtraArgs: b.l.Opts.GuardArgs,
	})
	if err != nil {
		return start, err
	}
	b.l.Guard = g
	return start, nil
}

// restartGuard replaces the guard and waits until the API server reaches it.
func (b *bench) restartGuard(ctx context.Context) error {
	if _, err := b.replaceGuard(); err != nil {
		return err
	}
	if err := b.l.Guard.WaitReady(ctx, 10*time.Minute); err != nil {
		return err
	}
	return harness.WaitForWebhooks(ctx, b.l.Client, "default", 5*time.Minute)
}

// restart restarts the guard at the largest size and times it: ready,
// serving, every Deployment reconciled once, the audit's start-up pass over.
func (b *bench) restart(ctx context.Context) (restarted, error) {
	r := restarted{Deployments: b.created}
	fmt.Printf("Restarting the guard with %d Deployments in the cluster …\n", b.created)
	start, err := b.replaceGuard()
	if err != nil {
		return r, err
	}
	g := b.l.Guard
	if err := g.WaitReady(ctx, 10*time.Minute); err != nil {
		return r, err
	}
	r.Ready = time.Since(start)
	if err := harness.WaitForWebhooks(ctx, b.l.Client, "default", 5*time.Minute); err != nil {
		return r, err
	}
	r.Serving = time.Since(start)
	full := map[string]string{"scope": "full"}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 60*time.Minute, true, func(ctx context.Context) (bool, error) {
		m, err := load.Scrape(g)
		if err != nil {
			return false, nil
		}
		// The first list queues every Deployment once (the queue folds the
		// ReplicaSet events of a queued Deployment into it): done when as
		// many reconciles as Deployments have run and nothing is queued.
		if r.ReconciledAll == 0 && m.Sum("controller_runtime_reconcile_total", map[string]string{"controller": "deployguard-rollout"}) >= float64(b.created) &&
			m.Sum("workqueue_depth", map[string]string{"name": "deployguard-rollout"}) == 0 {
			r.ReconciledAll = time.Since(start)
		}
		if h := m.Histogram("deployguard_audit_pass_duration_seconds", full); r.AuditCaughtUp == 0 && h.Count > 0 {
			r.AuditCaughtUp, r.AuditPass = time.Since(start), h.Sum
		}
		return r.ReconciledAll > 0 && r.AuditCaughtUp > 0, nil
	})
	if err != nil {
		return r, fmt.Errorf("waiting for every Deployment to be reconciled and audited after the restart: %w", err)
	}
	r.Memory = b.memory(ctx, "restarted")
	fmt.Printf("  ready after %s, serving after %s, every Deployment reconciled after %s, audited after %s\n",
		r.Ready.Round(100*time.Millisecond), r.Serving.Round(100*time.Millisecond), r.ReconciledAll.Round(100*time.Millisecond), r.AuditCaughtUp.Round(100*time.Millisecond))
	return r, nil
}

// auditRate is the default config's audit.rate, which the bench measures.
const auditRate = 200

// audited is one audit pass over every Deployment after a policy change.
type audited struct {
	Deployments int `json:"deployments"`
	// Seconds and CPUSeconds: from a new policy's ConfigMap to its results
	// on every Deployment, and the guard's CPU meanwhile.
	Seconds    float64 `json:"seconds"`
	CPUSeconds float64 `json:"guardCpuSeconds"`
	// PeakRSS and PeakHeap: the guard's highest meanwhile, sampled every
	// half second; After: its memory once the pass is over.
	PeakRSS  int64  `json:"peakRssBytes"`
	PeakHeap int64  `json:"peakHeapInuseBytes"`
	After    memory `json:"after"`
	Failing  int    `json:"failing"`
	// The report of the first namespace, as stored (its JSON is what etcd
	// stores for a custom resource).
	ReportBytes int            `json:"reportBytes"`
	Listed      int            `json:"resultsListed"`
	Omitted     string         `json:"omittedResults"`
	Summary     map[string]any `json:"summary"`
}

// auditPass loads a policy, in audit mode, that every Deployment fails, and
// measures until the audit's results count every one of them.
func (b *bench) auditPass(ctx context.Context) (audited, error) {
	a := audited{Deployments: b.created}
	g := b.l.Guard
	fmt.Printf("Auditing %d Deployments after a policy change …\n", b.created)
	before, err := load.Scrape(g)
	if err != nil {
		return a, err
	}
	owner := map[string]string{"policy": "deployguard.benchowner", "result": "fail"}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "bench-audit-policy", Namespace: harness.GuardNamespace, Labels: map[string]string{vocab.LabelPolicy: "true"}},
		Data: map[string]string{"owner.rego": `# METADATA
# custom:
#   mode: audit
#   severity: medium
#   category: Ownership
package deployguard.benchowner

deny contains {"msg": "every Deployment needs an owner label", "field": "metadata.labels.owner"} if {
	not input.object.metadata.labels.owner
}
`},
	}
	peaks := b.watchPeaks()
	created := time.Now()
	if err := b.c.Create(ctx, cm); err != nil {
		peaks.end()
		return a, err
	}
	var after load.Metrics
	// Done when the audit counts a failure of the new policy on every
	// Deployment: polled each 250 ms, hot reload included.
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 60*time.Minute, false, func(context.Context) (bool, error) {
		m, err := load.Scrape(g)
		if err != nil {
			return false, nil
		}
		after = m
		return int(m.Sum("deployguard_audit_results", owner)) >= b.created, nil
	})
	a.PeakRSS, a.PeakHeap, _ = peaks.end()
	if err != nil {
		return a, fmt.Errorf("waiting for the audit to fail every Deployment on the new policy: %w", err)
	}
	a.Seconds = time.Since(created).Seconds()
	a.Failing = int(after.Sum("deployguard_audit_results", owner))
	a.CPUSeconds = after.Sum("process_cpu_seconds_total", nil) - before.Sum("process_cpu_seconds_total", nil)
	a.After = b.memory(ctx, "audited")
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("wgpolicyk8s.io/v1alpha2")
	u.SetKind("PolicyReport")
	if err := b.c.Get(ctx, client.ObjectKey{Namespace: b.namespace(0), Name: "deployguard"}, u); err != nil {
		return a, fmt.Errorf("reading the namespace's PolicyReport: %w", err)
	}
	raw, err := json.Marshal(u.Object)
	if err != nil {
		return a, err
	}
	a.ReportBytes = len(raw)
	results, _, _ := unstructured.NestedSlice(u.Object, "results")
	a.Listed = len(results)
	a.Summary, _, _ = unstructured.NestedMap(u.Object, "summary")
	a.Omitted = u.GetAnnotations()["deployguard.io/omitted-results"]
	return a, nil
}
