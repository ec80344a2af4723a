package config

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/deployguard/deployguard/reconciler"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		doc     string
		wantErr []string // substrings the error must contain; none means valid
		check   func(t *testing.T, c Config)
	}{
		{
			name: "minimal file keeps every default",
			doc:  "apiVersion: deployguard.io/v1alpha1\nkind: GuardConfig\n",
			check: func(t *testing.T, c Config) {
				assert.Equal(t, Default(), c)
			},
		},
		{
			name: "overrides are applied over the defaults",
			doc: `apiVersion: deployguard.io/v1alpha1
kind: GuardConfig
defaults:
  revisionHistoryLimit: 5
cleanup:
  drainTimeout: 45s
exemptions:
  namespaces: [legacy]
`,
			check: func(t *testing.T, c Config) {
				assert.Equal(t, int32(5), c.Defaults.RevisionHistoryLimit)
				assert.Equal(t, int32(600), c.Defaults.ProgressDeadlineSeconds)
				assert.Equal(t, 45*time.Second, c.Cleanup.DrainTimeout.Duration)
				assert.Equal(t, []string{"legacy"}, c.Exemptions.Namespaces)
			},
		},
		{
			name: "a default install changes nothing of upstream's and holds no deletion",
			doc:  "apiVersion: deployguard.io/v1alpha1\nkind: GuardConfig\n",
			check: func(t *testing.T, c Config) {
				assert.Equal(t, Strategy{MaxSurge: "25%", MaxUnavailable: "25%"}, c.Defaults.Strategy)
				assert.Empty(t, c.CleanupFinalizers())
				assert.False(t, c.Bounds.Enforce)
				o := c.WebhookOptions("guard")
				assert.False(t, o.BoundsEnforce)
				assert.Empty(t, o.CleanupFinalizers)
			},
		},
		{
			name: "a group whose name has a comma cannot be named",
			doc: `apiVersion: deployguard.io/v1alpha1
kind: GuardConfig
finalizers:
  breakGlassGroups: ["cn=admins,ou=groups"]
exemptions:
  namespaces: [""]
`,
			wantErr: []string{"finalizers.breakGlassGroups[0]", "without a comma", "exemptions.namespaces[0]"},
		},
		{
			name: "cleanup steps for every Deployment, in canonical order",
			doc:  "apiVersion: deployguard.io/v1alpha1\nkind: GuardConfig\ncleanup:\n  steps: [drain, record]\nbounds:\n  enforce: true\n",
			check: func(t *testing.T, c Config) {
				assert.Equal(t, []string{"deployguard.io/record", "deployguard.io/drain"}, c.CleanupFinalizers())
				assert.True(t, c.WebhookOptions("guard").BoundsEnforce)
			},
		},
		{
			name: "the former addFinalizers still loads, as both steps",
			doc:  "apiVersion: deployguard.io/v1alpha1\nkind: GuardConfig\ndefaults:\n  addFinalizers: true\n",
			check: func(t *testing.T, c Config) {
				assert.Equal(t, []string{"deployguard.io/record", "deployguard.io/drain"}, c.CleanupFinalizers())
			},
		},
		{
			name:    "audit settings are checked",
			doc:     "apiVersion: deployguard.io/v1alpha1\nkind: GuardConfig\naudit:\n  period: 5s\n  rate: 0\n  reportFormat: kyverno\n",
			wantErr: []string{"line 4: audit.period", "line 5: audit.rate", "line 6: audit.reportFormat"},
		},
		{
			name: "the openreports.io format",
			doc:  "apiVersion: deployguard.io/v1alpha1\nkind: GuardConfig\naudit:\n  reportFormat: openreports.io/v1alpha1\n  rate: 50\n",
			check: func(t *testing.T, c Config) {
				assert.Equal(t, "openreports.io/v1alpha1", c.Audit.ReportFormat)
				assert.InDelta(t, 50.0, c.Audit.Rate, 0)
				assert.True(t, c.Audit.Enabled)
			},
		},
		{
			name:    "an unknown cleanup step names the line",
			doc:     "apiVersion: deployguard.io/v1alpha1\nkind: GuardConfig\ncleanup:\n  steps: [record, backup]\n",
			wantErr: []string{"line 4: cleanup.steps", `unknown cleanup step "backup"`},
		},
		{
			name: "the record budget: defaults, and overrides",
			doc:  "apiVersion: deployguard.io/v1alpha1\nkind: GuardConfig\ncleanup:\n  recordsPerNamespace: 3\n  maxRecordBytes: 1000\n",
			check: func(t *testing.T, c Config) {
				assert.Equal(t, reconciler.RecordBudget{Records: 3, Bytes: reconciler.DefaultRecordBytesPerNamespace, RecordBytes: 1000}, c.RecordBudget())
			},
		},
		{
			name:    "a record larger than a ConfigMap holds is refused",
			doc:     "apiVersion: deployguard.io/v1alpha1\nkind: GuardConfig\ncleanup:\n  maxRecordBytes: 2000000\n",
			wantErr: []string{"line 4: cleanup.maxRecordBytes", "at most 1048576"},
		},
		{
			name:    "a namespace's bytes smaller than one record are refused",
			doc:     "apiVersion: deployguard.io/v1alpha1\nkind: GuardConfig\ncleanup:\n  recordBytesPerNamespace: 1000\n  recordsPerNamespace: 0\n",
			wantErr: []string{"cleanup.recordBytesPerNamespace", "at least twice maxRecordBytes", "cleanup.recordsPerNamespace", "must be at least 2"},
		},
		{
			name:    "a namespace's budget must hold two records of the largest size",
			doc:     "apiVersion: deployguard.io/v1alpha1\nkind: GuardConfig\ncleanup:\n  recordBytesPerNamespace: 1500\n  maxRecordBytes: 1000\n  recordsPerNamespace: 1\n",
			wantErr: []string{"line 4: cleanup.recordBytesPerNamespace", "at least twice maxRecordBytes", "line 6: cleanup.recordsPerNamespace", "must be at least 2"},
		},
		{
			name:    "addFinalizers beside cleanup.steps is refused",
			doc:     "apiVersion: deployguard.io/v1alpha1\nkind: GuardConfig\ndefaults:\n  addFinalizers: true\ncleanup:\n  steps: [record]\n",
			wantErr: []string{"line 4: defaults.addFinalizers", "replaced by cleanup.steps"},
		},
		{
			name:    "unknown field names the field and the line",
			doc:     "apiVersion: deployguard.io/v1alpha1\nkind: GuardConfig\ndefaults:\n  revisionHistoryLimt: 5\n",
			wantErr: []string{"line 4", "revisionHistoryLimt"},
		},
		{
			name:    "syntax error names the line",
			doc:     "apiVersion: deployguard.io/v1alpha1\nkind: GuardConfig\nbounds: [\n",
			wantErr: []string{"line"},
		},
		{
			name:    "wrong type names the line",
			doc:     "apiVersion: deployguard.io/v1alpha1\nkind: GuardConfig\ndefaults:\n  progressDeadlineSeconds: soon\n",
			wantErr: []string{"line 4", "soon"},
		},
		{
			name: "invalid values are all reported with field and line",
			doc: `apiVersion: deployguard.io/v1alpha1
kind: GuardConfig
bounds:
  revisionHistoryLimit:
    min: -1
    max: 5
rollback:
  quarantine: sometimes
policy:
  evalTimeout: 10s
`,
			wantErr: []string{
				"line 5: bounds.revisionHistoryLimit.min",
				"line 8: rollback.quarantine",
				"line 10: policy.evalTimeout",
				// The default of 10 no longer fits in the new bounds.
				"defaults.revisionHistoryLimit",
			},
		},
		{
			name:    "zero surge and zero unavailable is refused",
			doc:     "apiVersion: deployguard.io/v1alpha1\nkind: GuardConfig\ndefaults:\n  strategy:\n    maxSurge: \"0\"\n    maxUnavailable: 0%\n",
			wantErr: []string{"line 6: defaults.strategy.maxUnavailable", "cannot both be 0"},
		},
		{
			name:    "bad percentage",
			doc:     "apiVersion: deployguard.io/v1alpha1\nkind: GuardConfig\ndefaults:\n  strategy:\n    maxSurge: 150%\n",
			wantErr: []string{"line 5: defaults.strategy.maxSurge"},
		},
		{
			name:    "bad duration",
			doc:     "apiVersion: deployguard.io/v1alpha1\nkind: GuardConfig\ncleanup:\n  drainTimeout: forever\n",
			wantErr: []string{"line 4", "not a duration"},
		},
		{
			name:    "wrong kind",
			doc:     "apiVersion: v1\nkind: ConfigMap\n",
			wantErr: []string{"line 1: apiVersion", "line 2: kind"},
		},
		{
			name:    "empty file",
			doc:     "",
			wantErr: []string{"empty"},
		},
		{
			name:    "empty stable label key is named by index",
			doc:     "apiVersion: deployguard.io/v1alpha1\nkind: GuardConfig\nselector:\n  stableLabelKeys:\n  - app\n  - \"\"\n",
			wantErr: []string{"line 6: selector.stableLabelKeys[1]"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse([]byte(tt.doc))
			if len(tt.wantErr) == 0 {
				require.NoError(t, err)
				tt.check(t, c)
				return
			}
			require.Error(t, err)
			for _, w := range tt.wantErr {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}

func TestLoad(t *testing.T) {
	c, err := Load("")
	require.NoError(t, err)
	assert.Equal(t, Default(), c)

	_, err = Load(filepath.Join(t.TempDir(), "missing.yaml"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "reading config file")

	p := filepath.Join(t.TempDir(), "guard.yaml")
	require.NoError(t, os.WriteFile(p, []byte("apiVersion: deployguard.io/v1alpha1\nkind: GuardConfig\nbogus: 1\n"), 0o600))
	_, err = Load(p)
	require.Error(t, err)
	assert.Contains(t, err.Error(), p)
	assert.Contains(t, err.Error(), "line 3")
}

func TestDefaultIsValid(t *testing.T) {
	c := Default()
	assert.Empty(t, c.Validate())
}

// The file the install ships (config/manager/guard.yaml) lists the defaults:
// it must say what the guard does without it.
func TestShippedFileIsTheDefaults(t *testing.T) {
	c, err := Load(filepath.Join("..", "..", "..", "config", "manager", "guard.yaml"))
	require.NoError(t, err)
	want := Default()
	want.Policy.Modes = map[string]string{}
	want.Cleanup.Steps = []string{}
	assert.Equal(t, want, c)
}

// Whether the mutating webhook must see every Deployment, or only those the
// shipped matchCondition sends it.
func TestChangesEveryDeployment(t *testing.T) {
	parse := func(extra string) Config {
		c, err := Parse([]byte("apiVersion: deployguard.io/v1alpha1\nkind: GuardConfig\n" + extra))
		require.NoError(t, err)
		return c
	}
	assert.False(t, parse("").ChangesEveryDeployment(), "the default configuration")
	assert.False(t, parse("defaults:\n  revisionHistoryLimit: 10\n").ChangesEveryDeployment(), "the API server's own values, written out")
	assert.True(t, parse("defaults:\n  strategy: {maxUnavailable: \"0\"}\n").ChangesEveryDeployment())
	assert.True(t, parse("defaults:\n  progressDeadlineSeconds: 300\n").ChangesEveryDeployment())
	assert.True(t, parse("cleanup:\n  steps: [record]\n").ChangesEveryDeployment())
}

// The config file's fail-fast defaults are the reconciler's.
func TestFailFastDefaultsAreTheReconcilers(t *testing.T) {
	assert.Equal(t, reconciler.DefaultFailFastOptions(), Default().FailFastOptions())
}
