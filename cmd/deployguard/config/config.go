// Package config is deployguard's one configuration file: the cluster's policy
// knobs (defaults, bounds, exemptions), loaded and validated once at start-up.
// Every error names the field and the line it came from, because the person who
// reads it is editing a YAML file.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/deployguard/deployguard/cmd/deployguard/internal/yamlpath"
	"github.com/deployguard/deployguard/reconciler"
	"github.com/deployguard/deployguard/reconciler/vocab"
	"github.com/deployguard/deployguard/webhook/review"
)

// Config is the guard's configuration file.
type Config struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`

	Defaults   Defaults   `yaml:"defaults"`
	Bounds     Bounds     `yaml:"bounds"`
	Selector   Selector   `yaml:"selector"`
	Finalizers Finalizers `yaml:"finalizers"`
	Rollback   Rollback   `yaml:"rollback"`
	Cleanup    Cleanup    `yaml:"cleanup"`
	Policy     Policy     `yaml:"policy"`
	Exemptions Exemptions `yaml:"exemptions"`
	Exceptions Exceptions `yaml:"exceptions"`
	Audit      Audit      `yaml:"audit"`
	Checks     Checks     `yaml:"checks"`

	DisruptionBudgets DisruptionBudgets `yaml:"disruptionBudgets"`
	NativePolicies    NativePolicies    `yaml:"nativePolicies"`
}

// Checks configures metric checks (reconciler/analysis): where Prometheus
// is and how the guard reaches it, and the default bake window. With no
// Prometheus URL, no check is measured.
type Checks struct {
	Prometheus Prometheus `yaml:"prometheus"`
	// BakeWindow is how long a completed rollout is still measured before it
	// is recorded known-good, for checks that set none.
	BakeWindow Duration `yaml:"bakeWindow"`
}

// Prometheus is how the guard queries Prometheus.
type Prometheus struct {
	// URL is Prometheus's base URL (http or https), e.g.
	// http://kube-prometheus-stack-prometheus.monitoring:9090.
	URL string `yaml:"url"`
	// CAFile verifies an https URL (system roots when empty).
	CAFile             string `yaml:"caFile"`
	InsecureSkipVerify bool   `yaml:"insecureSkipVerify"`
	// BearerTokenFile is sent as a bearer token: a Secret of the guard's
	// namespace, mounted (the chart's checks.prometheus.tokenSecret).
	BearerTokenFile string `yaml:"bearerTokenFile"`
	// Timeout bounds one query.
	Timeout Duration `yaml:"timeout"`
	// QPS and Burst bound the guard's queries, cluster-wide.
	QPS   float64 `yaml:"qps"`
	Burst int     `yaml:"burst"`
}

// NativePolicies says whether the guard's ValidatingAdmissionPolicies
// (config/native) are installed: the API server then enforces the refusals
// that need only the object, and the webhook does not evaluate them again.
type NativePolicies struct {
	// Installed is true by default, as the install ships them. A guard that
	// finds them missing at start evaluates them itself whatever this says.
	Installed bool `yaml:"installed"`
	// ProbeNamespace is where the guard dry-run creates its floor probe
	// (webhook/README.md, "Floor probe"): a namespace the refusals' binding
	// applies to, and the only one where the guard's role may create
	// Deployments. "default" by default.
	ProbeNamespace string `yaml:"probeNamespace"`
}

// DisruptionBudgets configures the drain check: a PodDisruptionBudget that
// allows no eviction of a Deployment's pods at its replicas makes every node
// that runs one undrainable.
type DisruptionBudgets struct {
	// Mode is warn (the default: admission warnings and audit results),
	// enforce (the Deployment or budget write that makes one is refused) or
	// off.
	Mode string `yaml:"mode"`
}

// Exceptions configures PolicyExceptions, the grants a platform team makes
// per Deployment and rule, each with an expiry.
type Exceptions struct {
	// Namespace is the one namespace exceptions are honoured in; empty means
	// the guard's own, where only the platform team may write.
	Namespace string `yaml:"namespace"`
	// MaxDuration is how far ahead an exception's expiresAt may be.
	MaxDuration Duration `yaml:"maxDuration"`
	// ExpiryWarning is how long before its expiry an exception is reported
	// as expiring (an Event, a metric, an alert).
	ExpiryWarning Duration `yaml:"expiryWarning"`
}

// Audit is the background audit of stored Deployments into PolicyReports.
type Audit struct {
	// Enabled turns the audit on (the leader runs it).
	Enabled bool `yaml:"enabled"`
	// Period is the safety-net interval of a full pass; passes also run on
	// start, on a policy-set change and when a Deployment changes.
	Period Duration `yaml:"period"`
	// Rate is how many Deployments a second the audit evaluates, at most.
	Rate float64 `yaml:"rate"`
	// ReportFormat is wgpolicyk8s.io/v1alpha2 (PolicyReport, what Kyverno
	// writes and Policy Reporter reads) or openreports.io/v1alpha1 (Report).
	ReportFormat string `yaml:"reportFormat"`
}

// Defaults are what the mutating webhook fills in where the user did not
// choose. They start at the API server's own values, so that a default install
// changes nothing in a Deployment's rollout arithmetic.
type Defaults struct {
	Strategy                Strategy `yaml:"strategy"`
	RevisionHistoryLimit    int32    `yaml:"revisionHistoryLimit"`
	ProgressDeadlineSeconds int32    `yaml:"progressDeadlineSeconds"`
	// AddFinalizers is the former switch of the cleanup finalizers, kept so
	// that an older file still loads: true means cleanup.steps [record, drain].
	AddFinalizers bool `yaml:"addFinalizers"`
}

// Strategy is the default rolling update; values are an integer or a percentage.
type Strategy struct {
	MaxSurge       string `yaml:"maxSurge"`
	MaxUnavailable string `yaml:"maxUnavailable"`
}

// Bounds are the platform team's limits, which the validating webhook checks:
// a value outside them is a warning, or refused when Enforce is set. A value
// outside them breaks no rollout, so they do not refuse by default.
type Bounds struct {
	Enforce                 bool  `yaml:"enforce"`
	RevisionHistoryLimit    Range `yaml:"revisionHistoryLimit"`
	ProgressDeadlineSeconds Range `yaml:"progressDeadlineSeconds"`
}

// Range is an inclusive [Min, Max].
type Range struct {
	Min int32 `yaml:"min"`
	Max int32 `yaml:"max"`
}

// Selector configures the repair of missing selectors.
type Selector struct {
	// StableLabelKeys are the template labels that identify an application and
	// never change between versions, in order of preference.
	StableLabelKeys []string `yaml:"stableLabelKeys"`
}

// Finalizers configures who may remove or reorder the guard's finalizers.
type Finalizers struct {
	// BreakGlassGroups may remove or reorder the guard's finalizers, besides the
	// guard's own service account.
	BreakGlassGroups []string `yaml:"breakGlassGroups"`
}

// Rollback configures the reconciler's automatic rollback.
type Rollback struct {
	// AutoRollback is on unless a Deployment opts out by annotation.
	AutoRollback bool `yaml:"autoRollback"`
	// Quarantine is what the validating webhook does with an update that brings a
	// failed template back: enforce (refuse), warn, or off.
	Quarantine string `yaml:"quarantine"`
	// FailFast rolls back a rollout whose new pods show they cannot run,
	// before its progress deadline.
	FailFast FailFast `yaml:"failFast"`
}

// FailFast says when a rollout in progress counts as failing by its new pods.
type FailFast struct {
	Enabled bool `yaml:"enabled"`
	// Window is how long the evidence must hold on the new pods, none Ready.
	Window Duration `yaml:"window"`
	// TransientWindow is the window when every piece of evidence is a
	// transient pull failure (a registry unreachable, overloaded or rate
	// limiting): a blip must not roll a good release back.
	TransientWindow Duration `yaml:"transientWindow"`
	// Reasons are the container waiting reasons that are evidence.
	Reasons []string `yaml:"reasons"`
	// RestartThreshold: a container restarted this many times is evidence.
	RestartThreshold int32 `yaml:"restartThreshold"`
	// UnschedulableAfter: a new pod unschedulable this long is evidence.
	UnschedulableAfter Duration `yaml:"unschedulableAfter"`
	// MinFailingPods: how many new pods must show evidence; 0 is all of them.
	MinFailingPods int `yaml:"minFailingPods"`
}

// Cleanup configures finalizer-ordered cleanup.
type Cleanup struct {
	// Steps are the cleanup steps (record, drain) of a Deployment without the
	// deployguard.io/cleanup annotation. Empty by default: a step holds the
	// deletion until it is done, which clients that delete and re-create by
	// name, or wait for the pods to go, do not expect.
	Steps           []string `yaml:"steps"`
	DrainTimeout    Duration `yaml:"drainTimeout"`
	RecordRetention Duration `yaml:"recordRetention"`
	// The budget of the records one namespace's deletions keep in the
	// guard's namespace, where no tenant's quota applies: past the count or
	// the bytes, the oldest of that namespace go; a record larger than
	// MaxRecordBytes is not written (reconciler.RecordBudget). A namespace's
	// budget holds at least two records of the largest size.
	RecordsPerNamespace     int   `yaml:"recordsPerNamespace"`
	RecordBytesPerNamespace int64 `yaml:"recordBytesPerNamespace"`
	MaxRecordBytes          int64 `yaml:"maxRecordBytes"`
}

// Policy configures the Rego policy layer.
type Policy struct {
	// DisableBuiltins names built-in policies that are switched off.
	DisableBuiltins []string `yaml:"disableBuiltins"`
	// ModeOverride forces a mode (enforce, warn, audit) on every policy, for a
	// dry run of a new rule set.
	ModeOverride string `yaml:"modeOverride"`
	// Modes forces a mode on single policies, by name.
	Modes map[string]string `yaml:"modes"`
	// FailureMode is what an evaluation error means for an enforce policy: deny or allow.
	FailureMode string `yaml:"failureMode"`
	// EvalTimeout is each evaluation's time budget.
	EvalTimeout Duration `yaml:"evalTimeout"`
}

// Exemptions are requests the guard's checks never refuse. They come from this
// file only, never from anything the requesting user controls.
type Exemptions struct {
	Namespaces []string `yaml:"namespaces"`
	Usernames  []string `yaml:"usernames"`
	Groups     []string `yaml:"groups"`
}

// Duration is a time.Duration written as "90s" or "2m" in the file.
type Duration struct{ time.Duration }

// UnmarshalYAML parses a Go duration string.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("line %d: %q is not a duration such as \"90s\" or \"2m\"", n.Line, s)
	}
	d.Duration = v
	return nil
}

// MarshalYAML writes the duration back as a string.
func (d Duration) MarshalYAML() (any, error) { return d.String(), nil }

const (
	// APIVersion and Kind identify the file, so that a wrong file is caught early.
	APIVersion = "deployguard.io/v1alpha1"
	Kind       = "GuardConfig"
)

// Default returns the configuration used when no file is given; a file only
// needs to name what it changes.
func Default() Config {
	return Config{
		APIVersion: APIVersion,
		Kind:       Kind,
		Defaults: Defaults{
			Strategy:                Strategy{MaxSurge: "25%", MaxUnavailable: "25%"},
			RevisionHistoryLimit:    10,
			ProgressDeadlineSeconds: 600,
		},
		Bounds: Bounds{
			RevisionHistoryLimit:    Range{Min: 1, Max: 100},
			ProgressDeadlineSeconds: Range{Min: 30, Max: 7200},
		},
		Selector: Selector{StableLabelKeys: []string{"app.kubernetes.io/name", "app.kubernetes.io/instance", "app"}},
		Rollback: Rollback{AutoRollback: true, Quarantine: "enforce", FailFast: FailFast{
			Enabled: true, Window: Duration{60 * time.Second}, TransientWindow: Duration{5 * time.Minute},
			Reasons: []string{"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "RegistryUnavailable", "SignatureValidationFailed",
				"CreateContainerConfigError", "CreateContainerError", "RunContainerError", "CrashLoopBackOff"},
			RestartThreshold: 3, UnschedulableAfter: Duration{5 * time.Minute},
		}},
		Cleanup: Cleanup{
			DrainTimeout:    Duration{2 * time.Minute},
			RecordRetention: Duration{7 * 24 * time.Hour},

			RecordsPerNamespace:     reconciler.DefaultRecordsPerNamespace,
			RecordBytesPerNamespace: reconciler.DefaultRecordBytesPerNamespace,
			MaxRecordBytes:          reconciler.DefaultMaxRecordBytes,
		},
		Policy:     Policy{FailureMode: "deny", EvalTimeout: Duration{250 * time.Millisecond}},
		Exceptions: Exceptions{MaxDuration: Duration{90 * 24 * time.Hour}, ExpiryWarning: Duration{7 * 24 * time.Hour}},
		Audit:      Audit{Enabled: true, Period: Duration{time.Hour}, Rate: 200, ReportFormat: "wgpolicyk8s.io/v1alpha2"},
		Checks: Checks{
			Prometheus: Prometheus{Timeout: Duration{10 * time.Second}, QPS: 20, Burst: 20},
			BakeWindow: Duration{reconciler.DefaultBakeWindow},
		},

		DisruptionBudgets: DisruptionBudgets{Mode: "warn"},
		NativePolicies:    NativePolicies{Installed: true, ProbeNamespace: "default"},
	}
}

// Load reads, parses and validates the file at path. An empty path gives Default().
func Load(path string) (Config, error) {
	if path == "" {
		return Default(), nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("reading config file: %w", err)
	}
	c, err := Parse(b)
	if err != nil {
		return Config{}, fmt.Errorf("config file %s: %w", path, err)
	}
	return c, nil
}

// Parse parses and validates a configuration document over Default(): fields not
// in the document keep their default, unknown fields are errors.
func Parse(b []byte) (Config, error) {
	c := Default()
	var root yaml.Node
	if err := yaml.Unmarshal(b, &root); err != nil {
		return Config{}, cleanYAMLError(err)
	}
	if len(bytes.TrimSpace(b)) == 0 || root.Kind == 0 || isNull(&root) {
		return Config{}, errors.New("the file is empty: it needs at least apiVersion and kind")
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		return Config{}, cleanYAMLError(err)
	}
	if errs := c.Validate(); len(errs) > 0 {
		lines := make([]string, 0, len(errs))
		for _, e := range errs {
			if l, _ := yamlpath.Line(&root, yamlpath.Split(e.Field)); l > 0 {
				lines = append(lines, fmt.Sprintf("line %d: %s", l, e.Error()))
			} else {
				lines = append(lines, e.Error())
			}
		}
		return Config{}, errors.New(strings.Join(lines, "\n"))
	}
	return c, nil
}

// isNull reports a document that holds nothing: only comments, "---" or null.
func isNull(root *yaml.Node) bool {
	n := root
	if n.Kind == yaml.DocumentNode {
		if len(n.Content) == 0 {
			return true
		}
		n = n.Content[0]
	}
	return n.Kind == yaml.ScalarNode && n.Tag == "!!null"
}

// cleanYAMLError drops the library's "yaml: unmarshal errors:" preamble so the
// message starts with the line.
func cleanYAMLError(err error) error {
	msg := err.Error()
	msg = strings.TrimPrefix(msg, "yaml: unmarshal errors:\n")
	msg = strings.TrimPrefix(msg, "yaml: ")
	var out []string
	for _, l := range strings.Split(msg, "\n") {
		out = append(out, strings.TrimSpace(l))
	}
	return errors.New(strings.Join(out, "\n"))
}

// Validate checks every field and returns every problem at once.
func (c *Config) Validate() field.ErrorList {
	var errs field.ErrorList
	if c.APIVersion != APIVersion {
		errs = append(errs, field.Invalid(field.NewPath("apiVersion"), c.APIVersion, "must be "+APIVersion))
	}
	if c.Kind != Kind {
		errs = append(errs, field.Invalid(field.NewPath("kind"), c.Kind, "must be "+Kind))
	}

	d := field.NewPath("defaults")
	for name, v := range map[string]string{"maxSurge": c.Defaults.Strategy.MaxSurge, "maxUnavailable": c.Defaults.Strategy.MaxUnavailable} {
		if err := checkIntOrPercent(v); err != nil {
			errs = append(errs, field.Invalid(d.Child("strategy", name), v, err.Error()))
		}
	}
	if s, u := c.Defaults.Strategy.IntOrString(); review.NeverProgresses(s, u) {
		errs = append(errs, field.Invalid(d.Child("strategy", "maxUnavailable"), c.Defaults.Strategy.MaxUnavailable,
			"maxSurge and maxUnavailable cannot both be 0: a rollout could never make progress"))
	}

	if c.Exceptions.MaxDuration.Duration <= 0 {
		errs = append(errs, field.Invalid(field.NewPath("exceptions", "maxDuration"), c.Exceptions.MaxDuration.String(), "must be positive, e.g. 2160h (90 days)"))
	}
	if c.Exceptions.ExpiryWarning.Duration < 0 {
		errs = append(errs, field.Invalid(field.NewPath("exceptions", "expiryWarning"), c.Exceptions.ExpiryWarning.String(), "must not be negative"))
	}

	b := field.NewPath("bounds")
	errs = append(errs, c.Bounds.RevisionHistoryLimit.validate(b.Child("revisionHistoryLimit"), 0)...)
	errs = append(errs, c.Bounds.ProgressDeadlineSeconds.validate(b.Child("progressDeadlineSeconds"), 1)...)
	if !c.Bounds.RevisionHistoryLimit.contains(c.Defaults.RevisionHistoryLimit) {
		errs = append(errs, field.Invalid(d.Child("revisionHistoryLimit"), c.Defaults.RevisionHistoryLimit,
			fmt.Sprintf("must lie within bounds.revisionHistoryLimit [%d, %d]", c.Bounds.RevisionHistoryLimit.Min, c.Bounds.RevisionHistoryLimit.Max)))
	}
	if !c.Bounds.ProgressDeadlineSeconds.contains(c.Defaults.ProgressDeadlineSeconds) {
		errs = append(errs, field.Invalid(d.Child("progressDeadlineSeconds"), c.Defaults.ProgressDeadlineSeconds,
			fmt.Sprintf("must lie within bounds.progressDeadlineSeconds [%d, %d]", c.Bounds.ProgressDeadlineSeconds.Min, c.Bounds.ProgressDeadlineSeconds.Max)))
	}

	sel := field.NewPath("selector", "stableLabelKeys")
	if len(c.Selector.StableLabelKeys) == 0 {
		errs = append(errs, field.Required(sel, "at least one label key is needed to repair a missing selector"))
	}
	for i, k := range c.Selector.StableLabelKeys {
		if strings.TrimSpace(k) == "" {
			errs = append(errs, field.Invalid(sel.Index(i), k, "must not be empty"))
		}
	}

	// The native policies' params hold these lists comma-separated.
	for _, l := range []struct {
		path  *field.Path
		names []string
	}{
		{field.NewPath("finalizers", "breakGlassGroups"), c.Finalizers.BreakGlassGroups},
		{field.NewPath("exemptions", "namespaces"), c.Exemptions.Namespaces},
		{field.NewPath("exemptions", "usernames"), c.Exemptions.Usernames},
		{field.NewPath("exemptions", "groups"), c.Exemptions.Groups},
	} {
		for i, n := range l.names {
			if strings.Contains(n, ",") || strings.TrimSpace(n) == "" {
				errs = append(errs, field.Invalid(l.path.Index(i), n,
					"must be a non-empty name without a comma (the native policies read these lists comma-separated); a group with commas in its name cannot be named here"))
			}
		}
	}

	if errs1123 := validation.IsDNS1123Label(c.NativePolicies.ProbeNamespace); len(errs1123) > 0 {
		errs = append(errs, field.Invalid(field.NewPath("nativePolicies", "probeNamespace"), c.NativePolicies.ProbeNamespace,
			"must be a namespace name: "+strings.Join(errs1123, "; ")))
	}
	if !oneOf(c.Rollback.Quarantine, "enforce", "warn", "off") {
		errs = append(errs, field.NotSupported(field.NewPath("rollback", "quarantine"), c.Rollback.Quarantine, []string{"enforce", "warn", "off"}))
	}
	if !oneOf(c.DisruptionBudgets.Mode, "warn", "enforce", "off") {
		errs = append(errs, field.NotSupported(field.NewPath("disruptionBudgets", "mode"), c.DisruptionBudgets.Mode, []string{"warn", "enforce", "off"}))
	}
	errs = append(errs, c.Checks.validate(field.NewPath("checks"))...)
	ff, ffp := c.Rollback.FailFast, field.NewPath("rollback", "failFast")
	if ff.Window.Duration < 10*time.Second {
		errs = append(errs, field.Invalid(ffp.Child("window"), ff.Window.String(),
			"must be at least 10s: evidence seen for less than that is too often a pod still starting"))
	}
	if ff.TransientWindow.Duration < ff.Window.Duration {
		errs = append(errs, field.Invalid(ffp.Child("transientWindow"), ff.TransientWindow.String(),
			fmt.Sprintf("must be at least rollback.failFast.window (%s): a transient failure never rolls back sooner than a permanent one", ff.Window)))
	}
	if ff.RestartThreshold < 1 {
		errs = append(errs, field.Invalid(ffp.Child("restartThreshold"), ff.RestartThreshold, "must be at least 1"))
	}
	if ff.UnschedulableAfter.Duration <= 0 {
		errs = append(errs, field.Invalid(ffp.Child("unschedulableAfter"), ff.UnschedulableAfter.String(), "must be positive"))
	}
	if ff.MinFailingPods < 0 {
		errs = append(errs, field.Invalid(ffp.Child("minFailingPods"), ff.MinFailingPods, "must not be negative (0 means every new pod)"))
	}
	if ff.Enabled && len(ff.Reasons) == 0 {
		errs = append(errs, field.Required(ffp.Child("reasons"), "at least one waiting reason, such as ImagePullBackOff"))
	}
	cl := field.NewPath("cleanup")
	if _, err := vocab.ParseCleanupSteps(strings.Join(c.Cleanup.Steps, ",")); err != nil {
		errs = append(errs, field.Invalid(cl.Child("steps"), c.Cleanup.Steps, err.Error()))
	}
	if c.Defaults.AddFinalizers && len(c.Cleanup.Steps) > 0 {
		errs = append(errs, field.Invalid(d.Child("addFinalizers"), true, "replaced by cleanup.steps: remove it"))
	}
	if c.Cleanup.DrainTimeout.Duration <= 0 {
		errs = append(errs, field.Invalid(cl.Child("drainTimeout"), c.Cleanup.DrainTimeout.String(), "must be positive"))
	}
	if c.Cleanup.RecordRetention.Duration <= 0 {
		errs = append(errs, field.Invalid(cl.Child("recordRetention"), c.Cleanup.RecordRetention.String(), "must be positive"))
	}
	// Two records of the largest size fit a namespace's budget: two
	// deletions recorded at once never evict each other's record.
	if c.Cleanup.RecordsPerNamespace < 2 {
		errs = append(errs, field.Invalid(cl.Child("recordsPerNamespace"), c.Cleanup.RecordsPerNamespace, "must be at least 2 (two records written at once both fit)"))
	}
	if c.Cleanup.MaxRecordBytes <= 0 || c.Cleanup.MaxRecordBytes > reconciler.MaxConfigMapBytes {
		errs = append(errs, field.Invalid(cl.Child("maxRecordBytes"), c.Cleanup.MaxRecordBytes,
			fmt.Sprintf("must be positive and at most %d (the most data a ConfigMap holds)", reconciler.MaxConfigMapBytes)))
	}
	if c.Cleanup.RecordBytesPerNamespace < 2*c.Cleanup.MaxRecordBytes {
		errs = append(errs, field.Invalid(cl.Child("recordBytesPerNamespace"), c.Cleanup.RecordBytesPerNamespace, "must be at least twice maxRecordBytes (two records written at once both fit)"))
	}

	a := field.NewPath("audit")
	if c.Audit.Period.Duration < time.Minute {
		errs = append(errs, field.Invalid(a.Child("period"), c.Audit.Period.String(), "must be at least 1m: passes also run on every change, the period is only a safety net"))
	}
	if c.Audit.Rate <= 0 {
		errs = append(errs, field.Invalid(a.Child("rate"), c.Audit.Rate, "must be positive: Deployments evaluated per second"))
	}
	if !oneOf(c.Audit.ReportFormat, "wgpolicyk8s.io/v1alpha2", "openreports.io/v1alpha1") {
		errs = append(errs, field.NotSupported(a.Child("reportFormat"), c.Audit.ReportFormat, []string{"wgpolicyk8s.io/v1alpha2", "openreports.io/v1alpha1"}))
	}

	p := field.NewPath("policy")
	modes := []string{"enforce", "warn", "audit"}
	if c.Policy.ModeOverride != "" && !oneOf(c.Policy.ModeOverride, modes...) {
		errs = append(errs, field.NotSupported(p.Child("modeOverride"), c.Policy.ModeOverride, modes))
	}
	for name, m := range c.Policy.Modes {
		if !oneOf(m, modes...) {
			errs = append(errs, field.NotSupported(p.Child("modes").Key(name), m, modes))
		}
	}
	if !oneOf(c.Policy.FailureMode, "deny", "allow") {
		errs = append(errs, field.NotSupported(p.Child("failureMode"), c.Policy.FailureMode, []string{"deny", "allow"}))
	}
	if c.Policy.EvalTimeout.Duration <= 0 || c.Policy.EvalTimeout.Duration > 2*time.Second {
		errs = append(errs, field.Invalid(p.Child("evalTimeout"), c.Policy.EvalTimeout.String(),
			"must be positive and at most 2s, well inside the webhook's timeout"))
	}
	return errs
}

// CleanupFinalizers returns the guard's finalizers of a Deployment that does
// not choose its own cleanup steps. The file was validated, so they parse.
func (c Config) CleanupFinalizers() []string {
	steps := c.Cleanup.Steps
	if c.Defaults.AddFinalizers && len(steps) == 0 {
		steps = []string{vocab.StepRecord, vocab.StepDrain}
	}
	f, _ := vocab.ParseCleanupSteps(strings.Join(steps, ","))
	return f
}

// ChangesEveryDeployment reports whether the mutating webhook may change any
// Deployment, not only one with an empty selector or the guard's cleanup
// annotation or finalizers: when the defaults differ from the API server's
// own, or every Deployment gets cleanup steps. The shipped webhook
// configuration's matchCondition "guard-may-change-it" must then go.
func (c Config) ChangesEveryDeployment() bool {
	d := c.Defaults
	return d.Strategy.MaxSurge != "25%" || d.Strategy.MaxUnavailable != "25%" ||
		d.RevisionHistoryLimit != 10 || d.ProgressDeadlineSeconds != 600 || len(c.CleanupFinalizers()) > 0
}

// IntOrString returns the default strategy's values in the API's type.
func (s Strategy) IntOrString() (maxSurge, maxUnavailable intstr.IntOrString) {
	return intstr.Parse(s.MaxSurge), intstr.Parse(s.MaxUnavailable)
}

func (r Range) validate(p *field.Path, lowest int32) field.ErrorList {
	var errs field.ErrorList
	if r.Min < lowest {
		errs = append(errs, field.Invalid(p.Child("min"), r.Min, fmt.Sprintf("must be at least %d", lowest)))
	}
	if r.Max < r.Min {
		errs = append(errs, field.Invalid(p.Child("max"), r.Max, fmt.Sprintf("must not be below min (%d)", r.Min)))
	}
	return errs
}

func (r Range) contains(v int32) bool { return v >= r.Min && v <= r.Max }

func checkIntOrPercent(v string) error {
	if v == "" {
		return errors.New("must be an integer or a percentage such as \"25%\"")
	}
	x := intstr.Parse(v)
	if x.Type == intstr.Int {
		if x.IntVal < 0 {
			return errors.New("must not be negative")
		}
		return nil
	}
	n, ok := strings.CutSuffix(v, "%")
	if !ok {
		return errors.New("must be an integer or a percentage such as \"25%\"")
	}
	var pct int
	if _, err := fmt.Sscanf(n, "%d", &pct); err != nil || pct < 0 || pct > 100 || fmt.Sprint(pct) != n {
		return errors.New("a percentage must be a whole number from 0% to 100%")
	}
	return nil
}

func oneOf(v string, allowed ...string) bool {
	for _, a := range allowed {
		if v == a {
			return true
		}
	}
	return false
}

func (c Checks) validate(path *field.Path) field.ErrorList {
	var errs field.ErrorList
	p, pp := c.Prometheus, path.Child("prometheus")
	if p.URL != "" {
		if u, err := url.Parse(p.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, field.Invalid(pp.Child("url"), p.URL, "must be an http or https URL, e.g. http://prometheus-operated.monitoring:9090"))
		}
	}
	if p.Timeout.Duration <= 0 || p.Timeout.Duration > time.Minute {
		errs = append(errs, field.Invalid(pp.Child("timeout"), p.Timeout.String(), "must be more than 0s and at most 1m"))
	}
	if p.QPS <= 0 {
		errs = append(errs, field.Invalid(pp.Child("qps"), p.QPS, "must be positive: it bounds the guard's queries when many Deployments roll out at once"))
	}
	if p.Burst < 1 {
		errs = append(errs, field.Invalid(pp.Child("burst"), p.Burst, "must be at least 1"))
	}
	if b := c.BakeWindow.Duration; b < 0 || b > 24*time.Hour {
		errs = append(errs, field.Invalid(path.Child("bakeWindow"), c.BakeWindow.String(), "must be between 0s and 24h"))
	}
	return errs
}
