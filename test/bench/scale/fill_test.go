package main

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParallelDoesEveryIndexOnce(t *testing.T) {
	var mu sync.Mutex
	seen := map[int]int{}
	err := parallel(context.Background(), 3, 103, 8, func(_ context.Context, i int) error {
		mu.Lock()
		defer mu.Unlock()
		seen[i]++
		return nil
	})
	require.NoError(t, err)
	assert.Len(t, seen, 100)
	for i := 3; i < 103; i++ {
		assert.Equal(t, 1, seen[i], "index %d", i)
	}
}

func TestParallelStopsOnTheFirstError(t *testing.T) {
	boom := errors.New("boom")
	err := parallel(context.Background(), 0, 1000, 4, func(_ context.Context, i int) error {
		if i == 10 {
			return boom
		}
		return nil
	})
	assert.ErrorIs(t, err, boom)
}

func TestKeysFillEveryNamespaceEvenly(t *testing.T) {
	for _, tc := range []struct {
		name                   string
		namespaces, n, perEach int
	}{
		{"the issue's cluster", 500, 50000, 100},
		{"the validation run", 20, 2000, 100},
		{"one namespace, as the earlier figures", 1, 10000, 10000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &bench{o: options{namespaces: tc.namespaces}}
			count := map[string]int{}
			names := map[string]bool{}
			for i := range tc.n {
				k := b.key(i)
				count[k.Namespace]++
				names[k.String()] = true
			}
			assert.Len(t, count, tc.namespaces)
			for ns, c := range count {
				assert.Equal(t, tc.perEach, c, ns)
			}
			assert.Len(t, names, tc.n, "every Deployment has a name of its own")
		})
	}
}

func TestNodesHoldTheBumpsPods(t *testing.T) {
	for _, live := range []int{10, 20, 100, 500} {
		assert.GreaterOrEqual(t, nodesFor(live)*110, 2*(live+1), "live %d", live)
	}
}
