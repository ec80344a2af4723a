package routing

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/deployguard/deployguard/webhook/review"
)

// TestNativeEnforced: the webhook leaves the refusals to the API server only
// while the config says they are installed and the last check found them
// enforced; a lost policy brings them back to the webhook and routes them to
// the failing-closed entry.
func TestNativeEnforced(t *testing.T) {
	o := &review.Options{}
	assert.False(t, o.NativeEnforced(), "not installed")
	o.NativeInAPIServer = true
	assert.True(t, o.NativeEnforced(), "installed, never checked (in-process callers)")

	o.Native = review.NewNativeEnforcement(true)
	assert.True(t, o.NativeEnforced())
	assert.False(t, EnforcedOf(o, LoadedPolicies{}).Refusals)
	assert.NotEqual(t, "true", MustDecide(EnforcedOf(o, LoadedPolicies{})))

	changed := o.Native.Changed()
	assert.True(t, o.Native.Set(false), "lost")
	select {
	case <-changed:
	default:
		require.FailNow(t, "a change closes Changed")
	}
	assert.False(t, o.NativeEnforced())
	assert.True(t, EnforcedOf(o, LoadedPolicies{}).Refusals)
	assert.Equal(t, "true", MustDecide(EnforcedOf(o, LoadedPolicies{})), "the enforce entry takes every request")

	again := o.Native.Changed()
	assert.False(t, o.Native.Set(false), "no change")
	select {
	case <-again:
		require.FailNow(t, "no change, Changed stays open")
	default:
	}
	assert.True(t, o.Native.Set(true), "back")
	assert.True(t, o.NativeEnforced())

	o.NativeInAPIServer = false
	assert.False(t, o.NativeEnforced(), "the config's word comes first")
}
