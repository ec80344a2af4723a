package image

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Tagged is one image under one tag of a repository.
type Tagged struct {
	Tag   string
	Image v1.Image
}

// Write writes the tagged images of repository into dir as
// dir/<repository>/, an OCI image layout whose index names each manifest by
// its tag (org.opencontainers.image.ref.name), for pushing to a registry; and
// dir/<repository>.tar, a tarball of `docker save`'s format with
// <repository>:<tag> names, which `docker load` and containerd's
// `ctr images import` read. Each replaces what was there only once it is
// complete.
func Write(dir, repository string, images []Tagged) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var idx v1.ImageIndex = empty.Index
	refs := map[name.Reference]v1.Image{}
	for _, t := range images {
		cf, err := t.Image.ConfigFile()
		if err != nil {
			return err
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add: t.Image,
			Descriptor: v1.Descriptor{
				Annotations: map[string]string{"org.opencontainers.image.ref.name": t.Tag},
				Platform:    &v1.Platform{OS: cf.OS, Architecture: cf.Architecture},
			},
		})
		ref, err := name.NewTag(repository + ":" + t.Tag)
		if err != nil {
			return fmt.Errorf("tag %q: %w", t.Tag, err)
		}
		refs[ref] = t.Image
	}

	final := filepath.Join(dir, repository)
	tmp := final + ".new"
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	if _, err := layout.Write(tmp, idx); err != nil {
		return fmt.Errorf("writing the OCI layout %s: %w", tmp, err)
	}
	if err := os.RemoveAll(final); err != nil {
		return err
	}
	if err := os.Rename(tmp, final); err != nil {
		return err
	}

	tarPath := final + ".tar"
	if err := tarball.MultiRefWriteToFile(tarPath+".new", refs); err != nil {
		return fmt.Errorf("writing %s: %w", tarPath, err)
	}
	return os.Rename(tarPath+".new", tarPath)
}

// Entry is a file of an image's flattened file system.
type Entry struct {
	// Path is absolute, without a trailing slash (/ for the root).
	Path     string
	Dir      bool
	Mode     os.FileMode // permission bits, os.ModeSticky where set
	UID, GID int
	Size     int64
}

// Files lists the file system img unpacks to, by path.
func Files(img v1.Image) (map[string]Entry, error) {
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	files := map[string]Entry{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files, nil
		}
		if err != nil {
			return nil, err
		}
		p := path.Clean("/" + h.Name)
		mode := os.FileMode(h.Mode).Perm()
		if h.Mode&0o1000 != 0 {
			mode |= os.ModeSticky
		}
		files[p] = Entry{Path: p, Dir: h.Typeflag == tar.TypeDir, Mode: mode, UID: h.Uid, GID: h.Gid, Size: h.Size}
	}
}
