package upstream

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	lifecycle = "[sig-apps] Deployment should run the lifecycle of a Deployment [Conformance]"
	reaping   = "[sig-apps] Deployment deployment reaping should cascade to its replica sets and pods"
)

// testdata/report.json is a real ginkgo report of the upstream binary, cut to
// a suite node, a spec the focus left out, an excluded spec, a passed spec
// with the guard's admission warnings and a failed one.
func TestReadReport(t *testing.T) {
	got, err := readReport("testdata/report.json")
	require.NoError(t, err)
	assert.Len(t, got, 2, "only selected, not excluded specs: %v", got)

	require.Contains(t, got, lifecycle)
	assert.Equal(t, "passed", got[lifecycle].State)
	assert.Empty(t, got[lifecycle].Failure)
	require.Len(t, got[lifecycle].Warnings, 6)
	assert.Equal(t, `[policy probes] spec.template.spec.containers[0].readinessProbe: container "test-deployment" has no readinessProbe: add one (httpGet, tcpSocket, grpc or exec), or a rollout of pods that cannot serve completes anyway and is never rolled back`,
		got[lifecycle].Warnings[0], "unquoted, without the klog prefix")

	require.Contains(t, got, reaping)
	assert.Equal(t, result{State: "failed", Failure: "expected the Deployment to be gone", Seconds: 6}, got[reaping])
}

func TestComparePassRule(t *testing.T) {
	passed, failed := result{State: "passed"}, result{State: "failed", Failure: "boom"}
	listed := map[string]difference{reaping: {Spec: reaping, Behaviour: "b", README: "r"}}
	tests := []struct {
		name          string
		before, after map[string]result
		diffs         map[string]difference
		verdicts      map[string]string
		fails         bool
	}{
		{
			name:   "same results pass",
			before: map[string]result{lifecycle: passed, reaping: passed}, after: map[string]result{lifecycle: passed, reaping: passed},
			verdicts: map[string]string{lifecycle: "same", reaping: "same"},
		},
		{
			name:   "a spec broken by the guard fails the tier",
			before: map[string]result{lifecycle: passed}, after: map[string]result{lifecycle: failed},
			verdicts: map[string]string{lifecycle: "BROKEN BY THE GUARD"}, fails: true,
		},
		{
			name:   "a listed difference is allowed",
			before: map[string]result{lifecycle: passed, reaping: passed}, after: map[string]result{lifecycle: passed, reaping: failed},
			diffs: listed, verdicts: map[string]string{lifecycle: "same", reaping: "listed difference"},
		},
		{
			name:   "a listed difference that passes anyway fails the tier",
			before: map[string]result{reaping: passed}, after: map[string]result{reaping: passed},
			diffs: listed, verdicts: map[string]string{reaping: "same (listed as a difference)"}, fails: true,
		},
		{
			name:   "a spec that fails without the guard proves nothing and fails the tier",
			before: map[string]result{lifecycle: failed}, after: map[string]result{lifecycle: failed},
			verdicts: map[string]string{lifecycle: "not comparable"}, fails: true,
		},
		{
			name:   "a difference naming a spec the tier does not run fails the tier",
			before: map[string]result{lifecycle: passed}, after: map[string]result{lifecycle: passed},
			diffs: listed, verdicts: map[string]string{lifecycle: "same"}, fails: true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rows, problems := compare(tc.before, tc.after, tc.diffs)
			got := map[string]string{}
			for _, r := range rows {
				got[r.Spec] = r.Verdict
			}
			assert.Equal(t, tc.verdicts, got)
			assert.Equal(t, tc.fails, len(problems) > 0, "problems: %q", problems)
		})
	}
}

func TestGuardWarnings(t *testing.T) {
	apiServer := "metadata.name: this is used in Pod names and hostnames, which can result in surprising behavior; a DNS label is recommended: [must not contain dots]"
	guard := "[policy probes] spec.template.spec.containers[0].readinessProbe: container \"nginx\" has no readinessProbe"
	r := row{WithoutGuard: result{Warnings: []string{apiServer}}, WithGuard: result{Warnings: []string{apiServer, guard, guard}}}
	assert.Equal(t, []string{guard, guard}, guardWarnings(r), "the API server's own warnings are not the guard's")
}
