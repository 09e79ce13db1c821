package lockregotel

import (
	"maps"
	"sync"
	"sync/atomic"

	"github.com/lockreg/lockreg"
)

// The counts below are kept by the hooks and read when the metrics are
// collected, through observable instruments: an atomic add costs an
// event a few nanoseconds, a synchronous instrument of the SDK a hundred
// or more.

// liveHolds counts the holds live now by key, for lockreg.holds with
// WithLockKeys.
type liveHolds struct {
	mu    sync.Mutex
	byKey map[string]int64 // keys held no more are dropped, and their series with them
}

func (l *liveHolds) add(key string, n int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n < 0 && l.byKey[key] <= 0 {
		return // the release of a hold taken before the registry was instrumented
	}
	if l.byKey[key] += n; l.byKey[key] == 0 {
		delete(l.byKey, key)
	}
}

// perKey returns the counts by key, with WithLockKeys.
func (l *liveHolds) perKey() map[string]int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.byKey)
}

// callCounts counts Redis calls by operation, for lockreg.redis.calls. The
// counters' map is swapped whole when an operation comes up for the first
// time, so that counting takes no lock.
type callCounts struct {
	mu  sync.Mutex // serializes the swaps
	ops atomic.Pointer[map[lockreg.RedisOp]*atomic.Int64]
}

func (c *callCounts) add(op lockreg.RedisOp, n int) {
	if ops := c.ops.Load(); ops != nil {
		if count := (*ops)[op]; count != nil {
			count.Add(int64(n))
			return
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	ops := map[lockreg.RedisOp]*atomic.Int64{}
	if current := c.ops.Load(); current != nil {
		ops = maps.Clone(*current)
	}
	if ops[op] == nil {
		ops[op] = new(atomic.Int64)
	}
	ops[op].Add(int64(n))
	c.ops.Store(&ops)
}

// each calls fn with each operation's count.
func (c *callCounts) each(fn func(op lockreg.RedisOp, n int64)) {
	if ops := c.ops.Load(); ops != nil {
		for op, count := range *ops {
			fn(op, count.Load())
		}
	}
}
