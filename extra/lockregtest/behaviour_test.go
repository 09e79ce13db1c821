package lockregtest_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockreg/lockreg"
	"github.com/lockreg/lockreg/extra/lockregtest"
)

// TestThePairExcludesEachOther: while one registry holds a key the other
// cannot take it, and work under Do in both never overlaps.
func TestThePairExcludesEachOther(t *testing.T) {
	onBoth(t, func(t *testing.T, srv server) {
		ctx := context.Background()
		a := srv.newRegistry(t)
		b := lockregtest.Another(t, a)
		require.Equal(t, a.Key(), b.Key())

		h, err := a.Obtain("k").Acquire(ctx)
		require.NoError(t, err)
		short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		_, err = b.Obtain("k").Acquire(short)
		require.ErrorIs(t, err, lockreg.ErrNotObtained)
		require.NoError(t, h.Release(ctx))

		var inside, overlaps, done atomic.Int64
		var workers sync.WaitGroup
		for _, r := range []*lockreg.Registry{a, b, a, b} {
			workers.Go(func() {
				for range 25 {
					assert.NoError(t, r.Do(ctx, "k", func(context.Context) error {
						if inside.Add(1) != 1 {
							overlaps.Add(1)
						}
						time.Sleep(100 * time.Microsecond)
						inside.Add(-1)
						done.Add(1)
						return nil
					}))
				}
			})
		}
		workers.Wait()
		require.Zero(t, overlaps.Load(), "work under the lock overlapped")
		require.EqualValues(t, 100, done.Load())
	})
}

// TestLoseSignalsTheHold: once Lose returns, the hold's Lost channel is
// closed, for the cause a ForceUnlock gives, and its Release reports the
// loss; all within a second.
func TestLoseSignalsTheHold(t *testing.T) {
	onBoth(t, func(t *testing.T, srv server) {
		ctx := context.Background()
		r := srv.newRegistry(t)
		h, cause, took := loseAHold(t, r, "k")
		require.Less(t, took, time.Second)
		select {
		case <-h.Lost():
		default:
			t.Fatal("Lose returned before the hold's Lost channel closed")
		}
		require.Equal(t, lockreg.LossForced, cause)
		require.ErrorIs(t, h.Err(), lockreg.ErrLockLost)
		require.ErrorIs(t, h.Release(ctx), lockreg.ErrLockLost)
		require.Zero(t, r.Stats().Held)
		info, err := r.Inspect(ctx, "k")
		require.NoError(t, err)
		require.False(t, info.Held)
	})
}

// TestLoseEndsDo: the context of the Do that holds the key ends with a
// cause matching ErrLockLost, and Do returns an error that matches it.
func TestLoseEndsDo(t *testing.T) {
	onBoth(t, func(t *testing.T, srv server) {
		r := srv.newRegistry(t)
		started := make(chan struct{})
		done := make(chan error, 1)
		var cause error
		go func() {
			done <- r.Do(context.Background(), "k", func(ctx context.Context) error {
				close(started)
				<-ctx.Done()
				cause = context.Cause(ctx)
				return ctx.Err()
			})
		}()
		<-started
		start := time.Now()
		lockregtest.Lose(t, r, "k")
		select {
		case err := <-done:
			require.Less(t, time.Since(start), time.Second)
			require.ErrorIs(t, cause, lockreg.ErrLockLost)
			require.ErrorIs(t, err, lockreg.ErrLockLost)
		case <-time.After(time.Second):
			t.Fatal("Do did not return within a second of the loss")
		}
	})
}

// TestLoseOfAGoroutinesLock: a key the goroutine holds through
// LockContext is lost alike; its UnlockContext reports it.
func TestLoseOfAGoroutinesLock(t *testing.T) {
	onBoth(t, func(t *testing.T, srv server) {
		ctx := context.Background()
		r := srv.newRegistry(t)
		l := r.Obtain("k")
		require.NoError(t, l.LockContext(ctx))
		lockregtest.Lose(t, r, "k")
		select {
		case <-l.Lost():
		default:
			t.Fatal("Lose returned before the lock's Lost channel closed")
		}
		require.ErrorIs(t, l.UnlockContext(ctx), lockreg.ErrLockLost)
	})
}

// TestLoseWakesTheOtherRegistry: a registry waiting for the key takes it
// as soon as it is lost (its retry interval is 2s: only the wake-up can
// have done it within a second), with a fencing token above the lost
// hold's; the lost hold's release leaves its key alone.
func TestLoseWakesTheOtherRegistry(t *testing.T) {
	onBoth(t, func(t *testing.T, srv server) {
		ctx := context.Background()
		a := srv.newRegistry(t)
		b := lockregtest.Another(t, a, lockreg.WithRetryInterval(2*time.Second))
		h, err := a.Obtain("k").Acquire(ctx)
		require.NoError(t, err)
		lostToken, err := h.Token(ctx)
		require.NoError(t, err)

		waiting, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		taken := acquireIn(waiting, b, "k")
		require.Equal(t, t.Name()+"#2", waiters(t, a, "k")[0].Owner)
		start := time.Now()
		lockregtest.Lose(t, a, "k")
		var hb *lockreg.Hold
		select {
		case got := <-taken:
			require.NoError(t, got.err)
			hb = got.hold
		case <-time.After(time.Second):
			t.Fatal("the waiting registry did not take the lost key within a second")
		}
		require.Less(t, time.Since(start), time.Second)

		require.ErrorIs(t, h.Release(ctx), lockreg.ErrLockLost)
		info, err := a.Inspect(ctx, "k")
		require.NoError(t, err)
		require.True(t, info.Held)
		require.Equal(t, t.Name()+"#2", info.Owner, "the lost hold's release took the key from its new holder")
		token, err := hb.Token(ctx)
		require.NoError(t, err)
		require.Greater(t, token, lostToken)
		require.NoError(t, hb.Release(ctx))
	})
}

// TestAReleaseGrantsTheKeyToTheWaiter: a release passes the key straight
// to the registry waiting for it, which hears of it at once (its retry
// interval is 2s).
func TestAReleaseGrantsTheKeyToTheWaiter(t *testing.T) {
	onBoth(t, func(t *testing.T, srv server) {
		ctx := context.Background()
		a := srv.newRegistry(t)
		b := lockregtest.Another(t, a, lockreg.WithRetryInterval(2*time.Second))
		paths := make(chan lockreg.Path, 1)
		b.AddHooks(lockreg.Hooks{AcquireDone: func(_ context.Context, e lockreg.AcquireEvent) { paths <- e.Path }})
		h, err := a.Obtain("k").Acquire(ctx)
		require.NoError(t, err)
		waiting, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		taken := acquireIn(waiting, b, "k")
		subscribedWaiter(t, b)

		start := time.Now()
		require.NoError(t, h.Release(ctx))
		select {
		case got := <-taken:
			require.NoError(t, got.err)
			require.NoError(t, got.hold.Release(ctx))
		case <-time.After(time.Second):
			t.Fatal("the waiting registry did not take the released key within a second")
		}
		require.Less(t, time.Since(start), time.Second)
		require.Equal(t, lockreg.PathGrant, <-paths)
		require.EqualValues(t, 1, b.Stats().Grants)
	})
}

// TestInspectSeesTheHolderAndTheWaiters: Inspect and Locks report the
// holder by the name the kit gave it, its lease, its token and who
// waits.
func TestInspectSeesTheHolderAndTheWaiters(t *testing.T) {
	onBoth(t, func(t *testing.T, srv server) {
		ctx := context.Background()
		a := srv.newRegistry(t)
		b := lockregtest.Another(t, a)
		h, err := a.Obtain("k").Acquire(ctx)
		require.NoError(t, err)
		token, err := h.Token(ctx)
		require.NoError(t, err)

		info := holder(t, b, "k")
		require.Equal(t, t.Name()+"#1", info.Owner)
		require.Positive(t, info.TTL)
		require.LessOrEqual(t, info.TTL, lockregtest.Lease)
		require.Equal(t, token, info.Token)
		require.Empty(t, info.Waiting)

		waiting, cancel := context.WithCancel(ctx)
		taken := acquireIn(waiting, b, "k")
		waiters := waiters(t, a, "k")
		require.Len(t, waiters, 1)
		require.Equal(t, t.Name()+"#2", waiters[0].Owner)
		var held []string
		for info, err := range b.Locks(ctx) {
			require.NoError(t, err)
			held = append(held, info.Key+" by "+info.Owner)
		}
		require.Equal(t, []string{"k by " + t.Name() + "#1"}, held)
		cancel()
		require.ErrorIs(t, (<-taken).err, lockreg.ErrNotObtained)

		// The cancelled waiter withdraws its mark as it leaves; a release
		// meanwhile grants it the key, which it gives back.
		require.NoError(t, h.Release(ctx))
		require.Eventually(t, func() bool {
			info, err := b.Inspect(ctx, "k")
			require.NoError(t, err)
			return !info.Held
		}, 5*time.Second, time.Millisecond)
	})
}

// TestLeasesRunOutOnTheWallClock: a key whose holder stopped renewing it
// (as a crashed process does) frees when its lease runs out, and not
// before; its holder is told.
func TestLeasesRunOutOnTheWallClock(t *testing.T) {
	onBoth(t, func(t *testing.T, srv server) {
		ctx := context.Background()
		const lease = 500 * time.Millisecond
		a := srv.newRegistry(t, lockreg.WithExpireAfter(lease), lockreg.WithRenewal(false))
		b := lockregtest.Another(t, a)
		h, err := a.Obtain("k").Acquire(ctx)
		require.NoError(t, err)
		info, err := b.Inspect(ctx, "k")
		require.NoError(t, err)
		require.True(t, info.Held)
		require.LessOrEqual(t, info.TTL, lease)

		start := time.Now()
		waiting, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		hb, err := b.Obtain("k").Acquire(waiting)
		require.NoError(t, err)
		require.GreaterOrEqual(t, time.Since(start), info.TTL-50*time.Millisecond, "taken before the lease ran out")
		require.NoError(t, hb.Release(ctx))
		select {
		case <-h.Lost():
		case <-time.After(time.Second):
			t.Fatal("the holder was not told that its lease ran out")
		}
		require.ErrorIs(t, h.Release(ctx), lockreg.ErrLockLost)
	})
}

// TestLoseWithPubSubOff: without notifications, and on the embedded
// server without CLIENT TRACKING too, the holder is told at once, and of
// a forced unlock: its own registry forced the key open.
func TestLoseWithPubSubOff(t *testing.T) {
	onBoth(t, func(t *testing.T, srv server) {
		r := srv.newRegistry(t, lockreg.WithPubSub(false))
		h, cause, took := loseAHold(t, r, "k")
		require.Equal(t, lockreg.LossForced, cause)
		require.Less(t, took, time.Second)
		require.ErrorIs(t, h.Release(context.Background()), lockreg.ErrLockLost)
	})
}

// TestTheCleanupClosesTheRegistries: the registries of a test are closed
// when it ends.
func TestTheCleanupClosesTheRegistries(t *testing.T) {
	onBoth(t, func(t *testing.T, srv server) {
		var a, b *lockreg.Registry
		t.Run("test", func(t *testing.T) {
			a = srv.newRegistry(t)
			b = lockregtest.Another(t, a)
			_, err := a.Obtain("k").Acquire(context.Background())
			require.NoError(t, err)
		})
		for _, r := range []*lockreg.Registry{a, b} {
			_, err := r.Obtain("k").Acquire(context.Background())
			require.ErrorIs(t, err, lockreg.ErrClosed)
		}
	})
}

// loseAHold acquires key in r and has Lose take it; it returns the hold,
// the cause of its loss, as r's hooks heard it, and how long Lose took.
func loseAHold(t *testing.T, r *lockreg.Registry, key string) (*lockreg.Hold, lockreg.LossCause, time.Duration) {
	t.Helper()
	causes := make(chan lockreg.LossCause, 1)
	r.AddHooks(lockreg.Hooks{Lost: func(e lockreg.LossEvent) {
		select {
		case causes <- e.Cause:
		default:
		}
	}})
	h, err := r.Obtain(key).Acquire(context.Background())
	require.NoError(t, err)
	start := time.Now()
	lockregtest.Lose(t, r, key)
	took := time.Since(start)
	select {
	case cause := <-causes:
		return h, cause, took
	case <-time.After(time.Second): // the kit's hooks, which Lose waits for, come first
		t.Fatal("the hooks did not hear of the loss")
		return nil, 0, 0
	}
}
