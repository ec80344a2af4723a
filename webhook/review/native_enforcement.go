package review

import (
	"sync"
	"sync/atomic"
)

// NativeEnforcement is whether the API server enforces deployguard-refusals
// as this guard would, as last checked. It is read on every admission and
// re-checked while the guard runs (cmd/deployguard): a policy or binding
// deleted, edited or left behind by another release makes the webhook
// evaluate the refusals itself again, and the leader routes them to the
// enforce entry, instead of leaving them to nobody until the next start.
type NativeEnforcement struct {
	on       atomic.Bool
	mu       sync.Mutex
	changed  chan struct{}
	onChange func(bool)
}

// NewNativeEnforcement starts with what the start-up check found.
func NewNativeEnforcement(on bool) *NativeEnforcement {
	n := &NativeEnforcement{changed: make(chan struct{})}
	n.on.Store(on)
	return n
}

// Enforced reports whether the API server enforces the refusals.
func (n *NativeEnforcement) Enforced() bool { return n.on.Load() }

// OnChange calls f with the current finding and with each new one (a
// metric follows it).
func (n *NativeEnforcement) OnChange(f func(bool)) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.onChange = f
	f(n.on.Load())
}

// Set records a check's finding and reports whether it changed.
func (n *NativeEnforcement) Set(on bool) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.on.Load() == on {
		return false
	}
	if n.onChange != nil {
		n.onChange(on)
	}
	n.on.Store(on)
	close(n.changed)
	n.changed = make(chan struct{})
	return true
}

// Changed is closed at the next change.
func (n *NativeEnforcement) Changed() <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.changed
}

// NativeEnforced reports whether the API server enforces the native refusals
// now, so that the webhook need not evaluate them again: the config says
// they are installed and, where the guard checks, the last check found them
// enforced.
func (o *Options) NativeEnforced() bool {
	if !o.NativeInAPIServer {
		return false
	}
	return o.Native == nil || o.Native.Enforced()
}
