package image

import (
	"bytes"
	"debug/buildinfo"
	"debug/elf"
	"fmt"
	"os"
	"strings"
)

// Build is how a binary that goes into an image must have been built: the
// environment and flags of the Dockerfile's `go build`. image_test.go reads
// them from the Dockerfile; ReadBinary checks a binary against them.
type Build struct {
	// Env holds the environment the build ran with (CGO_ENABLED, GOOS).
	Env      map[string]string
	Trimpath bool
	// Stripped is -ldflags "-s -w": no symbol table, no DWARF.
	Stripped bool
	// Version is what -ldflags "-X main.version=…" stamps; empty: nothing.
	Version string
}

// LDFlags are the linker flags of b, as the Dockerfile writes them.
func (b Build) LDFlags() string {
	var f []string
	if b.Stripped {
		f = append(f, "-s", "-w")
	}
	if b.Version != "" {
		f = append(f, "-X", "main.version="+b.Version)
	}
	return strings.Join(f, " ")
}

// GuardBuild is the Dockerfile's build of the guard, stamped with version:
// static (no cgo: distroless static has no C library), no file system paths
// in the binary, no symbol table or DWARF.
func GuardBuild(version string) Build {
	return Build{
		Env:      map[string]string{"CGO_ENABLED": "0", "GOOS": "linux"},
		Trimpath: true,
		Stripped: true,
		Version:  version,
	}
}

// AppBuild is the test app's build: the guard's, without a version.
func AppBuild() Build {
	return GuardBuild("")
}

// Binary is an executable checked for an image.
type Binary struct {
	Data []byte
	// Arch is the GOARCH it was built for: the image's architecture.
	Arch string
}

// ReadBinary reads the executable at p and checks that it was built as want
// says, and that it links nothing dynamically: `make build`'s
// bin/deployguard, say, uses cgo's resolver and needs a C library, which the
// image does not have. The Go build info records the environment and
// -trimpath, but not -ldflags when -trimpath is set (go.dev/issue/52372), so
// the linker flags are read from the executable itself: -s -w leave no
// .symtab and no .debug_* section, and -X main.version leaves the version's
// text in the binary's data (a weak check for a short version such as "dev",
// a sound one for a commit's name).
func ReadBinary(p string, want Build) (Binary, error) {
	info, err := buildinfo.ReadFile(p)
	if err != nil {
		return Binary{}, fmt.Errorf("%s: not a Go executable: %w", p, err)
	}
	settings := map[string]string{}
	for _, s := range info.Settings {
		settings[s.Key] = s.Value
	}
	for k, v := range want.Env {
		if settings[k] != v {
			return Binary{}, fmt.Errorf("%s was built with %s=%q, the Dockerfile builds with %s=%q", p, k, settings[k], k, v)
		}
	}
	if got := settings["-trimpath"] == "true"; got != want.Trimpath {
		return Binary{}, fmt.Errorf("%s: built with -trimpath %t, the Dockerfile builds with %t", p, got, want.Trimpath)
	}
	if err := checkELF(p, want.Stripped); err != nil {
		return Binary{}, err
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return Binary{}, err
	}
	if want.Version != "" && !bytes.Contains(b, []byte(want.Version)) {
		return Binary{}, fmt.Errorf("%s does not hold its version %q: build it with -ldflags \"-X main.version=%s\"", p, want.Version, want.Version)
	}
	return Binary{Data: b, Arch: settings["GOARCH"]}, nil
}

// checkELF refuses an ELF executable with a program interpreter or a shared
// library it needs, and, when stripped, one with a symbol table or DWARF.
func checkELF(p string, stripped bool) error {
	f, err := elf.Open(p)
	if err != nil {
		return fmt.Errorf("%s: not a Linux executable: %w", p, err)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked (it has a program interpreter); the image has no C library: build it with CGO_ENABLED=0", p)
		}
	}
	libs, err := f.ImportedLibraries()
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	if len(libs) > 0 {
		return fmt.Errorf("%s needs shared libraries %v; the image has none: build it with CGO_ENABLED=0", p, libs)
	}
	if !stripped {
		return nil
	}
	for _, s := range f.Sections {
		if s.Name == ".symtab" || strings.HasPrefix(s.Name, ".debug_") || strings.HasPrefix(s.Name, ".zdebug_") {
			return fmt.Errorf("%s has a %s section: build it with -ldflags \"-s -w\", as the Dockerfile does", p, s.Name)
		}
	}
	return nil
}
