package policy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
)

// Set is the policy set that was active when it was taken. Evaluations
// through it all use the same policies, whatever is loaded meanwhile: the
// audit judges a pass with one Set, so that its results, its policy list and
// the digests it records agree.
type Set struct {
	e   *Engine
	set *preparedSet
}

// Active returns the active set.
func (e *Engine) Active() Set { return Set{e: e, set: e.active.Load()} }

// ReadsOnlySpec reports whether the set's policies read nothing of a
// request but input.object.spec, input.name and input.namespace (which no
// update changes), and call no nondeterministic builtin: then an update
// that leaves the spec as it was gets the findings the spec got, and the
// webhook need not be asked again (routing.MayAdvise). What the analysis
// cannot bound reads everything.
func (s Set) ReadsOnlySpec() bool {
	if s.set.nondeterministic {
		return false
	}
	r := s.set.reads
	if r == nil {
		return true
	}
	if r.whole || r.any != nil {
		return false
	}
	for k, m := range r.members {
		switch k {
		case "name", "namespace":
		case "object":
			if m.whole || m.any != nil {
				return false
			}
			for k := range m.members {
				if k != "spec" {
					return false
				}
			}
		default:
			return false
		}
	}
	return true
}

// Policies lists the set's evaluated policies, sorted by name.
func (s Set) Policies() []PolicyInfo {
	infos := make([]PolicyInfo, len(s.set.policies))
	for i, p := range s.set.policies {
		infos[i] = PolicyInfo{Name: p.name, Source: p.source, Mode: p.mode, Severity: p.severity, Category: p.category, Digest: p.digest, Deletes: p.deletes}
	}
	return infos
}

// EvaluateRequest is Engine.EvaluateRequest on this set, for the policies
// only selects by name (every policy when only is nil).
func (s Set) EvaluateRequest(ctx context.Context, r Request, only func(name string) bool) (Decision, error) {
	if reason, ok := exemption(s.e.opts.Exempt, r); ok {
		s.e.metrics.exempt.Inc()
		return Decision{Exempt: true, ExemptReason: reason}, nil
	}
	in, err := newInput(r, s.set.reads)
	if err != nil {
		return Decision{}, err
	}
	return s.e.evaluate(ctx, s.set, in, only), nil
}

// policyDigest identifies what decides a policy's findings: its module, the
// library modules it may import, its effective mode. Equal digests judge
// every input alike, so the audit refreshes only the policies whose digest
// changed when a new set is loaded.
func policyDigest(text, libraries string, mode Mode) string {
	h := sha256.New()
	for _, part := range []string{text, libraries, string(mode)} {
		_, _ = io.WriteString(h, part)
		_, _ = h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil)[:12])
}

// digestLibraries digests the library sources, sorted by name.
func digestLibraries(libs []Source) string {
	h := sha256.New()
	for _, l := range libs {
		_, _ = io.WriteString(h, l.Name)
		_, _ = h.Write([]byte{0})
		_, _ = io.WriteString(h, l.Module)
		_, _ = h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil)[:12])
}
