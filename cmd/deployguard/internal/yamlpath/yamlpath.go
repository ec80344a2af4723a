// Package yamlpath finds the line of a YAML document on which a field path,
// as field.Path prints it (spec.template.spec.containers[0].image,
// metadata.labels[app.kubernetes.io/name]), is written: the config file's
// errors and `deployguard check`'s findings name it, because the person who
// reads them is editing that file.
package yamlpath

import (
	"strconv"
	"strings"

	yaml "go.yaml.in/yaml/v3"
)

// Split splits a field path into its segments: names between dots, and
// indexes or keys in brackets (a key may itself hold dots and slashes).
func Split(p string) []string {
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

// Line returns the line that names the node at segs below n (a document node,
// or the node it holds): the key's line for a mapping entry, the element's
// for a list element, where a segment "name=x" picks the element named x. A
// path the document does not spell out whole resolves to its nearest
// ancestor that it does, and exact is false; the line is 0 when it spells out
// none of it, or segs is empty.
func Line(n *yaml.Node, segs []string) (line int, exact bool) {
	if n.Kind == yaml.DocumentNode {
		if len(n.Content) == 0 {
			return 0, len(segs) == 0
		}
		n = n.Content[0]
	}
	for _, s := range segs {
		next, keyLine := child(n, s)
		if next == nil {
			return line, false
		}
		n, line = next, keyLine
	}
	return line, true
}

// child returns the node at one path segment below n, and the line that names
// it (the key's line for a mapping entry).
func child(n *yaml.Node, seg string) (*yaml.Node, int) {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == seg {
				return n.Content[i+1], n.Content[i].Line
			}
		}
	case yaml.SequenceNode:
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
