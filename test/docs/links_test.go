// Package docs checks the project's Markdown: every relative link names a
// file that exists, every anchor a heading of the file it points into, and
// every alert's runbook_url a runbook heading.
package docs

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/deployguard/deployguard/test/harness"
)

// slug is GitHub's anchor for a heading: lower case, links read as their
// text, everything but letters, digits, spaces, hyphens and underscores
// dropped, spaces made hyphens.
func slug(h string) string {
	h = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`).ReplaceAllString(h, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(h)) {
		switch {
		case unicode.IsLetter(r), unicode.IsDigit(r), r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}

var heading = regexp.MustCompile(`^(#{1,6}) (.*)$`)

// anchors are the anchors of a Markdown file's headings, with GitHub's
// -1, -2 suffixes for repeated ones; fenced code is not read.
func anchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	out, seen := map[string]bool{}, map[string]int{}
	fenced := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "```") {
			fenced = !fenced
			continue
		}
		if m := heading.FindStringSubmatch(l); m != nil && !fenced {
			s := slug(m[2])
			if n := seen[s]; n > 0 {
				out[fmt.Sprintf("%s-%d", s, n)] = true
			} else {
				out[s] = true
			}
			seen[s]++
		}
	}
	require.NoError(t, sc.Err())
	return out
}

// markdownFiles are the project's own Markdown files.
func markdownFiles(t *testing.T, root string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "bin" || d.Name() == "testdata" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			files = append(files, p)
		}
		return nil
	})
	require.NoError(t, err)
	require.NotEmpty(t, files)
	return files
}

var link = regexp.MustCompile(`\]\(([^)\s]+)\)`)

func TestMarkdownLinksResolve(t *testing.T) {
	root := harness.RepoRoot()
	cache := map[string]map[string]bool{}
	anchorsOf := func(p string) map[string]bool {
		if cache[p] == nil {
			cache[p] = anchors(t, p)
		}
		return cache[p]
	}
	for _, f := range markdownFiles(t, root) {
		rel, _ := filepath.Rel(root, f)
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		fenced := false
		for i, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "```") {
				fenced = !fenced
			}
			if fenced {
				continue
			}
			for _, m := range link.FindAllStringSubmatch(l, -1) {
				target := m[1]
				if regexp.MustCompile(`^[a-z]+:`).MatchString(target) {
					continue
				}
				path, frag, _ := strings.Cut(target, "#")
				dest := f
				if path != "" {
					dest = filepath.Join(filepath.Dir(f), path)
					if _, err := os.Stat(dest); err != nil {
						assert.Fail(t, "a link to no such file", "%s:%d: link to %s", rel, i+1, target)
						continue
					}
				}
				if frag != "" && strings.HasSuffix(dest, ".md") && !anchorsOf(dest)[frag] {
					assert.Fail(t, "a link to no such heading", "%s:%d: link to %s: no heading #%s there", rel, i+1, target, frag)
				}
			}
		}
	}
}

// Every alert's runbook_url is a heading of config/monitoring/README.md, on
// the project's home.
func TestRunbookURLsResolve(t *testing.T) {
	root := harness.RepoRoot()
	const prefix = "https://github.com/deployguard/deployguard/blob/main/config/monitoring/README.md#"
	b, err := os.ReadFile(filepath.Join(root, "config", "monitoring", "prometheusrule.yaml"))
	require.NoError(t, err)
	runbooks := anchors(t, filepath.Join(root, "config", "monitoring", "README.md"))
	urls := regexp.MustCompile(`runbook_url:\s*(\S+)`).FindAllStringSubmatch(string(b), -1)
	alerts := regexp.MustCompile(`- alert:\s*(\S+)`).FindAllStringSubmatch(string(b), -1)
	require.Len(t, urls, len(alerts), "every alert has a runbook_url")
	for i, m := range urls {
		url := m[1]
		if !assert.True(t, strings.HasPrefix(url, prefix), "%s: runbook_url %s is not in config/monitoring/README.md", alerts[i][1], url) {
			continue
		}
		frag := strings.TrimPrefix(url, prefix)
		assert.True(t, runbooks[frag], "%s: runbook_url names #%s, which config/monitoring/README.md has no heading for", alerts[i][1], frag)
		assert.Equal(t, strings.ToLower(alerts[i][1]), frag, "the runbook of %s is its own", alerts[i][1])
	}
}
