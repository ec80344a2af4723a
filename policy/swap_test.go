package policy

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestEvaluateDuringLoads: requests keep being decided, each by one whole set
// (never a mix), while sets are swapped underneath them. Run with -race.
func TestEvaluateDuringLoads(t *testing.T) {
	setA := append(Builtins(), denyAlways("a", ""))
	setB := append(Builtins(), denyAlways("b", ""))
	e := newEngine(t, Options{}, setA...)
	in := createInput(t, deployment(goodContainer("web")))

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ctx.Err() == nil; i++ {
			src := setA
			if i%2 == 1 {
				src = setB
			}
			if !assert.NoError(t, e.Load(context.Background(), src), "load") {
				return
			}
		}
	}()

	seen := map[string]int{}
	for range 300 {
		d := e.Evaluate(context.Background(), in)
		require.Len(t, d.Denied, 1, "exactly one of a and b decides each request")
		seen[d.Denied[0].Policy]++
	}
	cancel()
	wg.Wait()
	assert.NotEmpty(t, seen)
}
