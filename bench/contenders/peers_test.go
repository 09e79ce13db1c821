package contenders

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockreg/lockreg/internal/redistest"
)

// The tests share one redis-server, started on first use on a free
// loopback port (or REDIS_ADDR), and stopped after the tests.
func TestMain(m *testing.M) { os.Exit(redistest.M(m).Run()) }

// newContender makes a contender of f on the shared server, closed when
// the test ends.
func newContender(t *testing.T, f Factory) Contender {
	t.Helper()
	c, err := f.New(redistest.Shared(t).Addr())
	if err != nil {
		t.Fatalf("%s: New: %v", f.Name, err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("%s: Close: %v", f.Name, err)
		}
	})
	return c
}

// testKey is a key no other test uses.
func testKey(t *testing.T) string {
	return strings.NewReplacer("/", ":", " ", "_").Replace(t.Name())
}

func acquire(t *testing.T, c Contender, key string) func(context.Context) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	release, err := c.Acquire(ctx, key)
	if err != nil {
		t.Fatalf("Acquire(%q): %v", key, err)
	}
	return release
}

func release(t *testing.T, release func(context.Context) error) {
	t.Helper()
	if err := release(context.Background()); err != nil {
		t.Fatalf("release: %v", err)
	}
}

// mustWait checks that Acquire of key, with a 200ms context, gives up when
// the context ends, promptly, with an error matching
// context.DeadlineExceeded.
func mustWait(t *testing.T, c Contender, key string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	rel, err := c.Acquire(ctx, key)
	took := time.Since(start)
	if err == nil {
		_ = rel(context.Background())
		t.Fatalf("Acquire(%q) of a held key succeeded after %v", key, took)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Acquire(%q) of a held key: error %v does not match context.DeadlineExceeded", key, err)
	}
	if took < 150*time.Millisecond || took > time.Second {
		t.Errorf("Acquire(%q) of a held key with a 200ms context returned after %v, want 200ms..1s", key, took)
	}
}

func TestAllNames(t *testing.T) {
	seen := map[string]bool{}
	for _, f := range All {
		if f.Name == "" || f.New == nil || seen[f.Name] {
			t.Errorf("factory %q: empty, or its name is taken", f.Name)
		}
		seen[f.Name] = true
	}
}

func TestAcquireRelease(t *testing.T) {
	for _, f := range All {
		t.Run(f.Name, func(t *testing.T) {
			t.Parallel()
			c := newContender(t, f)
			key := testKey(t)
			for range 3 { // each release frees the key
				release(t, acquire(t, c, key))
			}
			other := acquire(t, c, key+":other") // keys are independent
			release(t, acquire(t, c, key))
			release(t, other)
		})
	}
}

// A reentrant contender lets its holder take the key again, and frees it
// at the last release; the others make the holder wait like anyone else
// (none of bsm/redislock, redsync and rueidislock has reentrancy: each
// acquisition is a new token that SET NX refuses while the key is held).
func TestReentrancy(t *testing.T) {
	for _, f := range All {
		t.Run(f.Name, func(t *testing.T) {
			t.Parallel()
			a, b := newContender(t, f), newContender(t, f)
			key := testKey(t)
			outer := acquire(t, a, key)
			if !a.Reentrant() {
				mustWait(t, a, key)
				release(t, outer)
				release(t, acquire(t, b, key))
				return
			}
			inner := acquire(t, a, key)
			release(t, inner)
			mustWait(t, b, key) // still held after the inner release
			release(t, outer)
			release(t, acquire(t, b, key))
		})
	}
}

func TestMutualExclusion(t *testing.T) {
	const goroutines, increments = 4, 30
	for _, f := range All {
		t.Run(f.Name, func(t *testing.T) {
			t.Parallel()
			instances := []Contender{newContender(t, f), newContender(t, f)}
			key := testKey(t)
			var (
				inside  atomic.Int32
				overlap atomic.Int32
				counter atomic.Int64 // read, then written: a lost update shows
				wg      sync.WaitGroup
				errs    = make(chan error, goroutines*len(instances))
			)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			for _, c := range instances {
				for range goroutines {
					wg.Go(func() {
						for range increments {
							rel, err := c.Acquire(ctx, key)
							if err != nil {
								errs <- fmt.Errorf("Acquire: %w", err)
								return
							}
							if !inside.CompareAndSwap(0, 1) {
								overlap.Add(1)
							}
							v := counter.Load()
							time.Sleep(100 * time.Microsecond)
							counter.Store(v + 1)
							inside.Store(0)
							if err := rel(ctx); err != nil {
								errs <- fmt.Errorf("release: %w", err)
								return
							}
						}
					})
				}
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			if n := overlap.Load(); n > 0 {
				t.Errorf("%d holds overlapped another", n)
			}
			if got, want := counter.Load(), int64(len(instances)*goroutines*increments); got != want {
				t.Errorf("counter = %d, want %d", got, want)
			}
		})
	}
}

func TestHolderBlocksOthers(t *testing.T) {
	for _, f := range All {
		t.Run(f.Name, func(t *testing.T) {
			t.Parallel()
			a, b := newContender(t, f), newContender(t, f)
			key := testKey(t)
			held := acquire(t, a, key)
			mustWait(t, b, key)
			release(t, held)
			start := time.Now()
			release(t, acquire(t, b, key))
			if took := time.Since(start); took > 2*time.Second {
				t.Errorf("Acquire of a released key took %v", took)
			}
		})
	}
}

// Close ends every goroutine a contender started: the count returns to
// within 2 of what it was, after rounds that hold, wait (which starts the
// pub/sub subscriptions of those that have them) and release.
func TestCloseLeavesNoGoroutines(t *testing.T) {
	addr := redistest.Shared(t).Addr()
	for _, f := range All {
		t.Run(f.Name, func(t *testing.T) {
			key := testKey(t)
			round := func() {
				a, err := f.New(addr)
				if err != nil {
					t.Fatal(err)
				}
				b, err := f.New(addr)
				if err != nil {
					t.Fatal(err)
				}
				held := acquire(t, a, key)
				mustWait(t, b, key)
				release(t, held)
				release(t, acquire(t, b, key))
				if err := a.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
				if err := b.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			}
			round() // starts whatever a library starts once per process
			base := settledGoroutines(0)
			for range 3 {
				round()
			}
			if n := settledGoroutines(base + 2); n > base+2 {
				buf := make([]byte, 1<<20)
				buf = buf[:runtime.Stack(buf, true)]
				t.Errorf("%d goroutines after Close, %d before:\n%s", n, base, buf)
			}
		})
	}
}

// settledGoroutines polls, for up to 2s, until at most want goroutines run
// (or, for want 0, until the count stops changing), and returns the count.
func settledGoroutines(want int) int {
	n := runtime.NumGoroutine()
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		m := runtime.NumGoroutine()
		if (want > 0 && m <= want) || (want == 0 && m == n) {
			return m
		}
		n = m
	}
	return n
}
