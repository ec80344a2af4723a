package policy

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestFindingString(t *testing.T) {
	tests := []struct {
		name string
		f    Finding
		want string
	}{
		{name: "with field", f: Finding{Policy: "images", Field: "spec.template.spec.containers[0].image", Message: `image "nginx:latest" …`},
			want: `[policy images] spec.template.spec.containers[0].image: image "nginx:latest" …`},
		{name: "without field", f: Finding{Policy: "team.replicas", Message: "use at least 2 replicas"},
			want: "[policy team.replicas] use at least 2 replicas"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, tt.f.String())
		})
	}
}

// TestJudge pins down where each mode and failure mode puts a finding.
func TestJudge(t *testing.T) {
	findings := outcome{deny: []any{"d"}, warn: []any{"w"}}
	failed := outcome{err: errors.New("boom")}
	tests := []struct {
		name                      string
		mode                      Mode
		out                       outcome
		fm                        FailureMode
		denied, warnings, audited int
		result                    string
	}{
		{name: "enforce deny refuses, warn warns", mode: ModeEnforce, out: findings, fm: FailureDeny, denied: 1, warnings: 1, result: ResultDeny},
		{name: "warn mode turns deny into a warning", mode: ModeWarn, out: findings, fm: FailureDeny, warnings: 2, result: ResultWarn},
		{name: "audit mode shows nothing", mode: ModeAudit, out: findings, fm: FailureDeny, audited: 2, result: ResultAudit},
		{name: "enforce with only warn", mode: ModeEnforce, out: outcome{warn: []any{"w"}}, fm: FailureDeny, warnings: 1, result: ResultWarn},
		{name: "nothing found", mode: ModeEnforce, out: outcome{}, fm: FailureDeny, result: ResultAllow},
		{name: "enforce failure under deny refuses", mode: ModeEnforce, out: failed, fm: FailureDeny, denied: 1, result: ResultError},
		{name: "enforce failure under allow warns", mode: ModeEnforce, out: failed, fm: FailureAllow, warnings: 1, result: ResultError},
		{name: "warn-mode failure warns even under deny", mode: ModeWarn, out: failed, fm: FailureDeny, warnings: 1, result: ResultError},
		{name: "audit-mode failure is audited", mode: ModeAudit, out: failed, fm: FailureDeny, audited: 1, result: ResultError},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := judge("p", tt.mode, tt.out, tt.fm)
			assert.Len(t, v.denied, tt.denied, "denied")
			assert.Len(t, v.warnings, tt.warnings, "warnings")
			assert.Len(t, v.audited, tt.audited, "audited")
			assert.Equal(t, tt.result, v.result)
			for _, f := range append(append(v.denied, v.warnings...), v.audited...) {
				assert.Equal(t, tt.mode, f.Mode)
				assert.Equal(t, "p", f.Policy)
				assert.Equal(t, tt.out.err != nil, f.EvalFailed)
			}
		})
	}
}
