package reconciler

import (
	"slices"
	"strings"
)

// DefaultQuarantineLimit is how many failed template hashes a Deployment's
// quarantine list keeps; the oldest fall off first.
const DefaultQuarantineLimit = 10

// AddQuarantined returns the quarantine list with hash appended as the newest
// entry (moved there if already present), trimmed to the newest limit entries.
// A limit below 1 means DefaultQuarantineLimit. The input is not modified.
func AddQuarantined(list []string, hash string, limit int) []string {
	if limit < 1 {
		limit = DefaultQuarantineLimit
	}
	out := RemoveQuarantined(list, hash)
	out = append(out, hash)
	if len(out) > limit {
		out = out[len(out)-limit:]
	}
	return out
}

// RemoveQuarantined returns the quarantine list without hash. The input is not
// modified.
func RemoveQuarantined(list []string, hash string) []string {
	return slices.DeleteFunc(slices.Clone(list), func(h string) bool { return h == hash })
}

// FormatTemplateList is the annotation form of a quarantine list, the inverse of
// vocab.ParseTemplateList.
func FormatTemplateList(list []string) string {
	return strings.Join(list, ",")
}
