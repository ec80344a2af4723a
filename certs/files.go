package certs

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// dataDir is the symlink through which every file of a folder written by
// WriteAtomic is reached, as in a kubelet Secret volume.
const dataDir = "..data"

// WriteAtomic replaces the files of dir all at once, the way the kubelet
// updates a Secret volume: the new files go into a fresh hidden folder, the
// ..data symlink is swapped to it by a rename, and every file name is a
// symlink through ..data. A reader sees every old file or every new one, never
// a new certificate with an old key; the old folder is removed last, which is
// the event a file watcher on the old files sees. It reports whether anything
// changed: identical content writes nothing.
func WriteAtomic(dir string, files map[string][]byte) (bool, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, fmt.Errorf("creating %s: %w", dir, err)
	}
	if same(dir, files) {
		return false, nil
	}
	ts, err := os.MkdirTemp(dir, ".."+time.Now().UTC().Format("2006_01_02_15_04_05.000000000")+".")
	if err != nil {
		return false, fmt.Errorf("writing %s: %w", dir, err)
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(ts, name), b, 0o600); err != nil {
			os.RemoveAll(ts)
			return false, fmt.Errorf("writing %s: %w", filepath.Join(ts, name), err)
		}
	}
	old, _ := os.Readlink(filepath.Join(dir, dataDir))
	tmp := filepath.Join(dir, dataDir+"_tmp")
	_ = os.Remove(tmp)
	if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
		os.RemoveAll(ts)
		return false, fmt.Errorf("writing %s: %w", dir, err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, dataDir)); err != nil {
		os.RemoveAll(ts)
		return false, fmt.Errorf("swapping %s: %w", filepath.Join(dir, dataDir), err)
	}
	for name := range files {
		if err := linkThroughData(dir, name); err != nil {
			return true, err
		}
	}
	if old != "" && old != filepath.Base(ts) {
		if err := os.RemoveAll(filepath.Join(dir, old)); err != nil {
			return true, fmt.Errorf("removing the previous files %s: %w", old, err)
		}
	}
	return true, nil
}

// same reports whether dir already holds exactly files (through ..data).
func same(dir string, files map[string][]byte) bool {
	for name, b := range files {
		cur, err := os.ReadFile(filepath.Join(dir, dataDir, name))
		if err != nil || !bytes.Equal(cur, b) {
			return false
		}
		if target, err := os.Readlink(filepath.Join(dir, name)); err != nil || target != filepath.Join(dataDir, name) {
			return false
		}
	}
	return true
}

// linkThroughData makes dir/name a symlink to ..data/name, replacing a plain
// file left by an older version atomically.
func linkThroughData(dir, name string) error {
	p := filepath.Join(dir, name)
	want := filepath.Join(dataDir, name)
	if target, err := os.Readlink(p); err == nil && target == want {
		return nil
	}
	tmp := filepath.Join(dir, "."+name+".link")
	_ = os.Remove(tmp)
	if err := os.Symlink(want, tmp); err != nil {
		return fmt.Errorf("linking %s: %w", p, err)
	}
	if err := os.Rename(tmp, p); err != nil {
		return fmt.Errorf("linking %s: %w", p, err)
	}
	return nil
}
