package image_test

import (
	"encoding/json"
	"os"
	"path"
	"sort"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/stretchr/testify/require"
)

// The subset of the Dockerfile syntax that ours uses, read well enough to
// compare with the image built in Go. Anything else in the final stage fails
// the test (finalStage): the Go image would not know what it means.

// instruction is one logical line of a Dockerfile.
type instruction struct {
	cmd  string // upper case: FROM, RUN, COPY, …
	args string
	line int
}

// stage is a FROM and what follows it.
type stage struct {
	from, name string
	ins        []instruction
}

// parseDockerfile splits a Dockerfile into stages of instructions, joining
// continuation lines and dropping comments (parser directives such as
// `# syntax=` included).
func parseDockerfile(t *testing.T, p string) []stage {
	t.Helper()
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	var (
		stages  []stage
		pending strings.Builder
		start   int
	)
	for i, raw := range strings.Split(string(b), "\n") {
		l := strings.TrimSpace(raw)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		if pending.Len() == 0 {
			start = i + 1
		}
		if cont, ok := strings.CutSuffix(l, `\`); ok {
			pending.WriteString(cont + " ")
			continue
		}
		pending.WriteString(l)
		cmd, args, _ := strings.Cut(pending.String(), " ")
		pending.Reset()
		in := instruction{cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args), line: start}
		require.NotContains(t, in.args, "<<", "%s:%d: heredocs are not read here", p, in.line)
		if in.cmd == "FROM" {
			w := shellWords(t, in.args)
			for len(w) > 0 && strings.HasPrefix(w[0], "--") {
				w = w[1:]
			}
			require.NotEmpty(t, w, "%s:%d: FROM names no image", p, in.line)
			s := stage{from: w[0]}
			if len(w) == 3 && strings.EqualFold(w[1], "AS") {
				s.name = w[2]
			}
			stages = append(stages, s)
			continue
		}
		require.NotEmpty(t, stages, "%s:%d: %s before FROM", p, in.line, in.cmd)
		stages[len(stages)-1].ins = append(stages[len(stages)-1].ins, in)
	}
	require.Zero(t, pending.Len(), "%s ends in a continuation", p)
	return stages
}

// shellWords splits s into words as a POSIX shell would for the plain words
// and quotes our Dockerfile uses: no expansion, no escapes inside quotes.
func shellWords(t *testing.T, s string) []string {
	t.Helper()
	var (
		words []string
		w     strings.Builder
		in    bool // inside a word
		quote rune
	)
	for _, r := range s {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			w.WriteRune(r)
		case r == '"' || r == '\'':
			quote, in = r, true
		case r == ' ' || r == '\t':
			if in {
				words = append(words, w.String())
				w.Reset()
				in = false
			}
		default:
			w.WriteRune(r)
			in = true
		}
	}
	require.Zero(t, quote, "unterminated quote in %q", s)
	if in {
		words = append(words, w.String())
	}
	return words
}

// execForm reads the JSON array of ENTRYPOINT or CMD. The shell form would
// run /bin/sh, which the image does not have.
func execForm(t *testing.T, in instruction) []string {
	t.Helper()
	var v []string
	require.NoError(t, json.Unmarshal([]byte(in.args), &v), "line %d: %s in the shell form: the image has no shell; use the exec form", in.line, in.cmd)
	return v
}

// copied is a file the final stage copies in.
type copied struct {
	dest  string
	chown string
	chmod string
}

// finalStage is the image the Dockerfile's last stage makes: the config it
// sets over its base's, and the files it copies. base is the config of the
// stage's FROM image.
func finalStage(t *testing.T, s stage, base v1.Config) (v1.Config, []copied) {
	t.Helper()
	c := *base.DeepCopy()
	var files []copied
	for _, in := range s.ins {
		switch in.cmd {
		case "ARG":
			// Build arguments do not reach the image's config.
		case "USER":
			c.User = in.args
		case "WORKDIR":
			d := in.args
			if !path.IsAbs(d) {
				d = path.Join(c.WorkingDir, d)
			}
			c.WorkingDir = d
		case "EXPOSE":
			if c.ExposedPorts == nil {
				c.ExposedPorts = map[string]struct{}{}
			}
			for _, p := range shellWords(t, in.args) {
				if !strings.Contains(p, "/") {
					p += "/tcp"
				}
				c.ExposedPorts[p] = struct{}{}
			}
		case "ENTRYPOINT":
			// A new ENTRYPOINT drops the CMD the base had.
			c.Entrypoint, c.Cmd = execForm(t, in), nil
		case "CMD":
			c.Cmd = execForm(t, in)
		case "ENV":
			w := shellWords(t, in.args)
			if len(w) >= 2 && !strings.Contains(w[0], "=") { // ENV key value
				w = []string{w[0] + "=" + strings.Join(w[1:], " ")}
			}
			for _, kv := range w {
				k, _, ok := strings.Cut(kv, "=")
				require.True(t, ok, "line %d: ENV %q", in.line, kv)
				c.Env = setEnv(c.Env, k, kv)
			}
		case "LABEL":
			if c.Labels == nil {
				c.Labels = map[string]string{}
			}
			for _, kv := range shellWords(t, in.args) {
				k, v, ok := strings.Cut(kv, "=")
				require.True(t, ok, "line %d: LABEL %q", in.line, kv)
				c.Labels[k] = v
			}
		case "COPY":
			w := shellWords(t, in.args)
			var f copied
			for len(w) > 0 && strings.HasPrefix(w[0], "--") {
				k, v, _ := strings.Cut(strings.TrimPrefix(w[0], "--"), "=")
				switch k {
				case "from":
				case "chown":
					f.chown = v
				case "chmod":
					f.chmod = v
				default:
					require.FailNowf(t, "COPY flag", "line %d: COPY --%s is not read here", in.line, k)
				}
				w = w[1:]
			}
			require.Len(t, w, 2, "line %d: COPY of one file is read here, not %q", in.line, in.args)
			f.dest = w[1]
			if strings.HasSuffix(f.dest, "/") {
				f.dest += path.Base(w[0])
			}
			if !path.IsAbs(f.dest) {
				f.dest = path.Join(c.WorkingDir, f.dest)
			}
			files = append(files, f)
		default:
			require.FailNowf(t, "instruction", "line %d: the final stage's %s is not modelled by test/image: teach the Go image (test/image) and this test what it does", in.line, in.cmd)
		}
	}
	return c, files
}

// setEnv sets key to kv (key=value) in env, in place if it is there, as
// Docker does.
func setEnv(env []string, key, kv string) []string {
	for i, e := range env {
		if strings.HasPrefix(e, key+"=") {
			env[i] = kv
			return env
		}
	}
	return append(env, kv)
}

// goBuild is the `go build` of a stage's RUN: its environment, flags and
// output, with ARG defaults and the given values substituted.
type goBuild struct {
	env      map[string]string
	trimpath bool
	ldflags  string
	out      string
}

// findGoBuild finds the one RUN of stage s that runs `go build`.
func findGoBuild(t *testing.T, s stage, args map[string]string) goBuild {
	t.Helper()
	var found []goBuild
	for _, in := range s.ins {
		if in.cmd != "RUN" || !strings.Contains(in.args, "go build") {
			continue
		}
		expanded := in.args
		for k, v := range args {
			expanded = strings.ReplaceAll(strings.ReplaceAll(expanded, "${"+k+"}", v), "$"+k, v)
		}
		w := shellWords(t, expanded)
		for len(w) > 0 && strings.HasPrefix(w[0], "--") { // RUN --mount=…
			w = w[1:]
		}
		b := goBuild{env: map[string]string{}}
		for len(w) > 0 && strings.Contains(w[0], "=") {
			k, v, _ := strings.Cut(w[0], "=")
			b.env[k] = v
			w = w[1:]
		}
		require.GreaterOrEqual(t, len(w), 2, "line %d", in.line)
		require.Equal(t, []string{"go", "build"}, w[:2], "line %d: one command, `go build`, is read here", in.line)
		w = w[2:]
		for len(w) > 0 && strings.HasPrefix(w[0], "-") {
			switch w[0] {
			case "-trimpath":
				b.trimpath = true
				w = w[1:]
			case "-ldflags", "-o":
				require.Len(t, w[:2], 2, "line %d: %s without a value", in.line, w[0])
				if w[0] == "-o" {
					b.out = w[1]
				} else {
					b.ldflags = w[1]
				}
				w = w[2:]
			default:
				require.FailNowf(t, "go build flag", "line %d: go build %s is not modelled by test/image.Build: teach it, and image-build's check", in.line, w[0])
			}
		}
		require.Len(t, w, 1, "line %d: one package is built, not %v", in.line, w)
		found = append(found, b)
	}
	require.Len(t, found, 1, "the build stage runs `go build` once")
	return found[0]
}

// argDefaults are the ARG defaults of a stage.
func argDefaults(s stage) map[string]string {
	d := map[string]string{}
	for _, in := range s.ins {
		if in.cmd == "ARG" {
			k, v, _ := strings.Cut(in.args, "=")
			d[k] = v
		}
	}
	return d
}

// sortedKeys lists a set's keys in order, for messages.
func sortedKeys[V any](m map[string]V) []string {
	k := make([]string, 0, len(m))
	for s := range m {
		k = append(k, s)
	}
	sort.Strings(k)
	return k
}
