package lockregtest_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/lockreg/lockreg"
	"github.com/lockreg/lockreg/extra/lockregtest"
	"github.com/lockreg/lockreg/internal/redistest"
)

// TestMain checks that no goroutine outlives the tests: the kit's
// cleanups close every registry, client and embedded server.
func TestMain(m *testing.M) { goleak.VerifyTestMain(redistest.M(m)) }

// server is where a test makes its registries: the embedded server, or
// a real redis-server.
type server struct {
	embedded bool
	// newRegistry makes the test's first registry on the server: New's,
	// or NewAt's; lockregtest.Another makes the others.
	newRegistry func(t testing.TB, opts ...lockreg.Option) *lockreg.Registry
}

// onBoth runs test on the embedded server and on a real redis-server (the
// test binary's shared one), so that the embedded server cannot drift
// from Redis's semantics unnoticed: every behaviour the kit's users rely
// on is checked on both.
func onBoth(t *testing.T, test func(t *testing.T, srv server)) {
	t.Run("embedded", func(t *testing.T) { test(t, server{embedded: true, newRegistry: lockregtest.New}) })
	t.Run("redis", func(t *testing.T) {
		addr := redistest.Shared(t).Addr()
		test(t, server{newRegistry: func(t testing.TB, opts ...lockreg.Option) *lockreg.Registry {
			return lockregtest.NewAt(t, "redis://"+addr+"/0", opts...)
		}})
	})
}

// fatalOf runs f with a stand-in for t that records a call of Fatalf
// and ends f's goroutine there, as t.Fatalf does, and returns the
// message, or "" if f did not fail.
func fatalOf(t *testing.T, f func(t testing.TB)) string {
	rec := &fatalRecorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(rec)
	}()
	<-done
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return rec.fatal
}

type fatalRecorder struct {
	testing.TB
	mu    sync.Mutex
	fatal string
}

func (r *fatalRecorder) Helper() {}

func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.mu.Lock()
	r.fatal = fmt.Sprintf(format, args...)
	r.mu.Unlock()
	runtime.Goexit()
}

func (r *fatalRecorder) Fatal(args ...any) {
	r.mu.Lock()
	r.fatal = fmt.Sprint(args...)
	r.mu.Unlock()
	runtime.Goexit()
}

// acquireIn acquires key of r in a goroutine of its own, within ctx, and
// sends the hold, or the error, on the channel it returns.
func acquireIn(ctx context.Context, r *lockreg.Registry, key string) <-chan acquired {
	result := make(chan acquired, 1)
	go func() {
		h, err := r.Obtain(key).Acquire(ctx)
		result <- acquired{h, err}
	}()
	return result
}

type acquired struct {
	hold *lockreg.Hold
	err  error
}

// waiters waits until a registry waits for key in Redis, as Inspect
// shows it, with every waiter's owner name known (a registry writes it in
// the background as it begins to wait), and returns the waiters.
func waiters(t *testing.T, r *lockreg.Registry, key string) []lockreg.Waiter {
	t.Helper()
	var waiting []lockreg.Waiter
	require.Eventually(t, func() bool {
		info, err := r.Inspect(context.Background(), key)
		require.NoError(t, err)
		waiting = info.Waiting
		return len(waiting) > 0 && !slices.ContainsFunc(waiting, func(w lockreg.Waiter) bool { return w.Owner == "" })
	}, 5*time.Second, time.Millisecond, "nobody waits for %q", key)
	return waiting
}

// holder waits until r holds key in Redis, with its owner name known
// (written in the background as it first acquires), and returns it.
func holder(t *testing.T, r *lockreg.Registry, key string) lockreg.LockInfo {
	t.Helper()
	var info lockreg.LockInfo
	require.Eventually(t, func() bool {
		var err error
		info, err = r.Inspect(context.Background(), key)
		require.NoError(t, err)
		return info.Held && info.Owner != ""
	}, 5*time.Second, time.Millisecond, "nobody holds %q", key)
	return info
}

// subscribedWaiter waits until r, a new registry waiting for a key, has
// subscribed and marked itself again: the attempt that found the key
// held, then, once subscribed, one more (Stats counts both). A grant to
// it goes nowhere before that, and the key is its own next attempt's.
func subscribedWaiter(t *testing.T, r *lockreg.Registry) {
	t.Helper()
	require.Eventually(t, func() bool { return r.Stats().FailedAttempts >= 2 }, 5*time.Second, time.Millisecond)
}
