package check

import (
	"encoding/json"
	"slices"
	"strconv"

	yamlv3 "go.yaml.in/yaml/v3"

	"github.com/deployguard/deployguard/cmd/deployguard/internal/yamlpath"
)

// fieldLine resolves a field path of the object in doc (as field.Path prints
// it: spec.template.spec.containers[0].image, metadata.labels[app]) to the
// line of the file it is written on. A path that the manifest does not spell
// out (a field the finding says is missing) resolves to its nearest ancestor
// that it does. It returns 0 when the document has no text to look in.
func fieldLine(doc document, path string) int {
	line, _ := resolveField(doc, path)
	return line
}

// findField is fieldLine over an object rendered by kustomize: a field that
// one of the patches applied to it spells out is found there (the last such
// patch, as the last one applied wins), otherwise in the object's source. It
// returns the file and line.
func findField(doc document, path string) (string, int) {
	if path != "" && len(doc.patches) > 0 {
		// A strategic-merge patch lists elements by their merge key, not
		// at the rendered index: look them up by name.
		segs := namedSegments(doc.json, yamlpath.Split(path))
		for i := len(doc.patches) - 1; i >= 0; i-- {
			if line, exact := resolveSegments(doc.patches[i], segs); exact {
				return doc.patches[i].file, line
			}
		}
	}
	line, _ := resolveField(doc, path)
	return doc.file, line
}

// namedSegments turns the index segments of a path ("0") into "name=web"
// where the rendered object's element there has a name.
func namedSegments(obj []byte, segs []string) []string {
	var cur any
	if json.Unmarshal(obj, &cur) != nil {
		return segs
	}
	out := slices.Clone(segs)
	for i, s := range segs {
		switch x := cur.(type) {
		case map[string]any:
			cur = x[s]
		case []any:
			n, err := strconv.Atoi(s)
			if err != nil || n < 0 || n >= len(x) {
				return out
			}
			cur = x[n]
			if m, ok := cur.(map[string]any); ok {
				if name, ok := m["name"].(string); ok {
					out[i] = "name=" + name
				}
			}
		default:
			return out
		}
	}
	return out
}

// resolveSegments is resolveField over split segments (of which "name=x"
// picks the element of a list named x).
func resolveSegments(doc document, segs []string) (int, bool) {
	if len(doc.raw) == 0 {
		return 0, false
	}
	var root yamlv3.Node
	if err := yamlv3.Unmarshal(doc.raw, &root); err != nil || len(root.Content) == 0 {
		return doc.line, false
	}
	line, exact := yamlpath.Line(&root, segs)
	if line == 0 {
		// None of it is spelled out: the object's own line.
		line = root.Content[0].Line
	}
	return doc.line + line - 1, exact
}

// resolveField returns the line of path in doc, and whether the path was
// found whole (not only an ancestor of it).
func resolveField(doc document, path string) (int, bool) {
	segs := yamlpath.Split(doc.path)
	if path != "" && path != "<document>" {
		segs = append(segs, yamlpath.Split(path)...)
	}
	return resolveSegments(doc, segs)
}
