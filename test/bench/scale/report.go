package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/test/bench/load"
)

// result is everything one run measured, as bin/bench-scale.json holds it.
type result struct {
	Date           string    `json:"date"`
	Seconds        float64   `json:"seconds"`
	Namespaces     int       `json:"namespaces"`
	Revisions      int       `json:"revisions"`
	Containers     int       `json:"containers"`
	EnvVars        int       `json:"envVars"`
	MemoryLimitMiB int       `json:"memoryLimitMiB"`
	Empty          memory    `json:"empty"`
	Steps          []step    `json:"steps"`
	Restart        restarted `json:"restart"`
	Audit          audited   `json:"audit"`
	Single         bumped    `json:"single"`
	Bump           bumped    `json:"bump"`
	Kept           kept      `json:"kept"`
}

// kept counts the objects the guard writes and keeps.
type kept struct {
	// Snapshots: immutable copies of the ConfigMaps a known-good revision
	// references, in the Deployments' namespaces.
	Snapshots int `json:"snapshots"`
	// Records: restorable records of deleted Deployments, in the guard's
	// namespace (the bench deletes none: 0 unless something else did).
	Records       int `json:"records"`
	PolicyReports int `json:"policyReports"`
}

func (b *bench) kept(ctx context.Context) (kept, error) {
	var k kept
	var err error
	if k.Snapshots, err = b.count(ctx, "v1", "ConfigMapList", client.MatchingLabels{vocab.LabelSnapshot: "true"}); err != nil {
		return k, err
	}
	if k.Records, err = b.count(ctx, "v1", "ConfigMapList", client.MatchingLabels{vocab.LabelRecord: "true"}); err != nil {
		return k, err
	}
	if k.PolicyReports, err = b.count(ctx, "wgpolicyk8s.io/v1alpha2", "PolicyReportList"); err != nil {
		return k, err
	}
	return k, nil
}

func mib(n int64) string { return fmt.Sprintf("%d MiB", n>>20) }

// perDeployment is what each Deployment of the fill adds to a reading, from
// the empty cluster's.
func perDeployment(at, empty int64, n int) string {
	return fmt.Sprintf("%.1f KiB", float64(at-empty)/float64(n)/1024)
}

func round(d time.Duration) string { return d.Round(10 * time.Millisecond).String() }

func printReport(w io.Writer, r result) {
	last := r.Steps[len(r.Steps)-1]
	n := last.Deployments
	fmt.Fprintf(w, "\n%d Deployments over %d namespace(s), %d revisions each (%d ReplicaSets), %d containers × %d env vars, guard memory limit %d MiB; the run took %.0f s.\n\n",
		n, r.Namespaces, r.Revisions, last.ReplicaSets, r.Containers, r.EnvVars, r.MemoryLimitMiB, r.Seconds)
	fmt.Fprintln(w, "Admission in the guard (its histogram) and end to end (dry runs, one at a time); \"without selector\": CREATEs the mutating webhook repairs, the only ones it is called for.")
	fmt.Fprintln(w, "\n| Deployments | fill | validating CREATE p50 / p99 | validating UPDATE p50 / p99 | mutating CREATE (without selector) p50 / p99 | mutating UPDATE p50 / p99 | end to end CREATE p50 / p99 | end to end CREATE without selector p50 / p99 | end to end UPDATE p50 / p99 | guard RSS / heap in use / live heap | kube-apiserver / etcd RSS | etcd database | failed |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	fmt.Fprintf(w, "| 0 | | | | | | | | | %s / %s / %s | %s / %s | %s | |\n", mib(r.Empty.GuardRSS), mib(r.Empty.GuardHeap), mib(r.Empty.GuardLiveHeap), mib(r.Empty.APIServerRSS), mib(r.Empty.EtcdRSS), mib(r.Empty.EtcdDB))
	for _, s := range r.Steps {
		fmt.Fprintf(w, "| %d | %.0f s | %s | %s | %s | %s | %s | %s | %s | %s / %s / %s | %s / %s | %s | %d |\n",
			s.Deployments, s.FillSeconds, q(s.ValidatingCreate), q(s.ValidatingUpdate), q(s.MutatingCreate), q(s.MutatingUpdate),
			q(s.EndToEndCreate), q(s.EndToEndRepair), q(s.EndToEndUpdate), mib(s.Memory.GuardRSS), mib(s.Memory.GuardHeap), mib(s.Memory.GuardLiveHeap),
			mib(s.Memory.APIServerRSS), mib(s.Memory.EtcdRSS), mib(s.Memory.EtcdDB), s.Failed)
	}
	m, e := last.Memory, r.Empty
	rs, a, single, bump := r.Restart, r.Audit, r.Single, r.Bump
	fmt.Fprintln(w, "\n| what | result |\n|---|---|")
	rows := [][2]string{
		{fmt.Sprintf("guard after the fill, %d Deployments: RSS, heap in use; live heap after a forced GC", n),
			fmt.Sprintf("%s, %s; %s", mib(m.GuardRSS), mib(m.GuardHeap), mib(m.GuardLiveHeap))},
		{"per Deployment (with its ReplicaSets), over the empty cluster: guard live heap, guard RSS",
			fmt.Sprintf("%s, %s", perDeployment(m.GuardLiveHeap, e.GuardLiveHeap, n), perDeployment(m.GuardRSS, e.GuardRSS, n))},
		{"per Deployment, the control plane: kube-apiserver RSS, etcd RSS, etcd database",
			fmt.Sprintf("%s, %s, %s", perDeployment(m.APIServerRSS, e.APIServerRSS, n), perDeployment(m.EtcdRSS, e.EtcdRSS, n), perDeployment(m.EtcdDB, e.EtcdDB, n))},
		{fmt.Sprintf("guard restarted with %d Deployments: ready (/readyz), webhooks serving, every Deployment reconciled, audit's start-up pass over", rs.Deployments),
			fmt.Sprintf("%s, %s, %s, %s (the pass itself %.1f s at audit.rate %d/s)", round(rs.Ready), round(rs.Serving), round(rs.ReconciledAll), round(rs.AuditCaughtUp), rs.AuditPass, auditRate)},
		{"guard after the restart: RSS, heap in use; live heap", fmt.Sprintf("%s, %s; %s", mib(rs.Memory.GuardRSS), mib(rs.Memory.GuardHeap), mib(rs.Memory.GuardLiveHeap))},
		{fmt.Sprintf("one audit pass after a new policy, %d Deployments (%d failing)", a.Deployments, a.Failing),
			fmt.Sprintf("%.1f s, %.1f s of guard CPU; peak RSS %s, peak heap in use %s; live heap after %s; first namespace's PolicyReport %d bytes, %d results listed (%s omitted)",
				a.Seconds, a.CPUSeconds, mib(a.PeakRSS), mib(a.PeakHeap), mib(a.After.GuardLiveHeap), a.ReportBytes, a.Listed, orNone(a.Omitted))},
		{fmt.Sprintf("one failed rollout alone, %d others in the cache: first ImagePullBackOff to rollback (fail-fast window %s)", n+bump.Deployments, failFastWindow),
			round(single.Reaction.Median)},
		{fmt.Sprintf("image bump of %d Deployments at once (writes took %s), %d failing: first ImagePullBackOff to rollback", bump.Deployments, round(bump.Writes), bump.Failing),
			fmt.Sprintf("median %s, worst %s, best %s; deepest rollout queue %d", round(bump.Reaction.Median), round(bump.Reaction.Worst), round(bump.Reaction.Best), bump.MaxQueue)},
		{fmt.Sprintf("the same bump, %d healthy: update to known-good", bump.Deployments-bump.Failing),
			fmt.Sprintf("median %s, worst %s", round(bump.KnownGood.Median), round(bump.KnownGood.Worst))},
		{"objects the guard keeps: config snapshots, deletion records, PolicyReports",
			fmt.Sprintf("%d, %d, %d", r.Kept.Snapshots, r.Kept.Records, r.Kept.PolicyReports)},
	}
	for _, row := range rows {
		fmt.Fprintf(w, "| %s | %s |\n", row[0], row[1])
	}
}

// q is a p50 / p99 pair, or "not called" where nothing was observed.
func q(x quantiles) string {
	if x.N == 0 {
		return "not called"
	}
	return load.Millis(x.P50) + " / " + load.Millis(x.P99)
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
