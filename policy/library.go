package policy

import (
	"embed"
	"fmt"
	"io/fs"
	"path"
)

// library is the built-in policy library with its Rego tests.
//
//go:embed library/*.rego
var library embed.FS

// libraryDir is the directory of the library inside the embedded FS.
const libraryDir = "library"

// builtinPrefix names the built-in sources: "builtin/images.rego".
const builtinPrefix = "builtin/"

// Builtins returns the built-in policies (images, probes, resources,
// hostnamespaces), without their tests. Disable one by name with
// Options.Disabled.
func Builtins() []Source {
	sources, err := librarySources(isPolicyFile)
	if err != nil {
		// The library is embedded at build time; TestBuiltinsLoad guards it.
		return nil
	}
	return sources
}

// librarySources reads the embedded library files whose names pass keep.
func librarySources(keep func(name string) bool) ([]Source, error) {
	entries, err := fs.ReadDir(library, libraryDir)
	if err != nil {
		return nil, fmt.Errorf("reading built-in library: %w", err)
	}
	var sources []Source
	for _, e := range entries {
		if !keep(e.Name()) {
			continue
		}
		b, err := fs.ReadFile(library, path.Join(libraryDir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("reading built-in library: %w", err)
		}
		sources = append(sources, Source{Name: builtinPrefix + e.Name(), Module: string(b)})
	}
	return sources, nil
}
