package harness

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	appsv1 "k8s.io/api/apps/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// ReadDeployments reads the Deployments of a multi-document YAML file (a
// corpus of test/integration/testdata), strictly; other kinds are skipped.
func ReadDeployments(path string) ([]*appsv1.Deployment, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	rd := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
	var out []*appsv1.Deployment
	for {
		doc, err := rd.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		} else if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		var head struct{ Kind string }
		if err := yaml.Unmarshal(doc, &head); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if head.Kind != "Deployment" {
			continue
		}
		d := &appsv1.Deployment{}
		if err := yaml.UnmarshalStrict(doc, d); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		out = append(out, d)
	}
}

// CorpusDeployments are the Deployments of the corpora the differential
// tests share: test/integration/testdata's parity fixtures, public charts and
// the upstream suite's manifests, in file order.
func CorpusDeployments() ([]*appsv1.Deployment, error) {
	var out []*appsv1.Deployment
	for _, pattern := range []string{"parity/*.yaml", "charts/*.yaml", "upstream/*.yaml"} {
		files, err := filepath.Glob(filepath.Join(RepoRoot(), "test", "integration", "testdata", pattern))
		if err != nil {
			return nil, err
		}
		for _, f := range files {
			ds, err := ReadDeployments(f)
			if err != nil {
				return nil, err
			}
			out = append(out, ds...)
		}
	}
	return out, nil
}
