package check

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"sigs.k8s.io/kustomize/api/konfig"
	"sigs.k8s.io/kustomize/api/krusty"
	kustomizetypes "sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// kustomizationFields are the parts of a kustomization that name patch files.
type kustomizationFields struct {
	// A patch is {path: …} or {patch: …}, or, in older kustomizations, the
	// path alone as a string.
	Patches               []json.RawMessage `json:"patches"`
	PatchesStrategicMerge []string          `json:"patchesStrategicMerge"`
	PatchesJSON6902       []struct {
		Path string `json:"path"`
	} `json:"patchesJson6902"`
}

// kustomizationPatches maps each file that a kustomization in dirs lists as a
// patch (patches, patchesStrategicMerge, patchesJson6902) to that
// kustomization's path. Such a file is a fragment kustomize applies to a base,
// not an object; `check -k` checks what it renders. A kustomization that does
// not parse names no patches here: building it is `check -k`'s to report.
func kustomizationPatches(dirs []string) (map[string]string, error) {
	out := map[string]string{}
	for _, dir := range dirs {
		for _, name := range konfig.RecognizedKustomizationFileNames() {
			k := filepath.Join(dir, name)
			b, err := os.ReadFile(k)
			if err != nil {
				if os.IsNotExist(err) {
					continue
				}
				return nil, err
			}
			var kf kustomizationFields
			if yaml.Unmarshal(b, &kf) != nil {
				continue
			}
			paths := kf.PatchesStrategicMerge
			for _, raw := range kf.Patches {
				var p struct {
					Path string `json:"path"`
				}
				if json.Unmarshal(raw, &p.Path) != nil {
					_ = json.Unmarshal(raw, &p)
				}
				paths = append(paths, p.Path)
			}
			for _, p := range kf.PatchesJSON6902 {
				paths = append(paths, p.Path)
			}
			for _, p := range paths {
				// A patchesStrategicMerge entry may be an inline patch.
				if p == "" || strings.ContainsAny(p, "\n:") {
					continue
				}
				out[cleanPath(filepath.Join(dir, p))] = k
			}
		}
	}
	return out, nil
}

// originFS is the disk, except that the root kustomization asks kustomize to
// keep the origin of every resource (buildMetadata: [originAnnotations]), so
// that findings point at the file a Deployment came from.
type originFS struct {
	filesys.FileSystem
	root string // the root kustomization file, absolute
	// kustomizations collects the directories of every kustomization the
	// build reads, whose patches may have set a rendered object's fields.
	kustomizations map[string]bool
}

func (f originFS) ReadFile(path string) ([]byte, error) {
	b, err := f.FileSystem.ReadFile(path)
	if err == nil && slices.Contains(konfig.RecognizedKustomizationFileNames(), filepath.Base(path)) {
		f.kustomizations[filepath.Dir(cleanPath(path))] = true
	}
	if err != nil || cleanPath(path) != f.root {
		return b, err
	}
	var k kustomizetypes.Kustomization
	if err := yaml.Unmarshal(b, &k); err != nil {
		// kustomize reports it, with its own words.
		return b, nil
	}
	for _, m := range k.BuildMetadata {
		if m == kustomizetypes.OriginAnnotations {
			return b, nil
		}
	}
	var raw map[string]any
	if err := yaml.Unmarshal(b, &raw); err != nil || raw == nil {
		return b, nil
	}
	raw["buildMetadata"] = append(k.BuildMetadata, kustomizetypes.OriginAnnotations)
	return yaml.Marshal(raw)
}

// buildKustomization builds the kustomization in dir in-process, as
// `kustomize build` (and `kubectl kustomize`) would, and returns the rendered
// objects as documents. Each one points at the file it came from when that is
// a local file, with the text of its source document for line numbers (the
// rendered object may differ: a patch's field is found in the base at its
// nearest ancestor); otherwise at the kustomization.
func buildKustomization(dir string) ([]document, error) {
	fs := filesys.MakeFsOnDisk()
	rootDir := cleanPath(dir)
	root := ""
	for _, name := range konfig.RecognizedKustomizationFileNames() {
		if fs.Exists(filepath.Join(rootDir, name)) {
			root = filepath.Join(rootDir, name)
			break
		}
	}
	if root == "" {
		return nil, fmt.Errorf("%s: no kustomization (kustomization.yaml, kustomization.yml or Kustomization)", dir)
	}
	opts := krusty.MakeDefaultOptions()
	ofs := originFS{FileSystem: fs, root: root, kustomizations: map[string]bool{}}
	m, err := krusty.MakeKustomizer(opts).Run(ofs, rootDir)
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	patchDocs, err := patchDocuments(ofs.kustomizations, rootDir, dir)
	if err != nil {
		return nil, err
	}
	sources := map[string][]document{}
	var out []document
	for i, r := range m.Resources() {
		origin, _ := r.GetOrigin()
		if err := r.SetOrigin(nil); err != nil {
			return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
		}
		if len(r.GetAnnotations()) == 0 {
			// Drop the annotations map the origin leaves empty, so that the
			// object is exactly what `kustomize build` prints.
			_ = r.SetAnnotations(nil)
		}
		j, err := r.MarshalJSON()
		if err != nil {
			return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
		}
		d := document{file: filepath.Join(dir, filepath.Base(root)), index: i + 1, json: j}
		if origin != nil && origin.Repo == "" && origin.Path != "" {
			src := filepath.Join(dir, filepath.FromSlash(origin.Path))
			if _, ok := sources[src]; !ok {
				docs, err := readFile(src, nil)
				if err != nil {
					docs = nil // the build read it; if it cannot be read again, point at the kustomization
				}
				sources[src] = docs
			}
			if s, ok := sourceDocument(sources[src], r.GetKind(), r.GetName()); ok {
				d.file, d.index, d.raw, d.line = s.file, s.index, s.raw, s.line
			}
		}
		d.patches = matchingDocuments(patchDocs, r.GetKind(), r.GetName())
		out = append(out, d)
	}
	return out, nil
}

// patchDocuments reads the patch files the kustomizations in dirs list, named
// as the user named the root (dir for rootDir), in a stable order.
func patchDocuments(dirs map[string]bool, rootDir, dir string) ([]document, error) {
	var list []string
	for d := range dirs {
		list = append(list, d)
	}
	patches, err := kustomizationPatches(list)
	if err != nil {
		return nil, err
	}
	var files []string
	for f := range patches {
		files = append(files, f)
	}
	sort.Strings(files)
	var out []document
	for _, f := range files {
		name := f
		if rel, err := filepath.Rel(rootDir, f); err == nil {
			name = filepath.Join(dir, rel)
		}
		fh, err := os.Open(f)
		if err != nil {
			continue // the build read what it needed; a missing file names nothing
		}
		docs, err := splitDocuments(name, fh)
		fh.Close()
		if err == nil {
			out = append(out, docs...)
		}
	}
	return out, nil
}

// matchingDocuments are the documents about the rendered object kind/name.
func matchingDocuments(docs []document, kind, name string) []document {
	var out []document
	for _, d := range docs {
		if s, ok := sourceDocument([]document{d}, kind, name); ok {
			out = append(out, s)
		}
	}
	return out
}

// sourceDocument finds the document of a source file that a rendered object
// came from: the same kind, and a name the rendered one contains (kustomize
// adds prefixes and suffixes).
func sourceDocument(docs []document, kind, name string) (document, bool) {
	var best document
	found := false
	for _, d := range docs {
		var head struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if json.Unmarshal(d.json, &head) != nil || head.Kind != kind || !strings.Contains(name, head.Metadata.Name) {
			continue
		}
		if !found || len(head.Metadata.Name) > len(nameOf(best)) {
			best, found = d, true
		}
	}
	return best, found
}

func nameOf(d document) string {
	var head struct {
		Metadata struct {
			Name string `json:"name"`
		} `json:"metadata"`
	}
	_ = json.Unmarshal(d.json, &head)
	return head.Metadata.Name
}

// hasPatchDirective reports whether a JSON document holds a strategic-merge
// patch directive ($patch, $retainKeys, $setElementOrder/…,
// $deleteFromPrimitiveList/…) at any depth: it is a patch, not an object.
func hasPatchDirective(j []byte) bool {
	if !bytes.Contains(j, []byte(`"$`)) {
		return false
	}
	var v any
	if json.Unmarshal(j, &v) != nil {
		return false
	}
	var walk func(any) bool
	walk = func(v any) bool {
		switch x := v.(type) {
		case map[string]any:
			for k, c := range x {
				if k == "$patch" || k == "$retainKeys" || strings.HasPrefix(k, "$setElementOrder/") || strings.HasPrefix(k, "$deleteFromPrimitiveList/") {
					return true
				}
				if walk(c) {
					return true
				}
			}
		case []any:
			for _, c := range x {
				if walk(c) {
					return true
				}
			}
		}
		return false
	}
	return walk(v)
}
