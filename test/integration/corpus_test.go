package integration

import (
	"context"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"

	"github.com/deployguard/deployguard/test/harness"
)

// A default install lets through every Deployment the API server accepts,
// except those the documented rollout-safety checks refuse. The corpus is
// what real clusters are fed: the Deployments of popular public charts,
// rendered with their default values, and those of upstream's own e2e suite
// (testdata/*/SOURCES.md says where each came from). Each is created for real
// through the deployed webhook configuration, as the default configuration
// (built-in policies in warn) judges it: warnings, no denial.
func TestDefaultInstallAdmitsPublicChartsAndUpstreamManifests(t *testing.T) {
	ctx := context.Background()
	c, warnings := clientAs(t, "")
	admitted, warned, apiServerRefused := 0, 0, 0
	seen := map[string]int{}
	// create creates d in ns, or with update sends it as a whole-object
	// Update (PUT) without a resourceVersion, as the clients the corpus
	// comes from do.
	create := func(t *testing.T, ns string, d *appsv1.Deployment, update bool) {
		t.Helper()
		before := len(warnings.all())
		d.Namespace = ns
		var err error
		if update {
			err = c.Update(ctx, d)
		} else {
			err = c.Create(ctx, d)
		}
		if err != nil && !strings.Contains(err.Error(), "admission webhook") && !strings.Contains(err.Error(), "ValidatingAdmissionPolicy 'deployguard-") {
			// The API server's own validation refuses it (a chart whose
			// defaults are incomplete): outside what the guard answers for.
			t.Logf("Deployment %s is refused by the API server itself: %v", d.Name, err)
			apiServerRefused++
			return
		}
		require.NoError(t, err, "Deployment %s was refused by the guard", d.Name)
		admitted++
		if w := warnings.all()[before:]; len(w) > 0 {
			warned++
			for _, x := range w {
				seen[policyOf(x)]++
			}
		}
	}

	t.Run("charts", func(t *testing.T) {
		// Every chart's Deployments in one namespace, as a platform's shared
		// tools namespace holds them: the overlap check runs across charts.
		ns := harness.NewNamespace(t, k8s, kept)
		files, err := filepath.Glob(filepath.Join("testdata", "charts", "*.yaml"))
		require.NoError(t, err)
		require.GreaterOrEqual(t, len(files), 40, "the chart corpus")
		n := 0
		for _, f := range files {
			for _, d := range readCorpus(t, f) {
				create(t, ns, d, false)
				n++
			}
		}
		t.Logf("%d Deployments from %d charts applied", n, len(files))
	})

	t.Run("upstream", func(t *testing.T) {
		// As upstream's suite applies them: a namespace per spec, the
		// guestbook's three files together, the kubectl files as three
		// versions of one Deployment.
		dir := filepath.Join("testdata", "upstream")
		guestbook := harness.NewNamespace(t, k8s, kept)
		kubectl := harness.NewNamespace(t, k8s, kept)
		files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
		require.NoError(t, err)
		require.NotEmpty(t, files)
		var last string // the namespace of the last document created
		for _, f := range files {
			base := filepath.Base(f)
			for _, d := range readCorpus(t, f) {
				switch {
				case strings.HasPrefix(base, "guestbook-"):
					create(t, guestbook, d, false)
				case strings.HasPrefix(base, "kubectl-agnhost-deployment"):
					create(t, kubectl, d, base != "kubectl-agnhost-deployment1.yaml")
				case d.Name == "test-deployment" && d.Labels["test-deployment"] == "updated":
					// The lifecycle spec's full Update of the one before it.
					create(t, last, d, true)
				default:
					last = harness.NewNamespace(t, k8s, kept)
					create(t, last, d, false)
				}
			}
		}
	})

	var kinds []string
	for k, n := range seen {
		kinds = append(kinds, k+": "+strconv.Itoa(n))
	}
	sort.Strings(kinds)
	t.Logf("%d Deployments admitted, %d with warnings, %d refused by the API server itself; warnings by source: %s",
		admitted, warned, apiServerRefused, strings.Join(kinds, ", "))
	assert.LessOrEqual(t, apiServerRefused, 2, "the corpus is of Deployments the API server accepts")
	assert.Positive(t, warned, "the built-in policies warn about the corpus (most charts set no resource requests)")
}

// policyOf names what a warning comes from: "[policy x]" or the Go check's
// field.
func policyOf(w string) string {
	if rest, ok := strings.CutPrefix(w, "[policy "); ok {
		if i := strings.IndexByte(rest, ']'); i > 0 {
			return "policy " + rest[:i]
		}
	}
	if i := strings.IndexByte(w, ':'); i > 0 {
		return w[:i]
	}
	return w
}
