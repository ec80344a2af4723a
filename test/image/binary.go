package image

import (
	"debug/buildinfo"
	"debug/elf"
	"fmt"
	"os"
)

// Build is how a binary that goes into an image must have been built: the
// environment and flags of the Dockerfile's `go build`, which its Go build
// info records. image_test.go reads them from the Dockerfile.
type Build struct {
	// Env holds the environment the build ran with (CGO_ENABLED, GOOS).
	Env      map[string]string
	Trimpath bool
	LDFlags  string
}

// GuardBuild is the Dockerfile's build of the guard, stamped with version:
// static (no cgo: distroless static has no C library), no file system paths
// in the binary, no symbol table or DWARF.
func GuardBuild(version string) Build {
	return Build{
		Env:      map[string]string{"CGO_ENABLED": "0", "GOOS": "linux"},
		Trimpath: true,
		LDFlags:  "-s -w -X main.version=" + version,
	}
}

// AppBuild is the test app's build: the guard's without a version.
func AppBuild() Build {
	return Build{
		Env:      map[string]string{"CGO_ENABLED": "0", "GOOS": "linux"},
		Trimpath: true,
		LDFlags:  "-s -w",
	}
}

// Binary is an executable checked for an image.
type Binary struct {
	Data []byte
	// Arch is the GOARCH it was built for: the image's architecture.
	Arch string
}

// ReadBinary reads the executable at p and checks that it was built as want
// says and links nothing dynamically: `make build`'s bin/deployguard, say,
// uses cgo's resolver and needs a C library that the image does not have.
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
	if settings["-ldflags"] != want.LDFlags {
		return Binary{}, fmt.Errorf("%s was built with -ldflags %q, the Dockerfile builds with %q", p, settings["-ldflags"], want.LDFlags)
	}
	if err := checkStatic(p); err != nil {
		return Binary{}, err
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return Binary{}, err
	}
	return Binary{Data: b, Arch: settings["GOARCH"]}, nil
}

// checkStatic refuses an ELF executable with a program interpreter or a
// shared library it needs.
func checkStatic(p string) error {
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
	return nil
}
