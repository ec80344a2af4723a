package image_test

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/deployguard/deployguard/cmd/deployguard/cli"
	"github.com/deployguard/deployguard/cmd/deployguard/commands/serve"
	"github.com/deployguard/deployguard/test/image"
)

// repoRoot is the module's root, from this package's directory.
const repoRoot = "../.."

// testVersion stamps the images the tests build.
const testVersion = "v0.0.0-test"

// distroless is what the Dockerfile's base image gives its final stage, as
// GoogleContainerTools/distroless builds static-debian12:nonroot
// (static/static.bzl, common/BUILD.bazel): its config, and the files of it
// that the Go image lays down too. test/image/base.go says why each is there
// and why the rest is left out.
var distroless = struct {
	ref    string
	config v1.Config
	// leftOutEnv: variables of the base the Go image does not set, and why.
	leftOutEnv map[string]string
	// files: the base's paths the Go image has (with what is under them).
	files []string
}{
	ref: "gcr.io/distroless/static-debian12:nonroot",
	config: v1.Config{
		User:       "65532",
		WorkingDir: "/home/nonroot",
		Env: []string{
			"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
			"SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
		},
	},
	leftOutEnv: map[string]string{
		"SSL_CERT_FILE": "no CA bundle: the guard calls only the API server, trusting its service account's CA",
	},
	files: []string{"/etc/passwd", "/etc/group", "/home/nonroot", "/root", "/tmp", "/usr/share/zoneinfo"},
}

// dockerfile is the Dockerfile's final stage: the config it makes from
// distroless's, what it copies, and its build stage's `go build`.
type dockerfile struct {
	from   string
	config v1.Config
	copied []copied
	build  goBuild
}

func readDockerfile(t *testing.T) dockerfile {
	t.Helper()
	stages := parseDockerfile(t, filepath.Join(repoRoot, "Dockerfile"))
	require.GreaterOrEqual(t, len(stages), 2, "a build stage and a final stage")
	final := stages[len(stages)-1]
	require.Equal(t, image.DistrolessBase, final.from, "the Dockerfile's final stage is FROM another base than test/image lays down: look again at base.go and at distroless in this test")
	require.Equal(t, distroless.ref, final.from)
	cfg, copied := finalStage(t, final, distroless.config)
	args := argDefaults(stages[0])
	args["VERSION"] = testVersion
	return dockerfile{from: final.from, config: cfg, copied: copied, build: findGoBuild(t, stages[0], args)}
}

// zoneinfo is a stand-in for Go's zoneinfo.zip: two zones.
func zoneinfo(t *testing.T) []byte {
	t.Helper()
	var b bytes.Buffer
	zw := zip.NewWriter(&b)
	for _, name := range []string{"UTC", "Europe/Paris"} {
		w, err := zw.Create(name)
		require.NoError(t, err)
		_, err = w.Write([]byte("TZif2 " + name))
		require.NoError(t, err)
	}
	require.NoError(t, zw.Close())
	return b.Bytes()
}

// guardImage is the guard's image, as `make image` builds it, around a
// stand-in binary.
func guardImage(t *testing.T) (v1.Image, *v1.ConfigFile, map[string]image.Entry) {
	t.Helper()
	img, err := image.Guard(image.Binary{Data: []byte("\x7fELF stand-in"), Arch: "amd64"}, zoneinfo(t))
	require.NoError(t, err)
	cf, err := img.ConfigFile()
	require.NoError(t, err)
	files, err := image.Files(img)
	require.NoError(t, err)
	return img, cf, files
}

// content reads one file of img.
func content(t *testing.T, img v1.Image, p string) string {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			require.FailNowf(t, "not in the image", "%s is not in the image", p)
		}
		require.NoError(t, err)
		if path.Clean("/"+h.Name) == p {
			b, err := io.ReadAll(tr)
			require.NoError(t, err)
			return string(b)
		}
	}
}

// uidGID reads a config's User as numbers; ok is false for a name.
func uidGID(user string) (uid, gid int, ok bool) {
	u, g, hasGroup := strings.Cut(user, ":")
	uid, err := strconv.Atoi(u)
	if err != nil {
		return 0, 0, false
	}
	gid = uid
	if hasGroup {
		if gid, err = strconv.Atoi(g); err != nil {
			return 0, 0, false
		}
	}
	return uid, gid, true
}

// writable reports whether uid/gid may create entries in directory e.
func writable(e image.Entry, uid, gid int) bool {
	switch {
	case uid == 0:
		return true
	case e.UID == uid:
		return e.Mode&0o300 == 0o300
	case e.GID == gid:
		return e.Mode&0o030 == 0o030
	default:
		return e.Mode&0o003 == 0o003
	}
}

// defaultCertDir is serve's --cert-dir default, read from the command
// itself: a guard started without the flag writes there in self-managed
// mode.
func defaultCertDir(t *testing.T) string {
	t.Helper()
	f := serve.NewCommand(cli.Streams{In: &bytes.Buffer{}, Out: io.Discard, ErrOut: io.Discard}).Flags().Lookup("cert-dir")
	require.NotNil(t, f, "serve has no --cert-dir: change this test with it")
	require.NotEmpty(t, f.DefValue, "serve's --cert-dir has no default: change this test with it")
	return f.DefValue
}

// TestGuardImageIsTheDockerfiles compares the Go-built image's config and
// files with what the Dockerfile's final stage makes of its base.
func TestGuardImageIsTheDockerfiles(t *testing.T) {
	df := readDockerfile(t)
	img, cf, files := guardImage(t)
	got := cf.Config

	want := df.config
	for k := range distroless.leftOutEnv {
		var env []string
		for _, e := range want.Env {
			if !strings.HasPrefix(e, k+"=") {
				env = append(env, e)
			}
		}
		want.Env = env
	}
	t.Run("config", func(t *testing.T) {
		assert.Equal(t, want.Entrypoint, got.Entrypoint, "ENTRYPOINT")
		assert.Equal(t, want.Cmd, got.Cmd, "CMD")
		assert.Equal(t, want.User, got.User, "USER")
		assert.Equal(t, want.WorkingDir, got.WorkingDir, "WORKDIR (distroless nonroot's, unless the Dockerfile sets one)")
		assert.Equal(t, want.Env, got.Env, "ENV: the base's (less %v) and the Dockerfile's", sortedKeys(distroless.leftOutEnv))
		assert.Equal(t, sortedKeys(want.ExposedPorts), sortedKeys(got.ExposedPorts), "EXPOSE")
		assert.Equal(t, want.Labels, got.Labels, "LABEL")
		assert.Empty(t, got.Volumes, "VOLUME: the Dockerfile has none")
		assert.Empty(t, got.StopSignal, "STOPSIGNAL: the Dockerfile has none")
		assert.Nil(t, got.Healthcheck, "HEALTHCHECK: the Dockerfile has none")
		assert.Equal(t, "linux", cf.OS)
	})

	uid, gid, numeric := uidGID(got.User)
	t.Run("files", func(t *testing.T) {
		for _, c := range df.copied {
			f, ok := files[c.dest]
			if !assert.True(t, ok, "the Dockerfile copies %s; the image lacks it", c.dest) {
				continue
			}
			assert.False(t, f.Dir, c.dest)
			assert.Empty(t, c.chown, "COPY --chown: owner 0:0 is what the Go image gives")
			assert.Equal(t, [2]int{0, 0}, [2]int{f.UID, f.GID}, "%s: COPY leaves it root's", c.dest)
			if c.chmod == "" {
				assert.Equal(t, os.FileMode(0o755), f.Mode, "%s: as go build left it", c.dest)
			}
		}
		require.NotEmpty(t, got.Entrypoint)
		ep, ok := files[got.Entrypoint[0]]
		if assert.True(t, ok, "the entrypoint %s is in the image", got.Entrypoint[0]) {
			assert.False(t, ep.Dir)
			assert.NotZero(t, ep.Mode&0o001, "the entrypoint is executable by anyone, the image's user included")
		}

		require.True(t, numeric, "USER %q is numeric (kubelet checks runAsNonRoot only with a numeric user)", got.User)
		assert.NotZero(t, uid, "USER is not root")
		home, ok := files[got.WorkingDir]
		if assert.True(t, ok, "the working directory %s is in the image", got.WorkingDir) {
			assert.True(t, home.Dir)
			assert.Equal(t, [2]int{uid, gid}, [2]int{home.UID, home.GID}, "the working directory is the user's, as distroless nonroot's home is")
		}
		assert.Contains(t, strings.Split(content(t, img, "/etc/passwd"), "\n"),
			"nonroot:x:"+strconv.Itoa(uid)+":"+strconv.Itoa(gid)+":nonroot:"+got.WorkingDir+":/sbin/nologin",
			"/etc/passwd names the user, with the working directory as its home (the runtime's HOME)")
		assert.Contains(t, strings.Split(content(t, img, "/etc/group"), "\n"), "nonroot:x:"+strconv.Itoa(gid)+":")
		assert.Equal(t, os.ModeSticky|0o777, files["/tmp"].Mode, "/tmp is 1777, as in distroless")
		assert.Contains(t, files, "/usr/share/zoneinfo/Europe/Paris", "the zone database, for Rego's time builtins with a zone")

		// Started without --cert-dir, in self-managed mode, the guard
		// creates serve's default directory: the user can.
		dir := defaultCertDir(t)
		for ; dir != "/"; dir = path.Dir(dir) {
			if _, ok := files[dir]; ok {
				break
			}
		}
		assert.True(t, writable(files[dir], uid, gid), "the user %d may create serve's --cert-dir default %s under %s", uid, defaultCertDir(t), dir)

		// Nothing else: each path is copied by the Dockerfile or is one of
		// the base's that base.go lays down.
		for p := range files {
			if accountedFor(p, df.copied) {
				continue
			}
			assert.Fail(t, "a file neither the Dockerfile nor its base has", p)
		}
	})
}

// accountedFor reports whether p is a file the Dockerfile copies, one of
// distroless's the Go image has, under one, or a directory that leads to one.
func accountedFor(p string, copied []copied) bool {
	var known []string
	for _, c := range copied {
		known = append(known, c.dest)
	}
	known = append(known, distroless.files...)
	for _, k := range known {
		if p == k || strings.HasPrefix(p, k+"/") || strings.HasPrefix(k, p+"/") {
			return true
		}
	}
	return false
}

// TestGuardBuildIsTheDockerfiles checks that image-build's check of the
// binary (image.GuardBuild) asks for what the Dockerfile's `go build` does,
// and that it takes a binary built that way and refuses one built otherwise.
func TestGuardBuildIsTheDockerfiles(t *testing.T) {
	df := readDockerfile(t)
	want := image.GuardBuild(testVersion)
	assert.Equal(t, want.Env, df.build.env, "the build's environment")
	assert.Equal(t, want.Trimpath, df.build.trimpath, "-trimpath")
	assert.Equal(t, want.LDFlags(), df.build.ldflags, "-ldflags")

	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module stub\n\ngo 1.26\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), []byte("package main\n\nvar version = \"dev\"\n\nfunc main() { println(version) }\n"), 0o644))
	build := func(name, ldflags string) string {
		out := filepath.Join(dir, name)
		args := []string{"build"}
		if df.build.trimpath {
			args = append(args, "-trimpath")
		}
		cmd := exec.Command("go", append(args, "-ldflags", ldflags, "-o", out, ".")...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-buildvcs=false")
		for k, v := range df.build.env {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		b, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", b)
		return out
	}

	asDockerfile := build("as-the-dockerfile", df.build.ldflags)
	bin, err := image.ReadBinary(asDockerfile, want)
	require.NoError(t, err, "a binary built as the Dockerfile builds it")
	assert.NotEmpty(t, bin.Arch)

	_, err = image.ReadBinary(asDockerfile, image.GuardBuild("v9.9.9-other"))
	assert.ErrorContains(t, err, `does not hold its version "v9.9.9-other"`)

	_, err = image.ReadBinary(build("not-stripped", "-X main.version="+testVersion), want)
	assert.ErrorContains(t, err, "section: build it with -ldflags \"-s -w\"", "not stripped")

	self, err := os.Executable()
	require.NoError(t, err)
	_, err = image.ReadBinary(self, want)
	assert.Error(t, err, "this test binary: built by go test, neither static for sure nor with -trimpath")
}

// rendered is the guard's Deployment as kustomize renders a config/ base; the
// install tier (TestChartMatchesKustomize) checks that the chart renders the
// same Deployment with its default values and in self-managed mode.
func rendered(t *testing.T, base string) appsv1.Deployment {
	t.Helper()
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), filepath.Join(repoRoot, "config", base))
	require.NoError(t, err)
	for _, r := range m.Resources() {
		if r.GetKind() != "Deployment" || r.GetName() != "deployguard" {
			continue
		}
		b, err := r.AsYAML()
		require.NoError(t, err)
		var d appsv1.Deployment
		require.NoError(t, yaml.Unmarshal(b, &d))
		return d
	}
	require.FailNowf(t, "no Deployment", "config/%s renders no Deployment deployguard", base)
	return appsv1.Deployment{}
}

// flagValue is the value of --name in args, and whether it is there.
func flagValue(args []string, name string) (string, bool) {
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
		if a == "--"+name && i+1 < len(args) {
			return args[i+1], true
		}
	}
	return "", false
}

// mountFor is the volume mount that holds p, the deepest one.
func mountFor(c corev1.Container, p string) (corev1.VolumeMount, bool) {
	var best corev1.VolumeMount
	found := false
	for _, m := range c.VolumeMounts {
		if (p == m.MountPath || strings.HasPrefix(p, strings.TrimSuffix(m.MountPath, "/")+"/")) && len(m.MountPath) >= len(best.MountPath) {
			best, found = m, true
		}
	}
	return best, found
}

// TestManifestsRunTheImage checks the install manifests (config/default and
// config/self-managed, which the chart renders too) against the image: its
// name, its command, its ports, its user and a read-only root file system.
func TestManifestsRunTheImage(t *testing.T) {
	_, cf, _ := guardImage(t)
	uid, gid, numeric := uidGID(cf.Config.User)
	require.True(t, numeric)
	for _, base := range []string{"default", "self-managed"} {
		t.Run(base, func(t *testing.T) {
			d := rendered(t, base)
			pod := d.Spec.Template.Spec
			var c corev1.Container
			for _, x := range pod.Containers {
				if x.Name == "deployguard" {
					c = x
				}
			}
			require.Equal(t, "deployguard", c.Name, "the guard's container")

			repo, tag, _ := strings.Cut(c.Image, ":")
			assert.Equal(t, image.GuardRepository, repo, "the image's name")
			assert.Contains(t, image.GuardTags(testVersion), tag, "a tag make image writes")

			assert.Empty(t, c.Command, "the image's ENTRYPOINT runs")
			if assert.NotEmpty(t, c.Args) {
				assert.Equal(t, cf.Config.Cmd[0], c.Args[0], "the manifests run the subcommand the image's CMD runs")
			}

			ports := map[string]struct{}{}
			for _, p := range c.Ports {
				proto := strings.ToLower(string(p.Protocol))
				if proto == "" {
					proto = "tcp"
				}
				ports[strconv.Itoa(int(p.ContainerPort))+"/"+proto] = struct{}{}
			}
			assert.Equal(t, sortedKeys(cf.Config.ExposedPorts), sortedKeys(ports), "the container's ports are the image's EXPOSE")

			psc, csc := pod.SecurityContext, c.SecurityContext
			if psc == nil {
				psc = &corev1.PodSecurityContext{}
			}
			if csc == nil {
				csc = &corev1.SecurityContext{}
			}
			nonRoot := csc.RunAsNonRoot
			if nonRoot == nil {
				nonRoot = psc.RunAsNonRoot
			}
			require.NotNil(t, nonRoot, "runAsNonRoot is set")
			if *nonRoot {
				assert.NotZero(t, uid, "runAsNonRoot: the image's user is not root, or kubelet refuses to start it")
			}
			for _, u := range []*int64{psc.RunAsUser, csc.RunAsUser} {
				if u != nil {
					assert.Equal(t, int64(uid), *u, "runAsUser is the image's user, who owns its working directory")
				}
			}
			for _, g := range []*int64{psc.RunAsGroup, csc.RunAsGroup} {
				if g != nil {
					assert.Equal(t, int64(gid), *g, "runAsGroup is the image's group")
				}
			}

			require.NotNil(t, csc.ReadOnlyRootFilesystem)
			require.True(t, *csc.ReadOnlyRootFilesystem, "the guard's root file system is read-only")
			// So every file the guard reads from the pod or writes is on a
			// volume: its config, its certificates, and in self-managed
			// mode the certificate directory is written.
			certDir, ok := flagValue(c.Args, "cert-dir")
			if !ok {
				certDir = defaultCertDir(t)
			}
			selfManaged := false
			if mode, ok := flagValue(c.Args, "cert-mode"); ok && mode == "self-managed" {
				selfManaged = true
			}
			m, ok := mountFor(c, certDir)
			if assert.True(t, ok, "--cert-dir %s is on a volume", certDir) {
				assert.Equal(t, !selfManaged, m.ReadOnly, "--cert-dir %s is writable exactly when the guard writes it (self-managed)", certDir)
			}
			for _, name := range []string{"config", "client-ca-file", "policy-dir"} {
				if p, ok := flagValue(c.Args, name); ok {
					_, mounted := mountFor(c, p)
					assert.True(t, mounted, "--%s %s is on a volume", name, p)
				}
			}
		})
	}
}
