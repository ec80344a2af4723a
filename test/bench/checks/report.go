package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/deployguard/deployguard/reconciler/rollout"
	"github.com/deployguard/deployguard/test/bench/load"
)

// results is everything one run measured.
type results struct {
	Seconds          float64 `json:"seconds"`
	CreateSeconds    float64 `json:"createSeconds"`
	BumpWriteSeconds float64 `json:"bumpWriteSeconds"`
	// AllInBakeSeconds: from the bump to every healthy revision 2 in its
	// bake window (or past it: BakedBeforeAllInBake of them).
	AllInBakeSeconds     float64 `json:"allInBakeSeconds"`
	BakedBeforeAllInBake int     `json:"bakedBeforeAllInBake"`
	// BumpSeconds: from the bump to every revision 2 decided.
	BumpSeconds     float64       `json:"bumpSeconds"`
	NoCheck         mem           `json:"noCheck"`
	Checked         mem           `json:"checked"`
	Queries         queries       `json:"queries"`
	StandIn         rate          `json:"standIn"`
	Queue           queue         `json:"queue"`
	Reconciles      float64       `json:"reconciles"`
	GuardCPUSeconds float64       `json:"guardCpuSeconds"`
	GuardReaction   time.Duration `json:"guardReactionP50Ns"`
	GuardReaction90 time.Duration `json:"guardReactionP90Ns"`
	// Throttled: the guard's goroutines waiting in client-go's client-side
	// rate limiter, sampled from its goroutine dump during the bump.
	Throttled throttled `json:"throttled"`
	Ledgers   ledgers   `json:"ledgers"`
	Reaction  reaction  `json:"reaction"`
}

type mem struct {
	RSS  int64 `json:"rssBytes"`
	Heap int64 `json:"heapInuseBytes"`
	Live int64 `json:"liveHeapBytes"`
}

// queries are the guard's own counts over the bump.
type queries struct {
	Measurements float64            `json:"measurements"`
	ByPhase      map[string]float64 `json:"byPhase"`
	Delayed      float64            `json:"delayed"`
}

func queriesFrom(before, after load.Metrics) queries {
	q := queries{ByPhase: map[string]float64{}}
	q.Measurements = after.Sum("deployguard_check_measurements_total", nil) - before.Sum("deployguard_check_measurements_total", nil)
	for _, p := range []string{"Successful", "Failed", "Inconclusive", "Error"} {
		l := map[string]string{"phase": p}
		q.ByPhase[p] = after.Sum("deployguard_check_measurements_total", l) - before.Sum("deployguard_check_measurements_total", l)
	}
	q.Delayed = after.Sum("deployguard_check_measurements_delayed_total", nil) - before.Sum("deployguard_check_measurements_delayed_total", nil)
	return q
}

// queue is the reconcile queue during the bump, sampled every 2 s.
type queue struct {
	MaxDepth  float64       `json:"maxDepth"`
	MeanDepth float64       `json:"meanDepth"`
	SumDepth  float64       `json:"-"`
	Samples   int           `json:"samples"`
	WaitP50   time.Duration `json:"queueWaitP50Ns"`
	WaitP99   time.Duration `json:"queueWaitP99Ns"`
	// WorkP50, WorkP99: one reconcile's duration.
	WorkP50 time.Duration `json:"workP50Ns"`
	WorkP99 time.Duration `json:"workP99Ns"`
}

// throttled counts goroutines waiting in the kube client's rate limiter.
type throttled struct {
	Samples int `json:"samples"`
	Sum     int `json:"sum"`
	Max     int `json:"max"`
}

func (t throttled) Mean() float64 { return float64(t.Sum) / float64(max(t.Samples, 1)) }

// throttledIn counts the goroutines of a goroutine dump (debug=2) waiting
// in client-go's client-side rate limiter.
func throttledIn(dump string) int {
	n := 0
	for _, g := range strings.Split(dump, "\n\n") {
		if strings.Contains(g, "rest.(*Request).tryThrottle") {
			n++
		}
	}
	return n
}

// ledgers summarises the healthy revisions' runs as their ledgers tell
// them: measurements per revision, against the interval's formula
// 1 + (measured span − initialDelay) / interval, where the measured span is
// from the first Ready pod (Started) to the end of the bake window.
type ledgers struct {
	Runs             int     `json:"runs"`
	MeanMeasurements float64 `json:"meanMeasurements"`
	MinMeasurements  int32   `json:"minMeasurements"`
	MaxMeasurements  int32   `json:"maxMeasurements"`
	MeanFormula      float64 `json:"meanFormula"`
	MeanSpanSeconds  float64 `json:"meanSpanSeconds"`
	Inconclusive     int32   `json:"inconclusive"`
	Errors           int32   `json:"errors"`
}

// ledgerSummary reads the runs that were not failed (the baked ones).
func ledgerSummary(runs map[string]*rollout.CheckRun, interval time.Duration) ledgers {
	var s ledgers
	var sum, formula, span float64
	for _, r := range runs {
		if r.FirstFailed != "" || len(r.Metrics) == 0 {
			continue
		}
		started, err1 := time.Parse(time.RFC3339, r.Started)
		until, err2 := time.Parse(time.RFC3339, r.BakeUntil)
		if err1 != nil || err2 != nil {
			continue
		}
		c := r.Metrics[0].Counts
		if s.Runs == 0 || c.Count < s.MinMeasurements {
			s.MinMeasurements = c.Count
		}
		s.MaxMeasurements = max(s.MaxMeasurements, c.Count)
		s.Inconclusive += c.Inconclusive
		s.Errors += c.Error
		s.Runs++
		sum += float64(c.Count)
		d := until.Sub(started)
		span += d.Seconds()
		formula += expectedMeasurements(d, scrapeEvery, interval)
	}
	if s.Runs > 0 {
		s.MeanMeasurements = sum / float64(s.Runs)
		s.MeanFormula = formula / float64(s.Runs)
		s.MeanSpanSeconds = span / float64(s.Runs)
	}
	return s
}

// expectedMeasurements is what the interval alone gives over a measured
// span: one after initialDelay, then one each interval until the span ends.
func expectedMeasurements(span, initialDelay, interval time.Duration) float64 {
	if span < initialDelay {
		return 0
	}
	return 1 + math.Floor(float64(span-initialDelay)/float64(interval))
}

// boundCap is the most measurements per revision the queries-per-second
// bound allows when n revisions are measured at once over span.
func boundCap(qps float64, span time.Duration, n int) float64 {
	return qps * span.Seconds() / float64(n)
}

// reaction is the failing revisions' time from the first failed
// measurement to the rollback, split at the check's Failed verdict.
type reaction struct {
	Rollbacks int `json:"rollbacks"`
	// SeenRollbacks, SeenFailedRuns: what the watch saw, paired or not.
	SeenRollbacks  int             `json:"seenRollbacks"`
	SeenFailedRuns int             `json:"seenFailedRuns"`
	Median         time.Duration   `json:"medianNs"`
	P90            time.Duration   `json:"p90Ns"`
	Worst          time.Duration   `json:"worstNs"`
	All            []time.Duration `json:"allNs"`
	// ToVerdict: first failed measurement to the check's Failed verdict
	// (the failureLimit's second measurement); VerdictToRollback the rest.
	ToVerdictMedian         time.Duration `json:"toVerdictMedianNs"`
	ToVerdictWorst          time.Duration `json:"toVerdictWorstNs"`
	VerdictToRollbackMedian time.Duration `json:"verdictToRollbackMedianNs"`
	VerdictToRollbackWorst  time.Duration `json:"verdictToRollbackWorstNs"`
}

// reactionOf pairs the rollbacks seen (Deployment → when) with their runs.
// The ledger's times have a second's resolution: each reaction is up to 1 s
// longer than the guard's.
func reactionOf(seen map[string]time.Time, runs map[string]*rollout.CheckRun) reaction {
	var all, toVerdict, rest []time.Duration
	for key, at := range seen {
		r := runs[key]
		if r == nil {
			continue
		}
		first, ok := r.FirstFailedTime()
		failed, ok2 := r.FailedTime()
		if !ok || !ok2 {
			continue
		}
		all = append(all, at.Sub(first))
		toVerdict = append(toVerdict, failed.Sub(first))
		rest = append(rest, at.Sub(failed))
	}
	if len(all) == 0 {
		return reaction{}
	}
	for _, s := range [][]time.Duration{all, toVerdict, rest} {
		slices.Sort(s)
	}
	med := func(s []time.Duration) time.Duration { return s[len(s)/2] }
	return reaction{
		Rollbacks: len(all), All: all, Median: med(all), P90: load.Quantile(all, .9), Worst: all[len(all)-1],
		ToVerdictMedian: med(toVerdict), ToVerdictWorst: toVerdict[len(toVerdict)-1],
		VerdictToRollbackMedian: med(rest), VerdictToRollbackWorst: rest[len(rest)-1],
	}
}

func printResults(w io.Writer, o options, r results) {
	mib := func(b int64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }
	per := func(a, b int64) string { return fmt.Sprintf("%.1f KiB", float64(a-b)/1024/float64(o.deployments)) }
	s := func(d time.Duration) string { return d.Round(100 * time.Millisecond).String() }
	rollouts := float64(o.deployments)
	span := time.Duration(r.Ledgers.MeanSpanSeconds * float64(time.Second))
	fmt.Fprintf(w, "\n%d Deployments (replicas 1) in %d namespaces; one ClusterDeploymentCheck, 1 metric, interval %s, initialDelay %s, failureLimit 1, bake window %s; checks.prometheus.qps %d\n\n",
		o.deployments, o.namespaces, o.interval, scrapeEvery, o.bake, o.qps)
	if o.guardArgs != "" {
		fmt.Fprintf(w, "The guard's extra flags: %s\n\n", o.guardArgs)
	}
	fmt.Fprintln(w, "| | guard RSS | heap in use | live heap after GC |")
	fmt.Fprintln(w, "|---|---|---|---|")
	fmt.Fprintf(w, "| %d Deployments, no check | %s | %s | %s |\n", o.deployments, mib(r.NoCheck.RSS), mib(r.NoCheck.Heap), mib(r.NoCheck.Live))
	fmt.Fprintf(w, "| the same, every new revision measured, in its bake window | %s | %s | %s |\n", mib(r.Checked.RSS), mib(r.Checked.Heap), mib(r.Checked.Live))
	fmt.Fprintf(w, "| difference per Deployment | %s | %s | %s |\n", per(r.Checked.RSS, r.NoCheck.RSS), per(r.Checked.Heap, r.NoCheck.Heap), per(r.Checked.Live, r.NoCheck.Live))
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| measure | value |")
	fmt.Fprintln(w, "|---|---|")
	fmt.Fprintf(w, "| queries per rollout (deployguard_check_measurements_total / %d rollouts) | %.1f |\n", o.deployments, r.Queries.Measurements/rollouts)
	fmt.Fprintf(w, "| measurements per baked revision, from the ledgers (min / mean / max, %d runs) | %d / %.1f / %d |\n", r.Ledgers.Runs, r.Ledgers.MinMeasurements, r.Ledgers.MeanMeasurements, r.Ledgers.MaxMeasurements)
	fmt.Fprintf(w, "| the interval's formula 1 + ⌊(span − initialDelay) / interval⌋, mean span %.0fs (first Ready pod to bake end) | %.1f |\n", r.Ledgers.MeanSpanSeconds, r.Ledgers.MeanFormula)
	fmt.Fprintf(w, "| what the qps bound allows: qps × span / %d revisions at once | %.1f |\n", o.deployments, boundCap(float64(o.qps), span, o.deployments))
	fmt.Fprintf(w, "| measurements by phase (Successful / Failed / Inconclusive / Error) | %.0f / %.0f / %.0f / %.0f |\n",
		r.Queries.ByPhase["Successful"], r.Queries.ByPhase["Failed"], r.Queries.ByPhase["Inconclusive"], r.Queries.ByPhase["Error"])
	fmt.Fprintf(w, "| deployguard_check_measurements_delayed_total during the bump | %.0f (%.1f per measurement) |\n", r.Queries.Delayed, r.Queries.Delayed/max(r.Queries.Measurements, 1))
	fmt.Fprintf(w, "| queries the stand-in saw: total, mean / peak per second over %.0fs | %d, %.1f / %d |\n", r.BumpSeconds, r.StandIn.Queries, r.StandIn.Mean, r.StandIn.Peak)
	fmt.Fprintf(w, "| rollout reconciles during the bump; guard CPU | %.0f (%.0f/s); %.0f s (%.0f%% of a core) |\n", r.Reconciles, r.Reconciles/r.BumpSeconds, r.GuardCPUSeconds, 100*r.GuardCPUSeconds/r.BumpSeconds)
	fmt.Fprintf(w, "| reconcile queue: max / mean depth; time queued p50 / p99; one reconcile p50 / p99 | %.0f / %.0f; %s / %s; %s / %s |\n",
		r.Queue.MaxDepth, r.Queue.MeanDepth, s(r.Queue.WaitP50), s(r.Queue.WaitP99), r.Queue.WorkP50.Round(time.Millisecond), r.Queue.WorkP99.Round(time.Millisecond))
	fmt.Fprintf(w, "| goroutines waiting in the kube client's rate limiter, over %d goroutine dumps: mean / max | %.1f / %d |\n", r.Throttled.Samples, r.Throttled.Mean(), r.Throttled.Max)
	fmt.Fprintf(w, "| reaction over %d rollbacks (the watch saw %d rollbacks, %d failed runs), first failed measurement → rollback: p50 / p90 / worst | %s / %s / %s |\n",
		r.Reaction.Rollbacks, r.Reaction.SeenRollbacks, r.Reaction.SeenFailedRuns, s(r.Reaction.Median), s(r.Reaction.P90), s(r.Reaction.Worst))
	fmt.Fprintf(w, "| of which first failed → Failed verdict (failureLimit 1): median / worst | %s / %s |\n", s(r.Reaction.ToVerdictMedian), s(r.Reaction.ToVerdictWorst))
	fmt.Fprintf(w, "| of which Failed verdict → rollback seen: median / worst | %s / %s |\n", s(r.Reaction.VerdictToRollbackMedian), s(r.Reaction.VerdictToRollbackWorst))
	fmt.Fprintf(w, "| deployguard_check_rollback_reaction_seconds p50 / p90 (the guard's own) | %s / %s |\n", s(r.GuardReaction), s(r.GuardReaction90))
	fmt.Fprintf(w, "\nCreating the %d Deployments to every revision 1 known-good: %.0fs. Bump: writes %.0fs, every healthy revision in its bake window after %.0fs (%d already known-good then), every revision decided after %.0fs. Whole run: %.0fs.\n",
		o.deployments, r.CreateSeconds, r.BumpWriteSeconds, r.AllInBakeSeconds, r.BakedBeforeAllInBake, r.BumpSeconds, r.Seconds)
}
