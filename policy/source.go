package policy

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// Source is one Rego module and where it came from. Name appears in every
// error about the module, so it says where to look: "builtin/images.rego",
// "/etc/deployguard/policies/team.rego", "configmap/<ns>/<name>/<key>".
type Source struct {
	Name   string
	Module string
}

// regoSuffix and testSuffix tell policies from their tests.
const (
	regoSuffix = ".rego"
	testSuffix = "_test.rego"
)

// isPolicyFile reports whether a file name holds a policy (not a test).
func isPolicyFile(name string) bool {
	return strings.HasSuffix(name, regoSuffix) && !strings.HasSuffix(name, testSuffix)
}

// FromDir reads every *.rego file of dir, except *_test.rego, in name order.
// It does not descend into subdirectories: a mounted ConfigMap keeps older
// copies of its files in hidden subdirectories, which must not load twice.
func FromDir(dir string) ([]Source, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("reading policy directory: %w", err)
	}
	var sources []Source
	for _, e := range entries {
		if !isPolicyFile(e.Name()) || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		path := filepath.Join(dir, e.Name())
		// Stat follows the symlinks a mounted ConfigMap is made of.
		info, err := os.Stat(path)
		if err != nil {
			return nil, fmt.Errorf("reading policy file: %w", err)
		}
		if info.IsDir() {
			continue
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("reading policy file: %w", err)
		}
		sources = append(sources, Source{Name: path, Module: string(b)})
	}
	return sources, nil
}

// FromConfigMap returns one Source per data key of cm ending in ".rego"
// (tests, "*_test.rego", are skipped), named "configmap/<ns>/<name>/<key>",
// in key order.
func FromConfigMap(cm *corev1.ConfigMap) []Source {
	keys := make([]string, 0, len(cm.Data))
	for k := range cm.Data {
		if isPolicyFile(k) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	sources := make([]Source, len(keys))
	for i, k := range keys {
		sources[i] = Source{Name: configMapSourceName(cm.Namespace, cm.Name, k), Module: cm.Data[k]}
	}
	return sources
}

func configMapSourceName(namespace, name, key string) string {
	return "configmap/" + namespace + "/" + name + "/" + key
}
