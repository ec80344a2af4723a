package check

import (
	"encoding/json"
	"slices"
	"strconv"
	"strings"

	yamlv3 "go.yaml.in/yaml/v3"
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
		segs := namedSegments(doc.json, splitFieldPath(path))
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
	n := root.Content[0]
	line := n.Line
	for _, s := range segs {
		next, keyLine := child(n, s)
		if next == nil {
			return doc.line + line - 1, false
		}
		n, line = next, keyLine
	}
	return doc.line + line - 1, true
}

// resolveField returns the line of path in doc, and whether the path was
// found whole (not only an ancestor of it).
func resolveField(doc document, path string) (int, bool) {
	segs := splitFieldPath(doc.path)
	if path != "" && path != "<document>" {
		segs = append(segs, splitFieldPath(path)...)
	}
	return resolveSegments(doc, segs)
}

// child returns the node at one path segment below n, and the line that names
// it (the key's line for a mapping entry).
func child(n *yamlv3.Node, seg string) (*yamlv3.Node, int) {
	for n.Kind == yamlv3.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	switch n.Kind {
	case yamlv3.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == seg {
				return n.Content[i+1], n.Content[i].Line
			}
		}
	case yamlv3.SequenceNode:
		if name, ok := strings.CutPrefix(seg, "name="); ok {
			for _, e := range n.Content {
				if v, _ := child(e, "name"); v != nil && v.Value == name {
					return e, e.Line
				}
			}
			return nil, 0
		}
		if i, err := strconv.Atoi(seg); err == nil && i >= 0 && i < len(n.Content) {
			return n.Content[i], n.Content[i].Line
		}
	}
	return nil, 0
}

// splitFieldPath splits a field path into its segments: names between dots,
// and indexes or keys in brackets (a key may itself hold dots and slashes).
func splitFieldPath(p string) []string {
	var out []string
	for len(p) > 0 {
		switch p[0] {
		case '.':
			p = p[1:]
		case '[':
			end := strings.IndexByte(p, ']')
			if end < 0 {
				return append(out, p[1:])
			}
			out = append(out, p[1:end])
			p = p[end+1:]
		default:
			end := strings.IndexAny(p, ".[")
			if end < 0 {
				return append(out, p)
			}
			out = append(out, p[:end])
			p = p[end:]
		}
	}
	return out
}
