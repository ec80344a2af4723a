// Package origin names the guard's checks. Every finding a check makes, and
// the field error of every refusal, carries its check's name as its Origin;
// the names are also the reason label of deployguard_admission_requests_total
// (webhook/README.md, "Metrics and logs", lists them), the rules of the
// audit's results and the checks a PolicyException names. They live in a
// package of their own so that the review engine and the exceptions, which it
// imports, spell them once.
package origin

// The checks' names.
const (
	Selector         = "selector"          // spec.selector: empty, unparsable, not selecting the template, not repairable
	Overlap          = "overlap"           // spec.selector: selects another Deployment's pods, or is selected by its selector
	Strategy         = "strategy"          // spec.strategy: every replica down at once
	RevisionHistory  = "revision-history"  // spec.revisionHistoryLimit outside enforced bounds
	ProgressDeadline = "progress-deadline" // spec.progressDeadlineSeconds not above minReadySeconds, or outside enforced bounds
	Finalizers       = "finalizers"        // metadata.finalizers and the cleanup annotation that chooses them
	Size             = "size"              // more labels, selector terms, finalizers or owners than the guard keeps of a Deployment, or selector terms of a PodDisruptionBudget
	Quarantine       = "quarantine"        // spec.template: a quarantined pod template brought back
	Protected        = "protected"         // DELETE of a Deployment annotated protected
	Policy           = "policy"            // an enforced Rego policy; which one is the policy engine's metrics'
	// spec.replicas of a Deployment, or a PodDisruptionBudget's rule: the
	// budget allows no eviction of the pods (enforce mode only refuses).
	DisruptionBudget = "disruption-budget"

	// Internal is no check: the guard could not decide, so it refused for
	// its own sake (the Deployments to compare selectors with could not be
	// looked up, an index not yet synced; the policies could not read the
	// request).
	Internal = "internal"
)

// Checks are the checks a refusal may be counted under: every name but
// Internal.
func Checks() []string {
	return []string{Selector, Overlap, Strategy, RevisionHistory, ProgressDeadline,
		Finalizers, Size, Quarantine, Protected, Policy, DisruptionBudget}
}
