package main

import (
	"regexp"
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
	if len(doc.raw) == 0 {
		return 0
	}
	var root yamlv3.Node
	if err := yamlv3.Unmarshal(doc.raw, &root); err != nil || len(root.Content) == 0 {
		return doc.line
	}
	n := root.Content[0]
	line := n.Line
	segs := splitFieldPath(doc.path)
	if path != "" && path != "<document>" {
		segs = append(segs, splitFieldPath(path)...)
	}
	for _, s := range segs {
		next, keyLine := child(n, s)
		if next == nil {
			break
		}
		n, line = next, keyLine
	}
	return doc.line + line - 1
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

// warningPathRE finds the field path a warning starts with, after the policy
// that raised it: "[policy images] spec.template.spec.containers[0].image: …"
// or "spec.selector: …".
var warningPathRE = regexp.MustCompile(`^(?:\[policy ([^\]]+)\] )?([A-Za-z][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+|\[[^\]]*\])*): `)

// policyRE finds the policy named in a denial's message.
var policyRE = regexp.MustCompile(`\[policy ([^\]]+)\]`)

// splitWarning returns the policy and field path a warning names, if any.
func splitWarning(w string) (policy, path string) {
	if m := warningPathRE.FindStringSubmatch(w); m != nil {
		return m[1], m[2]
	}
	if m := policyRE.FindStringSubmatch(w); m != nil {
		return m[1], ""
	}
	return "", ""
}
