// Command image-build builds the guard's image and the test app's images
// (package test/image) from static binaries, without a Docker engine, and
// shows what an image holds. `make image` runs it:
//
//	image-build guard -binary bin/image/deployguard.bin -version v1.2.3 -zoneinfo $(go env GOROOT)/lib/time/zoneinfo.zip -out bin/image
//	image-build app   -binary bin/image/testapp.bin -zoneinfo … -out bin/image
//	image-build inspect [-files] bin/image/deployguard
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"

	"github.com/deployguard/deployguard/test/image"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "image-build:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return errors.New("usage: image-build guard|app|inspect [flags]")
	}
	fs := flag.NewFlagSet("image-build "+args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	binary := fs.String("binary", "", "the static executable to put in the image")
	version := fs.String("version", "", "guard: the version the binary was stamped with (-X main.version), and the image's tag")
	zoneinfo := fs.String("zoneinfo", "", "the Go toolchain's lib/time/zoneinfo.zip, unpacked into /usr/share/zoneinfo")
	out := fs.String("out", "bin/image", "the directory that receives <name>/ (OCI layout) and <name>.tar")
	files := fs.Bool("files", false, "inspect: list every file too")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	switch args[0] {
	case "guard":
		if *version == "" {
			return errors.New("guard: -version is required")
		}
		bin, zi, err := inputs(*binary, image.GuardBuild(*version), *zoneinfo)
		if err != nil {
			return err
		}
		img, err := image.Guard(bin, zi)
		if err != nil {
			return err
		}
		var tagged []image.Tagged
		for _, t := range image.GuardTags(*version) {
			tagged = append(tagged, image.Tagged{Tag: t, Image: img})
		}
		return write(stdout, *out, image.GuardRepository, tagged)
	case "app":
		bin, zi, err := inputs(*binary, image.AppBuild(), *zoneinfo)
		if err != nil {
			return err
		}
		imgs, err := image.App(bin, zi)
		if err != nil {
			return err
		}
		var tagged []image.Tagged
		for _, t := range image.AppTags() {
			tagged = append(tagged, image.Tagged{Tag: t.Tag, Image: imgs[t.Tag]})
		}
		return write(stdout, *out, image.AppRepository, tagged)
	case "inspect":
		if fs.NArg() != 1 {
			return errors.New("inspect: name one OCI layout directory, e.g. bin/image/deployguard")
		}
		return inspect(stdout, fs.Arg(0), *files)
	default:
		return fmt.Errorf("unknown command %q: guard, app or inspect", args[0])
	}
}

func inputs(binary string, want image.Build, zoneinfo string) (image.Binary, []byte, error) {
	if binary == "" || zoneinfo == "" {
		return image.Binary{}, nil, errors.New("-binary and -zoneinfo are required")
	}
	bin, err := image.ReadBinary(binary, want)
	if err != nil {
		return image.Binary{}, nil, err
	}
	zi, err := image.ReadZoneinfo(zoneinfo)
	return bin, zi, err
}

func write(stdout io.Writer, dir, repository string, tagged []image.Tagged) error {
	if err := image.Write(dir, repository, tagged); err != nil {
		return err
	}
	for _, t := range tagged {
		d, err := t.Image.Digest()
		if err != nil {
			return err
		}
		size, err := compressedSize(t.Image)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s:%s\t%s\t%.1f MB\n", repository, t.Tag, d, float64(size)/1e6)
	}
	fmt.Fprintf(stdout, "written: %s/%s/ (OCI layout), %s/%s.tar\n", dir, repository, dir, repository)
	return nil
}

// compressedSize is what a pull transfers: the manifest's config and layers.
func compressedSize(img v1.Image) (int64, error) {
	m, err := img.Manifest()
	if err != nil {
		return 0, err
	}
	n := m.Config.Size
	for _, l := range m.Layers {
		n += l.Size
	}
	return n, nil
}

// inspect prints, for each tag of an OCI layout, its digest, size and config,
// and with files its file system.
func inspect(stdout io.Writer, dir string, withFiles bool) error {
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return err
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return err
	}
	for _, d := range im.Manifests {
		img, err := idx.Image(d.Digest)
		if err != nil {
			return err
		}
		cf, err := img.ConfigFile()
		if err != nil {
			return err
		}
		size, err := compressedSize(img)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s\t%s\t%s/%s\t%.1f MB compressed, %d layers\n", d.Annotations["org.opencontainers.image.ref.name"], d.Digest, cf.OS, cf.Architecture, float64(size)/1e6, len(cf.RootFS.DiffIDs))
		b, err := json.MarshalIndent(cf.Config, "  ", "  ")
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "  %s\n", b)
		if !withFiles {
			continue
		}
		files, err := image.Files(img)
		if err != nil {
			return err
		}
		paths := make([]string, 0, len(files))
		for p := range files {
			paths = append(paths, p)
		}
		sort.Strings(paths)
		for _, p := range paths {
			f := files[p]
			fmt.Fprintf(stdout, "  %s %5d:%-5d %10d %s\n", lsMode(f), f.UID, f.GID, f.Size, p)
		}
	}
	return nil
}

// lsMode is f's mode as ls -l writes it (drwxrwxrwt for /tmp).
func lsMode(f image.Entry) string {
	m := []byte(f.Mode.Perm().String()) // -rwxrwxrwx
	if f.Dir {
		m[0] = 'd'
	}
	if f.Mode&os.ModeSticky != 0 {
		m[9] = map[bool]byte{true: 't', false: 'T'}[m[9] == 'x']
	}
	return string(m)
}
