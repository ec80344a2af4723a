package promscope

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEnforceNamespace(t *testing.T) {
	cases := []struct {
		name    string
		query   string
		want    string
		wantErr error
		errText string
	}{
		{name: "bare metric", query: `up`, want: `up{namespace="team-a"}`},
		{name: "matchers kept", query: `http_requests_total{code=~"5..",job="web"}`, want: `http_requests_total{code=~"5..",job="web",namespace="team-a"}`},
		{name: "own namespace kept once", query: `up{namespace="team-a"}`, want: `up{namespace="team-a"}`},
		{name: "name only in braces", query: `{__name__=~"http_.*"}`, want: `{__name__=~"http_.*",namespace="team-a"}`},
		{name: "range selector", query: `rate(http_requests_total[5m])`, want: `rate(http_requests_total{namespace="team-a"}[5m])`},
		{name: "subquery", query: `max_over_time(rate(errors_total[1m])[10m:1m])`, want: `max_over_time(rate(errors_total{namespace="team-a"}[1m])[10m:1m])`},
		{name: "binary op, both sides", query: `sum(rate(errors_total[1m])) / sum(rate(requests_total[1m]))`,
			want: `sum(rate(errors_total{namespace="team-a"}[1m])) / sum(rate(requests_total{namespace="team-a"}[1m]))`},
		{name: "binary op with vector matching", query: `a / on(pod) group_left b`, want: `a{namespace="team-a"} / on (pod) group_left () b{namespace="team-a"}`},
		{name: "aggregation with by", query: `histogram_quantile(0.99, sum by (le) (rate(latency_bucket[5m])))`,
			want: `histogram_quantile(0.99, sum by (le) (rate(latency_bucket{namespace="team-a"}[5m])))`},
		{name: "offset and @", query: `up offset 5m`, want: `up{namespace="team-a"} offset 5m`},
		{name: "scalar only", query: `1 + 1`, want: `1 + 1`},
		{name: "another namespace refused", query: `up{namespace="team-b"}`, wantErr: ErrOtherNamespace},
		{name: "another namespace inside a binary op refused", query: `up / up{namespace="kube-system"}`, wantErr: ErrOtherNamespace},
		{name: "another namespace inside a subquery refused", query: `max_over_time(up{namespace="team-b"}[5m:])`, wantErr: ErrOtherNamespace},
		{name: "regex matcher on namespace refused", query: `up{namespace=~"team-.*"}`, wantErr: ErrOtherNamespace},
		{name: "regex matcher naming only its own namespace refused too", query: `up{namespace=~"team-a"}`, wantErr: ErrOtherNamespace},
		{name: "negative matcher refused", query: `up{namespace!="team-a"}`, wantErr: ErrOtherNamespace},
		{name: "own and another refused", query: `up{namespace="team-a",namespace="team-b"}`, wantErr: ErrOtherNamespace},
		{name: "not PromQL", query: `sum(`, errText: "parsing the query"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := EnforceNamespace(tc.query, "team-a")
			switch {
			case tc.wantErr != nil:
				require.Error(t, err)
				assert.ErrorIs(t, err, tc.wantErr)
			case tc.errText != "":
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.errText)
			default:
				require.NoError(t, err)
				assert.Equal(t, tc.want, got)
				// Idempotent: a scoped query scopes to itself.
				again, err := EnforceNamespace(got, "team-a")
				require.NoError(t, err)
				assert.Equal(t, got, again)
			}
		})
	}
}

func TestEnforceNamespaceRefusesBadNamespace(t *testing.T) {
	_, err := EnforceNamespace(`up`, `a"} or up{x="`)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "namespace")
}

func TestQueryRender(t *testing.T) {
	vars := Vars{Namespace: "team-a", Name: "web", PodTemplateHash: "6c9f8d7b5"}
	cases := []struct {
		name     string
		template string
		vars     Vars
		want     string
		parseErr string
		renderEr string
	}{
		{name: "all three values", template: `sum(rate(http_requests_total{code=~"5..",deployment="{{ .Name }}",pod_template_hash="{{ .PodTemplateHash }}"}[1m]))`,
			vars: vars, want: `sum(rate(http_requests_total{code=~"5..",deployment="web",namespace="team-a",pod_template_hash="6c9f8d7b5"}[1m]))`},
		{name: "own namespace by template", template: `up{namespace="{{ .Namespace }}"}`, vars: vars, want: `up{namespace="team-a"}`},
		{name: "unknown name refused at parse", template: `up{x="{{ .Nope }}"}`, parseErr: "{{.Nope}}: only"},
		{name: "template syntax refused at parse", template: `up{x="{{ .Name "}`, parseErr: "query template"},
		{name: "not PromQL once rendered refused at parse", template: `sum(up{x="{{ .Name }}"}`, parseErr: "parsing the query"},
		{name: "another namespace refused at parse", template: `up{namespace="kube-system"}`, parseErr: "other than its own"},
		{name: "a name that is not a Kubernetes name refused", template: `up{deployment="{{ .Name }}"}`,
			vars: Vars{Namespace: "team-a", Name: `web"} or up{namespace="b`, PodTemplateHash: "x"}, renderEr: "template values"},
		{name: "a rendering past MaxRenderedLength refused", template: `up{x=~"` + strings.Repeat(`{{ .Name }}|`, 200) + `"}`,
			vars: Vars{Namespace: "team-a", Name: strings.Repeat("a", 200), PodTemplateHash: "x"}, renderEr: "longer than 32768 bytes"},
		{name: "the baseline's hash", template: `up{pod_template_hash="{{ .StablePodTemplateHash }}"}`,
			vars: Vars{Namespace: "team-a", Name: "web", PodTemplateHash: "new", StablePodTemplateHash: "7c6b5d4f8"}, want: `up{namespace="team-a",pod_template_hash="7c6b5d4f8"}`},
		{name: "no baseline: a query naming it is not rendered", template: `up{pod_template_hash="{{ .StablePodTemplateHash }}"}`,
			vars: Vars{Namespace: "team-a", Name: "web", PodTemplateHash: "new"}, renderEr: "no known-good revision to compare with"},
		{name: "no baseline: a query not naming it is rendered", template: `up{pod_template_hash="{{ .PodTemplateHash }}"}`,
			vars: Vars{Namespace: "team-a", Name: "web", PodTemplateHash: "new"}, want: `up{namespace="team-a",pod_template_hash="new"}`},
		{name: "range refused (a template is a program: a tenant's loop would spin the guard)", template: `{{ range 2000000000 }}{{ range 2000000000 }}{{ end }}{{ end }}up`, parseErr: "may be used"},
		{name: "if refused", template: `{{ if .Name }}up{{ end }}`, parseErr: "may be used"},
		{name: "a pipe refused", template: `up{x="{{ .Name | printf "%s" }}"}`, parseErr: "may be used"},
		{name: "a function refused", template: `up{x="{{ printf "%v" . }}"}`, parseErr: "may be used"},
		{name: "a variable refused", template: `up{x="{{ $x := .Name }}"}`, parseErr: "may be used"},
		{name: "define refused", template: `{{ define "x" }}up{{ end }}up`, parseErr: "not allowed"},
		{name: "a nested field refused", template: `up{x="{{ .Name.X }}"}`, parseErr: "may be used"},
		{name: "a comment is text", template: `up{x="{{ .Name }}"}{{/* the app's name */}}`, vars: vars, want: `up{namespace="team-a",x="web"}`},
		{name: "a bad baseline fails only the queries naming it", template: `up{h="{{ .PodTemplateHash }}"}`,
			vars: Vars{Namespace: "team-a", Name: "web", PodTemplateHash: "new", StablePodTemplateHash: strings.Repeat("x", 64)}, want: `up{h="new",namespace="team-a"}`},
		{name: "a bad baseline fails a query naming it", template: `up{h="{{ .StablePodTemplateHash }}"}`,
			vars: Vars{Namespace: "team-a", Name: "web", PodTemplateHash: "new", StablePodTemplateHash: strings.Repeat("x", 64)}, renderEr: "known-good revision's pod-template-hash"},
		{name: "empty hash allowed (label value)", template: `up{h="{{ .PodTemplateHash }}"}`, vars: Vars{Namespace: "team-a", Name: "web"}, want: `up{h="",namespace="team-a"}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			q, err := Parse(tc.template)
			if tc.parseErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.parseErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.template, q.String())
			got, err := q.Render(tc.vars)
			if tc.renderEr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.renderEr)
				assert.Equal(t, tc.vars.StablePodTemplateHash == "" && strings.Contains(tc.template, "StablePodTemplateHash"), errors.Is(err, ErrNoBaseline), "errors.Is(err, ErrNoBaseline)")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestEscapeString(t *testing.T) {
	cases := []struct{ name, in, want string }{
		{name: "plain", in: "team-a", want: "team-a"},
		{name: "quote", in: `a"b`, want: `a\"b`},
		{name: "backslash", in: `a\b`, want: `a\\b`},
		{name: "newline", in: "a\nb", want: `a\nb`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, escapeString(tc.in))
			// The escaped value round-trips through the PromQL lexer.
			got, err := EnforceNamespace(`up{x="`+escapeString(tc.in)+`"}`, "ns")
			require.NoError(t, err)
			assert.Contains(t, got, `x="`+tc.want+`"`)
		})
	}
}
