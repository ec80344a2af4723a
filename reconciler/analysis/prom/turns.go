package prom

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Bounds of the turns kept for callers that wait.
const (
	// maxWaiting bounds the turns kept at once: one per revision and
	// metric waiting to be measured. Past it, a caller is told to come back
	// without a turn kept, as if it had asked a moment later.
	maxWaiting = 100_000
	// forgetTurnAfter: a turn not claimed this long after it came is
	// forgotten (its Deployment was deleted, its run ended).
	forgetTurnAfter = time.Minute
)

// turns hands out the query bound's tokens first come, first served. A
// caller that must wait is given a turn, a reservation of a token at a
// later time kept by its key, and comes back for it when it is due: a
// thousand revisions due at once each wait their own turn once, and none of
// them polls. (Asking the limiter again on every requeue took no token and
// had a thousand reconciles spin every 50 ms for whichever won the next
// one: 8,800 reconciles a second, a whole core, in bench-checks.)
type turns struct {
	mu        sync.Mutex
	limiter   *rate.Limiter
	waiting   map[string]time.Time
	lastSweep time.Time
}

func newTurns(limiter *rate.Limiter) *turns {
	return &turns{limiter: limiter, waiting: map[string]time.Time{}}
}

// take returns 0 when the caller of key may query now (its token taken), or
// how long until its turn.
func (t *turns) take(key string, now time.Time) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	if at, ok := t.waiting[key]; ok {
		if d := at.Sub(now); d > 0 {
			return d
		}
		delete(t.waiting, key)
		return 0
	}
	r := t.limiter.ReserveN(now, 1)
	if !r.OK() {
		return time.Second // a burst under 1, which Config.Validate refuses
	}
	d := r.DelayFrom(now)
	if d <= 0 {
		return 0
	}
	t.sweep(now)
	if len(t.waiting) >= maxWaiting {
		r.CancelAt(now)
		return d
	}
	t.waiting[key] = now.Add(d)
	return d
}

// sweep forgets turns long past and never claimed, once a minute at most.
func (t *turns) sweep(now time.Time) {
	if now.Sub(t.lastSweep) < forgetTurnAfter {
		return
	}
	t.lastSweep = now
	for k, at := range t.waiting {
		if now.Sub(at) > forgetTurnAfter {
			delete(t.waiting, k)
		}
	}
}

// len is how many callers wait for their turn.
func (t *turns) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.waiting)
}
