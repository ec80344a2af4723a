package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/deployguard/deployguard/test/harness"
)

// verdict is what a user sees of one Deployment's admission.
type verdict struct {
	Admitted bool
	Problems []string // "field: message", sorted
	Warnings []string // sorted
}

// The webhooks (through a real kube-apiserver) and `deployguard check` (the
// built binary, offline) give the same verdict and the same messages on every
// Deployment of one corpus.
func TestCheckAndWebhookAgree(t *testing.T) {
	bin, err := harness.GuardBinary()
	require.NoError(t, err)
	corpus := filepath.Join("testdata", "parity", "corpus.yaml")
	ns := newNamespace(t, nil)

	out, err := exec.Command(bin, "check", "-o", "json", "--namespace", ns, "-f", corpus).Output()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		require.Equal(t, 1, exit.ExitCode(), "exit 1: something in the corpus is denied; stderr: %s", exit.Stderr)
	} else {
		require.NoError(t, err)
		t.Fatal("check admitted a corpus that holds denied Deployments")
	}
	var results []struct {
		Kind     string `json:"kind"`
		Name     string `json:"name"`
		Verdict  string `json:"verdict"`
		Problems []struct {
			Field   string `json:"field"`
			Message string `json:"message"`
		} `json:"problems"`
		Warnings []string `json:"warnings"`
	}
	require.NoError(t, json.Unmarshal(out, &results), "%s", out)
	offline := map[string]verdict{}
	for _, r := range results {
		if r.Kind != "Deployment" {
			assert.Equal(t, "skipped", r.Verdict, "%s is passed over", r.Kind)
			continue
		}
		v := verdict{Admitted: r.Verdict == "admitted", Warnings: sorted(r.Warnings)}
		for _, p := range r.Problems {
			v.Problems = append(v.Problems, p.Field+": "+p.Message)
		}
		v.Problems = sorted(v.Problems)
		offline[r.Name] = v
	}

	deployments := readCorpus(t, corpus)
	require.Len(t, offline, len(deployments))
	c, warnings := clientAs(t, "")
	denied := 0
	for _, d := range deployments {
		t.Run(d.Name, func(t *testing.T) {
			d.Namespace = ns
			before := len(warnings.all())
			err := c.Create(context.Background(), d, client.DryRunAll)
			online := verdict{Admitted: err == nil, Warnings: sorted(warnings.all()[before:])}
			if err != nil {
				denied++
				online.Problems = sorted(causes(t, err))
			}
			assert.Equal(t, offline[d.Name], online, "check and the webhooks disagree")
		})
	}
	assert.Positive(t, denied, "the corpus exercises refusals")
}

func readCorpus(t *testing.T, path string) []*appsv1.Deployment {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	rd := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
	var out []*appsv1.Deployment
	for {
		doc, err := rd.Read()
		if err != nil {
			break
		}
		var head struct{ Kind string }
		require.NoError(t, yaml.Unmarshal(doc, &head))
		if head.Kind != "Deployment" {
			continue
		}
		d := &appsv1.Deployment{}
		require.NoError(t, yaml.UnmarshalStrict(doc, d))
		out = append(out, d)
	}
	return out
}

// causes returns the refusal's problems as "field: message", as the API
// server relays them from the webhook.
func causes(t *testing.T, err error) []string {
	t.Helper()
	var st apierrors.APIStatus
	require.True(t, errors.As(err, &st), "%v", err)
	var out []string
	if d := st.Status().Details; d != nil {
		for _, c := range d.Causes {
			out = append(out, c.Field+": "+c.Message)
		}
	}
	require.NotEmpty(t, out, "the refusal carries its causes: %v", err)
	return out
}

func sorted(xs []string) []string {
	if len(xs) == 0 {
		return nil
	}
	out := append([]string(nil), xs...)
	for i := range out {
		out[i] = strings.TrimSpace(out[i])
	}
	sort.Strings(out)
	return out
}
