// Package image builds the guard's container image, and the test app's images
// for the real-node tier, from Go code, without a Docker engine
// (go-containerregistry: a config and layers, written as an OCI image layout
// and as a tarball that `docker load` and `ctr images import` read).
//
// The guard's image must be the one the Dockerfile builds, which stays the
// way users build it: the same entrypoint, command, user, ports, working
// directory, environment and file paths. Its final stage is FROM
// gcr.io/distroless/static-debian12:nonroot, which this package cannot pull
// (no registry here), so base.go lays down, from Go code, the part of that
// base the guard relies on. image_test.go reads the Dockerfile and the
// install manifests and fails when they and this package disagree.
package image

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// DistrolessBase is the Dockerfile's base for its final stage, whose config
// and files base.go reproduces. A test fails when the Dockerfile names
// another: then what this package lays down must be looked at again.
const DistrolessBase = "gcr.io/distroless/static-debian12:nonroot"

// The user and group distroless calls nonroot; its home is the base's working
// directory.
const (
	NonRootID   = 65532
	nonRootHome = "/home/nonroot"
	nobodyID    = 65534
)

// basePath is distroless's PATH; no program in the image runs another, but
// the Dockerfile's image has it, so ours does too.
const basePath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// epoch is every file's modification time and the image's creation time, so
// that the same binary always gives the same image digest (distroless and ko
// do the same).
var epoch = time.Unix(0, 0).UTC()

// baseConfig is the config the guard's and the app's images start from:
// distroless static nonroot's (user 65532, working directory /home/nonroot,
// PATH), without SSL_CERT_FILE, since no CA bundle is laid down (see
// baseFiles).
func baseConfig() v1.Config {
	return v1.Config{
		User:       fmt.Sprint(NonRootID),
		WorkingDir: nonRootHome,
		Env:        []string{basePath},
	}
}

// file is one entry of a layer.
type file struct {
	name     string // relative to /, no leading slash; directories end in /
	mode     int64  // permission bits, with the sticky bit where set
	uid, gid int
	data     []byte
}

// baseFiles is the part of distroless static's file system that the guard
// needs, each with distroless's owner and mode:
//   - /etc/passwd and /etc/group with root, nobody and nonroot (65532): the
//     container runtime sets HOME from the image user's passwd entry
//     (/home/nonroot), and tools that name the user (ps, kubectl debug) find it;
//   - /home/nonroot, owned by 65532 and 0700: the working directory;
//   - /tmp, 1777: serve's default --cert-dir is under it
//     (/tmp/k8s-webhook-server/serving-certs), so `docker run` of the image
//     in self-managed mode can write its certificate there. The manifests
//     mount a volume at --cert-dir instead and set readOnlyRootFilesystem;
//   - /usr/share/zoneinfo, from the Go toolchain's own zoneinfo.zip (the
//     same IANA data as Debian's tzdata, at the path Go's time package reads
//     first): a Rego policy's time.date or time.clock with a zone name loads
//     it; without it such a policy fails to evaluate.
//
// And what it leaves out, on purpose:
//   - the CA bundle (/etc/ssl/certs/ca-certificates.crt, and SSL_CERT_FILE):
//     the guard makes TLS calls to nobody but the API server, which it trusts
//     through its service account's ca.crt (or its kubeconfig's CA); Rego's
//     http.send is excluded (policy/compile.go). A bundle would come from the
//     build machine's packages, and the image would differ from machine to
//     machine;
//   - /etc/nsswitch.conf: without it Go's resolver looks up files, then DNS,
//     which is what distroless's says ("hosts: files dns");
//   - /etc/os-release, /etc/services and the media types: no part of the
//     guard reads them (its ports are numbers);
//   - /var: the runtime creates the mount points the manifests use
//     (/var/run/deployguard/tls, /var/run/secrets/kubernetes.io/…) before it
//     makes the root read-only. In distroless /var/run links to /run; here
//     they are plain directories, which the guard cannot tell apart.
func baseFiles(zoneinfo []byte) ([]file, error) {
	const passwd = "root:x:0:0:root:/root:/sbin/nologin\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n" +
		"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
	const group = "root:x:0:\nnobody:x:65534:\ntty:x:5:\nstaff:x:50:\nnonroot:x:65532:\n"
	files := []file{
		{name: "etc/", mode: 0o755},
		{name: "etc/group", mode: 0o644, data: []byte(group)},
		{name: "etc/passwd", mode: 0o644, data: []byte(passwd)},
		{name: "home/", mode: 0o755},
		{name: strings.TrimPrefix(nonRootHome, "/") + "/", mode: 0o700, uid: NonRootID, gid: NonRootID},
		{name: "root/", mode: 0o700},
		{name: "tmp/", mode: 0o1777},
	}
	zf, err := zoneinfoFiles(zoneinfo)
	if err != nil {
		return nil, err
	}
	return append(files, zf...), nil
}

// zoneinfoFiles unpacks Go's lib/time/zoneinfo.zip into /usr/share/zoneinfo.
func zoneinfoFiles(zipped []byte) ([]file, error) {
	zr, err := zip.NewReader(bytes.NewReader(zipped), int64(len(zipped)))
	if err != nil {
		return nil, fmt.Errorf("reading zoneinfo.zip: %w", err)
	}
	const root = "usr/share/zoneinfo/"
	dirs := map[string]bool{"usr/": true, "usr/share/": true, root: true}
	var files []file
	for _, f := range zr.File {
		if strings.HasSuffix(f.Name, "/") {
			continue
		}
		name := path.Clean(f.Name)
		if path.IsAbs(name) || strings.HasPrefix(name, "..") {
			return nil, fmt.Errorf("zoneinfo.zip: unexpected name %q", f.Name)
		}
		for d := path.Dir(name); d != "."; d = path.Dir(d) {
			dirs[root+d+"/"] = true
		}
		rc, err := f.Open()
		if err != nil {
			return nil, fmt.Errorf("zoneinfo.zip: %s: %w", f.Name, err)
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return nil, fmt.Errorf("zoneinfo.zip: %s: %w", f.Name, err)
		}
		files = append(files, file{name: root + name, mode: 0o644, data: b})
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("zoneinfo.zip holds no zones")
	}
	for d := range dirs {
		files = append(files, file{name: d, mode: 0o755})
	}
	return files, nil
}

// ReadZoneinfo reads the Go toolchain's zoneinfo.zip ($GOROOT/lib/time).
func ReadZoneinfo(p string) ([]byte, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("the zone database (the Go toolchain's lib/time/zoneinfo.zip): %w", err)
	}
	return b, nil
}

// layer makes an OCI layer of files: a tar in name order (each directory
// before what it holds), every time the epoch, gzip-compressed once here so
// that go-containerregistry neither compresses it again for the digest nor
// for each write.
func layer(files []file) (v1.Layer, error) {
	sort.Slice(files, func(i, j int) bool { return files[i].name < files[j].name })
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	for i, f := range files {
		if i > 0 && files[i-1].name == f.name {
			return nil, fmt.Errorf("%s twice in a layer", f.name)
		}
		h := &tar.Header{
			Name: f.name, Mode: f.mode, Uid: f.uid, Gid: f.gid,
			ModTime: epoch, Format: tar.FormatPAX,
		}
		if strings.HasSuffix(f.name, "/") {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag = tar.TypeReg
			h.Size = int64(len(f.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("layer: %s: %w", f.name, err)
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, fmt.Errorf("layer: %s: %w", f.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz) // no name, no time: the same bytes every time
	if _, err := zw.Write(tb.Bytes()); err != nil {
		return nil, fmt.Errorf("compressing a layer: %w", err)
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("compressing a layer: %w", err)
	}
	compressed := gz.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(compressed)), nil
	}, tarball.WithMediaType(types.OCILayer))
}

// build stacks layers on an empty OCI image and sets its config; each layer's
// history says what it holds, as `docker history` shows a Dockerfile's.
func build(arch string, cfg v1.Config, layers []v1.Layer, history []string) (v1.Image, error) {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	adds := make([]mutate.Addendum, len(layers))
	for i, l := range layers {
		adds[i] = mutate.Addendum{Layer: l, History: v1.History{
			Created: v1.Time{Time: epoch}, CreatedBy: history[i], Comment: "test/image",
		}}
	}
	img, err := mutate.Append(img, adds...)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture = arch
	cf.OS = "linux"
	cf.Created = v1.Time{Time: epoch}
	cf.Config = cfg
	return mutate.ConfigFile(img, cf)
}
