package harness

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The Flux controllers the GitOps tier runs, built from their Go modules by
// test/tools/flux (whose go.mod must require these versions; BuildFlux checks).
// v1.9.x is the newest line that builds with Go 1.26: v1.10 needs Go 1.27.
const (
	FluxSourceControllerVersion    = "v1.9.6"
	FluxKustomizeControllerVersion = "v1.9.6"
)

const (
	fluxSourceModule    = "github.com/fluxcd/source-controller"
	fluxKustomizeModule = "github.com/fluxcd/kustomize-controller"
)

// FluxToolsDir is the module that builds the Flux controllers, kept apart from
// the main module so that Flux's dependency versions never constrain
// deployguard's.
func FluxToolsDir() string { return filepath.Join(RepoRoot(), "test", "tools", "flux") }

// fluxModuleDir is the module cache folder of module at the version the tools
// module requires, downloading it when needed.
func fluxModuleDir(ctx context.Context, module string) (string, error) {
	list := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", module)
	list.Dir = FluxToolsDir()
	out, err := list.Output()
	if err == nil && strings.TrimSpace(string(out)) != "" {
		return strings.TrimSpace(string(out)), nil
	}
	dl := exec.CommandContext(ctx, "go", "mod", "download", "-json", module)
	dl.Dir = FluxToolsDir()
	if out, err = dl.Output(); err != nil {
		return "", fmt.Errorf("downloading %s: %w", module, err)
	}
	var m struct{ Dir, Error string }
	if err := json.Unmarshal(out, &m); err != nil {
		return "", fmt.Errorf("finding %s in the module cache: %w", module, err)
	}
	if m.Dir == "" {
		return "", fmt.Errorf("finding %s in the module cache: %s", module, m.Error)
	}
	return m.Dir, nil
}

// FluxCRDs are the CRD files that ship in the controllers' modules
// (config/crd/bases): source.toolkit.fluxcd.io's and kustomize.toolkit.fluxcd.io's.
func FluxCRDs(ctx context.Context) ([]string, error) {
	var files []string
	for _, m := range []string{fluxSourceModule, fluxKustomizeModule} {
		dir, err := fluxModuleDir(ctx, m)
		if err != nil {
			return nil, err
		}
		found, err := filepath.Glob(filepath.Join(dir, "config", "crd", "bases", "*.yaml"))
		if err != nil || len(found) == 0 {
			return nil, fmt.Errorf("no CRDs in %s/config/crd/bases", dir)
		}
		files = append(files, found...)
	}
	return files, nil
}

// BuildFlux builds source-controller and kustomize-controller from test/tools/flux
// into bin/tools/flux-VERSION and returns their paths. Go's build cache makes a
// second build take seconds; the first takes minutes (about 2,500 packages).
func BuildFlux(ctx context.Context, out io.Writer) (srcBin, kustBin string, err error) {
	list := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Path}} {{.Version}}", fluxSourceModule, fluxKustomizeModule)
	list.Dir = FluxToolsDir()
	got, err := list.Output()
	if err != nil {
		return "", "", fmt.Errorf("reading the Flux versions of %s: %w", list.Dir, exitErr(err))
	}
	want := fluxSourceModule + " " + FluxSourceControllerVersion + "\n" + fluxKustomizeModule + " " + FluxKustomizeControllerVersion + "\n"
	if string(got) != want {
		return "", "", fmt.Errorf("test/tools/flux/go.mod requires\n%swhile the harness expects\n%s", got, want)
	}
	dir := filepath.Join(RepoRoot(), "bin", "tools", "flux-"+FluxSourceControllerVersion)
	if FluxKustomizeControllerVersion != FluxSourceControllerVersion {
		dir += "-" + FluxKustomizeControllerVersion
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", "-s -w", "-o", dir+string(filepath.Separator),
		fluxSourceModule, fluxKustomizeModule)
	cmd.Dir = FluxToolsDir()
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = io.MultiWriter(logOr(out), &buf), io.MultiWriter(logOr(out), &buf)
	if err := cmd.Run(); err != nil {
		return "", "", fmt.Errorf("building the Flux controllers: %w\n%s", err, tail(buf.String(), 2000))
	}
	return filepath.Join(dir, "source-controller"), filepath.Join(dir, "kustomize-controller"), nil
}

// InstallFluxCRDs applies the Flux controllers' CRDs from their modules and
// waits until they are established.
func (c *Cluster) InstallFluxCRDs(ctx context.Context) error {
	files, err := FluxCRDs(ctx)
	if err != nil {
		return err
	}
	apply := []string{"apply", "--server-side", "--force-conflicts"}
	wait := []string{"wait", "--for=condition=Established", "--timeout=60s"}
	for _, f := range files {
		apply = append(apply, "-f", f)
		// GROUP_PLURAL.yaml holds the CRD named PLURAL.GROUP.
		group, plural, ok := strings.Cut(strings.TrimSuffix(filepath.Base(f), ".yaml"), "_")
		if !ok {
			return fmt.Errorf("unexpected CRD file name %s", f)
		}
		wait = append(wait, "crd/"+plural+"."+group)
	}
	if _, err := c.Kubectl(ctx, c.Kubeconfig, apply...); err != nil {
		return err
	}
	_, err = c.Kubectl(ctx, c.Kubeconfig, wait...)
	return err
}

// FluxOptions start source-controller and kustomize-controller.
type FluxOptions struct {
	SourceController    string // binary, from BuildFlux
	KustomizeController string // binary, from BuildFlux
	// Kubeconfig is the identity both controllers run with (the admin's, as
	// Flux's own cluster-admin service accounts).
	Kubeconfig string
	// WorkDir holds source-controller's artifact storage and the controllers'
	// temporary folders.
	WorkDir string
	// SourceArgs and KustomizeArgs are added after the harness's flags, which
	// they override (a flag given twice takes its last value), such as
	// "--feature-gates=CancelHealthCheckOnNewRevision=true".
	SourceArgs, KustomizeArgs []string
	// Output receives both controllers' logs (JSON lines, whose "controller"
	// names the reconciler).
	Output io.Writer
}

// Flux is source-controller and kustomize-controller running as processes.
type Flux struct {
	Opts      FluxOptions
	Source    *Process
	Kustomize *Process
	// StorageAddr is source-controller's artifact server (127.0.0.1:PORT),
	// which it advertises in every artifact's URL and kustomize-controller
	// downloads from.
	StorageAddr string
	// Health addresses serve /readyz and /healthz; Metrics ones /metrics.
	SourceHealth, KustomizeHealth   string
	SourceMetrics, KustomizeMetrics string
}

// FluxDependencyRequeue is how soon the controllers look again at a source
// that has no artifact yet or a dependency that is not ready (30s in Flux).
const FluxDependencyRequeue = 2 * time.Second

// StartFlux runs source-controller and kustomize-controller against the
// cluster of o.Kubeconfig, every address on 127.0.0.1, leader election off,
// watching all namespaces, and returns once both are ready. Every Flux object
// still reconciles at its own spec.interval; a test wanting an immediate
// reconcile sets spec.interval short or annotates the object with
// reconcile.fluxcd.io/requestedAt.
func StartFlux(ctx context.Context, o FluxOptions) (f *Flux, err error) {
	f = &Flux{Opts: o}
	defer func() {
		if err != nil {
			_ = f.Stop()
		}
	}()
	ports := make([]int, 5)
	for i := range ports {
		if ports[i], err = FreePort(); err != nil {
			return f, err
		}
	}
	addr := func(p int) string { return "127.0.0.1:" + strconv.Itoa(p) }
	f.StorageAddr = addr(ports[0])
	f.SourceHealth, f.SourceMetrics = addr(ports[1]), addr(ports[2])
	f.KustomizeHealth, f.KustomizeMetrics = addr(ports[3]), addr(ports[4])

	storage := filepath.Join(o.WorkDir, "source-controller", "storage")
	srcTmp := filepath.Join(o.WorkDir, "source-controller", "tmp")
	kustTmp := filepath.Join(o.WorkDir, "kustomize-controller", "tmp")
	for _, d := range []string{storage, srcTmp, kustTmp} {
		if err = os.MkdirAll(d, 0o755); err != nil {
			return f, err
		}
	}
	// Flags shared by both (fluxcd/pkg/runtime): one process each, no
	// leader election; all namespaces; retries of failed reconciles back off
	// from 750ms to at most 5s (not 15m); no interval jitter, so that an
	// interval is what a test sets.
	common := []string{
		"--enable-leader-election=false",
		"--watch-all-namespaces=true",
		"--min-retry-delay=750ms",
		"--max-retry-delay=5s",
		"--interval-jitter-percentage=0",
		"--requeue-dependency=" + FluxDependencyRequeue.String(),
		"--log-level=info",
	}
	srcArgs := append([]string{
		"--storage-path=" + storage,
		"--storage-addr=" + f.StorageAddr,
		"--storage-adv-addr=" + f.StorageAddr,
		"--health-addr=" + f.SourceHealth,
		"--metrics-addr=" + f.SourceMetrics,
	}, common...)
	kustArgs := append([]string{
		"--health-addr=" + f.KustomizeHealth,
		"--metrics-addr=" + f.KustomizeMetrics,
		// Nothing outside this machine can be reached.
		"--no-remote-bases=true",
	}, common...)
	// The kubeconfig goes by $KUBECONFIG: controller-runtime's --kubeconfig is a
	// Go flag the controllers' pflag command lines do not parse. TMPDIR is the
	// process's own, as kustomize-controller deletes every
	// "kustomization-*" folder of TMPDIR when it starts.
	env := func(tmp string) []string {
		return append(os.Environ(), "KUBECONFIG="+o.Kubeconfig, "TMPDIR="+tmp)
	}
	if f.Source, err = startProcess(o.SourceController, append(srcArgs, o.SourceArgs...), env(srcTmp), o.Output); err != nil {
		return f, fmt.Errorf("starting source-controller: %w", err)
	}
	if f.Kustomize, err = startProcess(o.KustomizeController, append(kustArgs, o.KustomizeArgs...), env(kustTmp), o.Output); err != nil {
		return f, fmt.Errorf("starting kustomize-controller: %w", err)
	}
	if err = f.WaitReady(ctx, time.Minute); err != nil {
		return f, err
	}
	return f, nil
}

func startProcess(bin string, args, env []string, out io.Writer) (*Process, error) {
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = logOr(out), logOr(out)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &Process{cmd: cmd, done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait() }()
	return p, nil
}

// WaitReady waits until both controllers answer /readyz (their managers have
// started), failing at once if either exits.
func (f *Flux) WaitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	hc := &http.Client{Timeout: 2 * time.Second}
	for _, c := range []struct {
		name, addr string
		p          *Process
	}{{"source-controller", f.SourceHealth, f.Source}, {"kustomize-controller", f.KustomizeHealth, f.Kustomize}} {
		for {
			if c.p.Exited() {
				err := <-c.p.done
				c.p.done <- err
				return fmt.Errorf("%s exited: %w", c.name, err)
			}
			resp, err := hc.Get("http://" + c.addr + "/readyz")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("%s not ready at %s: %w", c.name, c.addr, ctx.Err())
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	return nil
}

// Stop ends both controllers.
func (f *Flux) Stop() error {
	if f == nil {
		return nil
	}
	var errs []error
	if f.Kustomize != nil {
		if err := f.Kustomize.Stop(); err != nil {
			errs = append(errs, fmt.Errorf("kustomize-controller: %w", err))
		}
	}
	if f.Source != nil {
		if err := f.Source.Stop(); err != nil {
			errs = append(errs, fmt.Errorf("source-controller: %w", err))
		}
	}
	return errors.Join(errs...)
}

// OCIRegistry is a read-only OCI registry (the pull side of the distribution
// API: manifests by tag or digest, blobs, tag lists) served over plain HTTP on
// 127.0.0.1 from the test process, holding Flux artifacts that the test
// publishes with PushDir or PushFiles. An OCIRepository reads it with
// spec.insecure: true and spec.url: r.URL(repo).
type OCIRegistry struct {
	// Host is 127.0.0.1:PORT.
	Host string
	srv  *httptest.Server

	mu        sync.Mutex
	blobs     map[string][]byte            // digest → content, manifests included
	tags      map[string]map[string]string // repository → tag → manifest digest
	manifests map[string]int               // pulls of a manifest by repository, for tests
}

// StartOCIRegistry serves an empty registry until Close.
func StartOCIRegistry() *OCIRegistry {
	r := &OCIRegistry{blobs: map[string][]byte{}, tags: map[string]map[string]string{}, manifests: map[string]int{}}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	r.Host = strings.TrimPrefix(r.srv.URL, "http://")
	return r
}

// Close stops serving.
func (r *OCIRegistry) Close() { r.srv.Close() }

// URL is the OCIRepository spec.url of repository repo, such as "apps/web".
func (r *OCIRegistry) URL(repo string) string { return "oci://" + r.Host + "/" + repo }

// ManifestGets is how many times the manifest of repo was read (GET, not HEAD).
func (r *OCIRegistry) ManifestGets(repo string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.manifests[repo]
}

// The format of `flux push artifact` (fluxcd/pkg/oci): an OCI image manifest
// whose config has Flux's media type, with one layer, the gzipped tarball of
// a folder, and the OpenContainers annotations.
const (
	ociManifestMediaType   = "application/vnd.oci.image.manifest.v1+json"
	fluxConfigMediaType    = "application/vnd.cncf.flux.config.v1+json"
	fluxContentMediaType   = "application/vnd.cncf.flux.content.v1.tar+gzip"
	ociCreatedAnnotation   = "org.opencontainers.image.created"
	ociSourceAnnotation    = "org.opencontainers.image.source"
	ociRevisionAnnotation  = "org.opencontainers.image.revision"
	fluxArtifactCreateTime = "2020-01-01T00:00:00Z" // fixed: the same content is the same digest
)

type ociDescriptor struct {
	MediaType string `json:"mediaType"`
	Digest    string `json:"digest"`
	Size      int64  `json:"size"`
}

// PushDir publishes the files under dir (regular files and folders; symlinks
// are skipped, as Flux does) as a Flux artifact tagged tag in repository repo,
// and returns the manifest's digest ("sha256:…"). source-controller names the
// revision "TAG@DIGEST". Pushing the same content again yields the same
// digest, so a tag moved back to earlier content is that earlier revision.
func (r *OCIRegistry) PushDir(repo, tag, dir string) (string, error) {
	layer, diffID, err := fluxTarball(dir)
	if err != nil {
		return "", err
	}
	config, err := json.Marshal(map[string]any{
		"architecture": "", "os": "", "created": fluxArtifactCreateTime, "config": map[string]any{},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{diffID}},
	})
	if err != nil {
		return "", err
	}
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     ociManifestMediaType,
		"config":        ociDescriptor{MediaType: fluxConfigMediaType, Digest: sha256Digest(config), Size: int64(len(config))},
		"layers":        []ociDescriptor{{MediaType: fluxContentMediaType, Digest: sha256Digest(layer), Size: int64(len(layer))}},
		"annotations": map[string]string{
			ociCreatedAnnotation:  fluxArtifactCreateTime,
			ociSourceAnnotation:   r.URL(repo),
			ociRevisionAnnotation: tag,
		},
	})
	if err != nil {
		return "", err
	}
	digest := sha256Digest(manifest)
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, b := range [][]byte{config, layer, manifest} {
		r.blobs[sha256Digest(b)] = b
	}
	if r.tags[repo] == nil {
		r.tags[repo] = map[string]string{}
	}
	r.tags[repo][tag] = digest
	return digest, nil
}

// PushFiles is PushDir of a folder holding files (slash-separated relative
// path → content).
func (r *OCIRegistry) PushFiles(repo, tag string, files map[string]string) (string, error) {
	dir, err := os.MkdirTemp("", "flux-artifact-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	for name, content := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if !strings.HasPrefix(p, dir+string(filepath.Separator)) {
			return "", fmt.Errorf("file %q outside the artifact", name)
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return "", err
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return "", err
		}
	}
	return r.PushDir(repo, tag, dir)
}

// fluxTarball is the tar+gzip of dir as fluxcd/pkg/tar writes it: entries
// relative to dir (the folder itself as "."), in walk order, owners and times
// cleared. It returns the compressed bytes and the uncompressed digest.
func fluxTarball(dir string) ([]byte, string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, "", err
	}
	switch fi, err := os.Stat(abs); {
	case err != nil:
		return nil, "", fmt.Errorf("not a folder: %w", err)
	case !fi.IsDir():
		return nil, "", fmt.Errorf("not a folder: %s", abs)
	}
	var gz bytes.Buffer
	raw := sha256.New()
	zw := gzip.NewWriter(&gz)
	tw := tar.NewWriter(io.MultiWriter(zw, raw))
	err = filepath.WalkDir(abs, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if t := d.Type(); !t.IsRegular() && !t.IsDir() {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		h, err := tar.FileInfoHeader(fi, p)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(abs, p)
		if err != nil {
			return err
		}
		h.Name = filepath.ToSlash(rel)
		h.Uid, h.Gid, h.Uname, h.Gname = 0, 0, "", ""
		h.ModTime, h.AccessTime, h.ChangeTime = time.Time{}, time.Time{}, time.Time{}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		_, err = tw.Write(b)
		return err
	})
	if err != nil {
		return nil, "", err
	}
	// The tar writer writes into the gzip writer: close it first.
	if err := tw.Close(); err != nil {
		return nil, "", err
	}
	if err := zw.Close(); err != nil {
		return nil, "", err
	}
	return gz.Bytes(), "sha256:" + hex.EncodeToString(raw.Sum(nil)), nil
}

func sha256Digest(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

func (r *OCIRegistry) serve(w http.ResponseWriter, req *http.Request) {
	w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		ociError(w, http.StatusMethodNotAllowed, "UNSUPPORTED", "this registry is read-only")
		return
	}
	path := strings.TrimPrefix(req.URL.Path, "/v2/")
	if path == req.URL.Path {
		http.NotFound(w, req)
		return
	}
	if path == "" {
		w.WriteHeader(http.StatusOK)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if repo, ok := strings.CutSuffix(path, "/tags/list"); ok {
		tags := make([]string, 0, len(r.tags[repo]))
		for t := range r.tags[repo] {
			tags = append(tags, t)
		}
		if len(tags) == 0 {
			ociError(w, http.StatusNotFound, "NAME_UNKNOWN", "repository "+repo+" not known")
			return
		}
		sort.Strings(tags)
		b, _ := json.Marshal(map[string]any{"name": repo, "tags": tags})
		writeBlob(w, req, "application/json", "", b)
		return
	}
	if i := strings.LastIndex(path, "/manifests/"); i > 0 {
		repo, ref := path[:i], path[i+len("/manifests/"):]
		digest := ref
		if !strings.HasPrefix(ref, "sha256:") {
			digest = r.tags[repo][ref]
		}
		b, ok := r.blobs[digest]
		if _, known := r.tags[repo]; digest == "" || !ok || !known {
			ociError(w, http.StatusNotFound, "MANIFEST_UNKNOWN", "manifest "+ref+" not known in "+repo)
			return
		}
		if req.Method == http.MethodGet {
			r.manifests[repo]++
		}
		writeBlob(w, req, ociManifestMediaType, digest, b)
		return
	}
	if i := strings.LastIndex(path, "/blobs/"); i > 0 {
		digest := path[i+len("/blobs/"):]
		b, ok := r.blobs[digest]
		if !ok {
			ociError(w, http.StatusNotFound, "BLOB_UNKNOWN", "blob "+digest+" not known")
			return
		}
		writeBlob(w, req, "application/octet-stream", digest, b)
		return
	}
	ociError(w, http.StatusNotFound, "NAME_UNKNOWN", "no such endpoint")
}

func writeBlob(w http.ResponseWriter, req *http.Request, mediaType, digest string, b []byte) {
	w.Header().Set("Content-Type", mediaType)
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	if digest != "" {
		w.Header().Set("Docker-Content-Digest", digest)
	}
	w.WriteHeader(http.StatusOK)
	if req.Method == http.MethodGet {
		_, _ = w.Write(b)
	}
}

func ociError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	b, _ := json.Marshal(map[string]any{"errors": []map[string]string{{"code": code, "message": msg}}})
	_, _ = w.Write(b)
}
