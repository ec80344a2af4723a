package serve

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSoftMemoryLimit(t *testing.T) {
	v, ok, err := softMemoryLimit("268435456", false)
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, int64(241591905), v, "90% of 256Mi")

	_, ok, err = softMemoryLimit("268435456", true)
	require.NoError(t, err)
	assert.False(t, ok, "an explicit GOMEMLIMIT wins")

	_, ok, err = softMemoryLimit("", false)
	require.NoError(t, err)
	assert.False(t, ok)

	_, _, err = softMemoryLimit("256Mi", false)
	assert.ErrorContains(t, err, "not a number of bytes")
}
