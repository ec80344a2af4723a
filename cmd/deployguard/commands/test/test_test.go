package test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/deployguard/deployguard/cmd/deployguard/cli"
)

const teamRego = `package deployguard.team

deny contains "add a team label" if not input.object.metadata.labels.team
`

func TestTestPolicies(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "team.rego", teamRego)
	writeFile(t, dir, "team_test.rego", `package deployguard.team

test_unlabelled_denied if count(deny) == 1 with input as {"object": {"metadata": {}}}

test_labelled_allowed if count(deny) == 0 with input as {"object": {"metadata": {"labels": {"team": "a"}}}}
`)
	failing := t.TempDir()
	writeFile(t, failing, "team.rego", teamRego)
	writeFile(t, failing, "sub/team_test.rego", `package deployguard.team

test_wrong_expectation if count(deny) == 0 with input as {"object": {"metadata": {}}}
`)
	broken := t.TempDir()
	writeFile(t, broken, "team.rego", "package deployguard.team\n\ndeny contains x if {\n")

	tests := []struct {
		name     string
		args     []string
		wantCode int
		wantOut  string
		wantErr  string
	}{
		{name: "passing tests", args: []string{"-v", dir}, wantCode: 0, wantOut: "2 passed, 0 failed"},
		{name: "a failing test names the file and line", args: []string{failing}, wantCode: 1, wantOut: "FAIL deployguard.team.test_wrong_expectation " + filepath.Join(failing, "sub", "team_test.rego") + ":3"},
		{name: "a parse error names the file and line", args: []string{broken}, wantCode: 2, wantErr: filepath.Join(broken, "team.rego") + ":"},
		{name: "no tests", args: []string{t.TempDir()}, wantCode: 2, wantErr: "no Rego tests"},
		{name: "no directory", args: nil, wantCode: 2, wantErr: "usage"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := cli.Run(NewCommand, tt.args, nil, &stdout, &stderr)
			assert.Equal(t, tt.wantCode, code, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
			assert.Contains(t, stdout.String(), tt.wantOut)
			assert.Contains(t, stderr.String(), tt.wantErr)
		})
	}
}

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
	require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
	return p
}
