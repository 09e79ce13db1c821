package lockreg

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockreg/lockreg/internal/redistest"
)

// TestShutdownWaitsForTheHolds: it refuses new acquisitions and ends the
// waiting ones at once, renews the holds while it waits for them, and
// returns nil once they are all released.
func TestShutdownWaitsForTheHolds(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	const lease = 300 * time.Millisecond
	r, err := New(client, "lockreg-test:"+t.Name(), WithExpireAfter(lease), WithRetryInterval(20*time.Millisecond))
	require.NoError(t, err)
	other := newRegistry(t, client)
	h, err := r.Obtain("hold").Acquire(ctx)
	require.NoError(t, err)
	lock := r.Obtain("lock")
	lock.Lock()
	doing := make(chan struct{})
	doErr := make(chan error, 1)
	go func() {
		doErr <- r.Do(ctx, "do", func(context.Context) error {
			close(doing)
			time.Sleep(2 * lease)
			return nil
		})
	}()
	<-doing
	require.NoError(t, other.Obtain("remote").LockContext(ctx))
	waiting := make(chan error, 2)
	go func() { waiting <- r.Obtain("hold").LockContext(ctx) }()   // waits locally
	go func() { waiting <- r.Obtain("remote").LockContext(ctx) }() // waits in Redis
	require.Eventually(t, func() bool { return waitersOf(r, "hold") == 1 && r.Stats().FailedAttempts > 0 }, time.Second, time.Millisecond)

	shutDown := make(chan error, 1)
	go func() { shutDown <- r.Shutdown(ctx) }()
	for range 2 {
		select {
		case err := <-waiting:
			require.ErrorIs(t, err, ErrClosed)
		case <-time.After(time.Second):
			t.Fatal("a waiting acquisition did not end at Shutdown")
		}
	}
	_, err = r.Obtain("new").Acquire(ctx)
	require.ErrorIs(t, err, ErrClosed, "new acquisitions fail at once")
	require.ErrorIs(t, r.Do(ctx, "new", func(context.Context) error { return nil }), ErrClosed)

	time.Sleep(2 * lease) // past the lease: renewal goes on
	select {
	case err := <-shutDown:
		t.Fatalf("Shutdown returned %v while holds lived", err)
	default:
	}
	requireOpen(t, h.Lost(), "renewed while Shutdown waits")
	require.Equal(t, r.clientID, client.Get(ctx, h.lock.keys().Lock()).Val())
	require.NoError(t, <-doErr, "Do finished under its lock")
	require.NoError(t, h.Release(ctx))
	require.NoError(t, lock.UnlockContext(ctx))
	select {
	case err := <-shutDown:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Shutdown did not return once every hold was released")
	}
	require.NoError(t, r.Close(), "Close after Shutdown does nothing")
	other.Obtain("remote").Unlock()
}

// TestShutdownReleasesWhatIsStillHeldWhenItsContextEnds: the keys go back
// (owner-checked), the holds hear it, and their owners' releases only
// free them locally.
func TestShutdownReleasesWhatIsStillHeldWhenItsContextEnds(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	r, err := New(client, "lockreg-test:"+t.Name())
	require.NoError(t, err)
	h, err := r.Obtain("hold").Acquire(ctx)
	require.NoError(t, err)
	taken, err := r.Obtain("taken").Acquire(ctx)
	require.NoError(t, err)
	require.NoError(t, client.Set(ctx, taken.lock.keys().Lock(), "another owner", time.Minute).Err())
	lock := r.Obtain("forgotten")
	inGoroutine(lock.Lock) // a goroutine that returned without unlocking
	var fnCtx context.Context
	doing := make(chan struct{})
	doErr := make(chan error, 1)
	go func() {
		doErr <- r.Do(ctx, "do", func(ctx context.Context) error {
			fnCtx = ctx
			close(doing)
			<-ctx.Done()
			return nil
		})
	}()
	<-doing

	deadline, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, r.Shutdown(deadline), context.DeadlineExceeded, "it had to release keys")
	for _, key := range []string{"hold", "forgotten"} {
		require.Zero(t, client.Exists(ctx, r.Obtain(key).keys().Lock()).Val(), "%s released", key)
	}
	require.Equal(t, "another owner", client.Get(ctx, taken.lock.keys().Lock()).Val(), "owner-checked")
	requireFires(t, h.Lost(), time.Second, "the hold heard")
	err = <-doErr
	require.ErrorIs(t, err, ErrLockLost, "Do's fn was told, and Do says so")
	require.ErrorIs(t, context.Cause(fnCtx), ErrLockLost)

	err = h.Release(ctx)
	require.ErrorIs(t, err, ErrLockLost)
	require.ErrorContains(t, err, "the registry was closed")
	require.ErrorIs(t, h.Release(ctx), ErrNotHeld)
	require.True(t, errors.Is(taken.Release(ctx), ErrLockLost))
	require.Equal(t, "another owner", client.Get(ctx, taken.lock.keys().Lock()).Val())
}

// TestShutdownWithNothingHeldReturnsNil even when its context has ended.
func TestShutdownWithNothingHeldReturnsNil(t *testing.T) {
	r, err := New(redistest.Shared(t).Client(t), "lockreg-test:"+t.Name())
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	assert.NoError(t, r.Shutdown(ctx))
	assert.NoError(t, r.Shutdown(ctx), "idempotent")
}

// TestDoneClosesOnceTheRegistryIsClosed: by Close, or at the end of
// Shutdown, which waits for the holds first.
func TestDoneClosesOnceTheRegistryIsClosed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("Close", func(t *testing.T) {
		r := newRegistry(t, redistest.Shared(t).Client(t))
		require.False(t, isClosed(r.Done()), "Done closed while open")
		require.NoError(t, r.Close())
		require.True(t, isClosed(r.Done()))
	})
	t.Run("Shutdown", func(t *testing.T) {
		r := newRegistry(t, redistest.Shared(t).Client(t))
		h, err := r.Obtain("k").Acquire(ctx)
		require.NoError(t, err)
		ended := make(chan error, 1)
		go func() { ended <- r.Shutdown(ctx) }()
		select {
		case <-r.Done():
			t.Fatal("Done closed while Shutdown waited for a hold")
		case <-time.After(50 * time.Millisecond):
		}
		require.NoError(t, h.Release(ctx))
		requireFires(t, r.Done(), 5*time.Second, "Done closes at Shutdown's end")
		require.NoError(t, <-ended)
	})
}

// TestShutdownsReleaseConfirmsTheHoldsHandedOffBeforeIt: a release that
// handed its key off locally waits for a read of the key after the
// hand-off (tenure.go). When Shutdown releases that key, its release
// answers, not a read that may come after it and find the key gone: the
// hold that ended before Shutdown was not lost.
func TestShutdownsReleaseConfirmsTheHoldsHandedOffBeforeIt(t *testing.T) {
	ctx := context.Background()
	r := newRegistry(t, redistest.Shared(t).Client(t))
	h, err := r.Obtain("shut").Acquire(ctx)
	require.NoError(t, err)
	// As if a hold of the tenure had ended in a hand-off to h and waited.
	c := h.tenure.confirmations()
	waiting := make(chan verdict, 1)
	c.mu.Lock()
	c.waiting = append(c.waiting, waiting)
	c.mu.Unlock()

	ended, cancel := context.WithCancel(ctx)
	cancel()
	require.ErrorIs(t, r.Shutdown(ended), context.Canceled, "Shutdown released the key still held")
	require.ErrorIs(t, h.Release(ctx), ErrLockLost, "the hold Shutdown took the key from is told")
	select {
	case v := <-waiting:
		require.NoError(t, v.err, "the release handed off before Shutdown learns that the key was the registry's")
	case <-time.After(5 * time.Second):
		t.Fatal("no answer")
	}
}

// TestShutdownReturnsOnceTheLastReleaseIsDoneInRedis: a release under
// way when Shutdown begins counts as held until Redis answered it, so that
// a caller who closes the client once Shutdown returns cuts no release
// short, which would leave the key locked until its lease ran out.
func TestShutdownReturnsOnceTheLastReleaseIsDoneInRedis(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Shared(t)
	var stall atomic.Bool
	entered, resume := make(chan struct{}), make(chan struct{})
	client := srv.Client(t, redistest.Hook{Process: func(next redis.ProcessHook) redis.ProcessHook {
		return func(ctx context.Context, cmd redis.Cmder) error {
			if cmd.Name() == "evalsha" && stall.CompareAndSwap(true, false) {
				close(entered)
				<-resume
			}
			return next(ctx, cmd)
		}
	}})
	r := newRegistry(t, client)
	h, err := r.Obtain("slow").Acquire(ctx)
	require.NoError(t, err)
	stall.Store(true)
	released := make(chan error, 1)
	go func() { released <- h.Release(ctx) }()
	<-entered

	type shutdown struct {
		err        error
		keyInRedis int64
	}
	shutDown := make(chan shutdown, 1)
	go func() {
		err := r.Shutdown(ctx)
		shutDown <- shutdown{err, srv.Client(t).Exists(ctx, h.lock.keys().Lock()).Val()}
	}()
	select {
	case got := <-shutDown:
		t.Fatalf("Shutdown returned (%v) while the release was on its way to Redis", got.err)
	case <-time.After(100 * time.Millisecond):
	}
	close(resume)
	require.NoError(t, <-released)
	got := <-shutDown
	require.NoError(t, got.err)
	require.Zero(t, got.keyInRedis, "the key was released in Redis when Shutdown returned")
}

// An acquisition whose ctx ended while its call was on its way may have
// taken the key, which it then releases in the background. Shutdown waits
// for that release too: the Close it ends with would cut it short, and
// the key would wait for its lease, 30 s by default.
func TestShutdownWaitsForTheKeyAnEndedAcquisitionTook(t *testing.T) {
	ctx := context.Background()
	r, admin, redisKey, releaseGo := releasingAnEndedAcquisitionsKey(t)
	shutDown := make(chan error, 1)
	go func() { shutDown <- r.Shutdown(ctx) }()
	select {
	case err := <-shutDown:
		t.Fatalf("Shutdown returned (%v) while the key was on its way back", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(releaseGo)
	require.NoError(t, <-shutDown)
	require.Zero(t, admin.Exists(ctx, redisKey).Val(), "the key was released in Redis when Shutdown returned")
}

// A Shutdown whose ctx ends before that release is done says so, as it
// does for holds it had to release itself: the Close it ends with cuts
// the release short, and the key waits for its lease.
func TestShutdownWhoseContextEndsBeforeABackgroundReleaseSaysSo(t *testing.T) {
	r, admin, redisKey, _ := releasingAnEndedAcquisitionsKey(t)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err := r.Shutdown(ctx)
	require.ErrorIs(t, err, ErrClosed)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.EqualValues(t, 1, admin.Exists(context.Background(), redisKey).Val(), "the key waits for its lease")
}

// releasingAnEndedAcquisitionsKey has an acquisition take a key after its
// ctx ended, and returns once the registry's background release of that
// key is on its way, held back until releaseGo is closed or the
// registry's Close cuts it short; redisKey is the key's.
func releasingAnEndedAcquisitionsKey(t *testing.T) (r *Registry, admin *redis.Client, redisKey string, releaseGo chan struct{}) {
	t.Helper()
	ctx := context.Background()
	srv := redistest.Shared(t)
	var stage atomic.Int32 // 1: stall the acquisition's SET, 2: the release
	setSent, setGo := make(chan struct{}), make(chan struct{})
	releasing := make(chan struct{})
	releaseGo = make(chan struct{})
	client := srv.Client(t, redistest.Hook{Process: func(next redis.ProcessHook) redis.ProcessHook {
		return func(ctx context.Context, cmd redis.Cmder) error {
			switch {
			case cmd.Name() == "set" && stage.CompareAndSwap(1, 2):
				err := next(ctx, cmd) // the key is taken; its reply waits
				close(setSent)
				<-setGo
				return err
			case cmd.Name() == "evalsha" && stage.CompareAndSwap(2, 3):
				close(releasing)
				select {
				case <-releaseGo:
				case <-ctx.Done():
				}
			}
			return next(ctx, cmd)
		}
	}})
	r = newRegistry(t, client)
	lock := r.Obtain("k")
	stage.Store(1)
	acquireCtx, cancel := context.WithCancel(ctx)
	acquired := make(chan error, 1)
	go func() {
		_, err := lock.Acquire(acquireCtx)
		acquired <- err
	}()
	<-setSent
	cancel()
	require.ErrorIs(t, <-acquired, ErrNotObtained)
	close(setGo) // the SET takes the key for an acquisition that ended
	<-releasing
	admin = srv.Client(t)
	redisKey = lock.keys().Lock()
	require.EqualValues(t, 1, admin.Exists(ctx, redisKey).Val(), "the ended acquisition took the key")
	return r, admin, redisKey, releaseGo
}

// Any number of Shutdowns may wait at once (a signal handler, a deferred
// call, another component's): each returns once the last hold is
// released.
func TestConcurrentShutdownsAllReturnOnceTheHoldsAreReleased(t *testing.T) {
	ctx := context.Background()
	r := newRegistry(t, redistest.Shared(t).Client(t))
	h, err := r.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	const shutdowns = 4
	done := make(chan error, shutdowns)
	for range shutdowns {
		go func() { done <- r.Shutdown(ctx) }()
	}
	time.Sleep(100 * time.Millisecond) // they wait for the hold
	require.NoError(t, h.Release(ctx))
	for i := range shutdowns {
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(5 * time.Second):
			t.Fatalf("%d of %d Shutdowns returned", i, shutdowns)
		}
	}
}

// A goroutine that holds a lock may lock it again (reentrantly) while
// Shutdown waits for it to finish its work; others are refused.
func TestAHolderLocksAgainWhileShutdownWaitsForIt(t *testing.T) {
	ctx := context.Background()
	r := newRegistry(t, redistest.Shared(t).Client(t))
	lock := r.Obtain("k")
	require.NoError(t, lock.LockContext(ctx))
	shut := make(chan error, 1)
	go func() { shut <- r.Shutdown(ctx) }()
	require.Eventually(t, r.closing, time.Second, time.Millisecond)

	require.NoError(t, lock.LockContext(ctx), "the holder locks again")
	require.ErrorIs(t, r.Obtain("other").LockContext(ctx), ErrClosed, "a new acquisition is refused")
	require.NoError(t, lock.UnlockContext(ctx))
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned %v while the outer hold is held", err)
	case <-time.After(50 * time.Millisecond):
	}
	require.NoError(t, lock.UnlockContext(ctx))
	require.NoError(t, <-shut)
}

// Once the registry is closed, even the goroutine that holds a lock may
// not lock it again: its hold was lost with Close.
func TestAHolderCannotLockAgainOnceTheRegistryClosed(t *testing.T) {
	ctx := context.Background()
	r := newRegistry(t, redistest.Shared(t).Client(t))
	lock := r.Obtain("k")
	require.NoError(t, lock.LockContext(ctx))
	require.NoError(t, r.Close())
	requireFires(t, lock.Lost(), time.Second, "Close lost the hold")
	require.False(t, lock.TryLock())
	require.ErrorIs(t, lock.LockContext(ctx), ErrClosed)
	require.ErrorIs(t, lock.UnlockContext(ctx), ErrLockLost)
}

// TestShutdownsErrorWrapsASentinel: a Shutdown whose context ended while
// keys were still held returns an error that matches ErrClosed, as every
// error of the package matches a sentinel, and ctx's error.
func TestShutdownsErrorWrapsASentinel(t *testing.T) {
	ctx := context.Background()
	r := newRegistry(t, redistest.Shared(t).Client(t))
	h, err := r.Obtain("left").Acquire(ctx)
	require.NoError(t, err)
	ended, cancel := context.WithCancel(ctx)
	cancel()
	err = r.Shutdown(ended)
	require.ErrorIs(t, err, ErrClosed)
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, h.Release(ctx), ErrLockLost)
}

// TestShutdownAfterCloseReturnsAtOnceAndLeavesTheKeys: Close left the
// keys still held to their owners and their leases; a Shutdown after it
// has nothing to wait for (nothing renews those holds) and must not
// release them behind Close's word.
func TestShutdownAfterCloseReturnsAtOnceAndLeavesTheKeys(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	r := newRegistry(t, client)
	h, err := r.Obtain("left-by-close").Acquire(ctx)
	require.NoError(t, err)
	require.NoError(t, r.Close())
	done := make(chan error, 1)
	go func() { done <- r.Shutdown(ctx) }() // a ctx that never ends
	select {
	case err := <-done:
		require.ErrorIs(t, err, ErrClosed)
	case <-time.After(5 * time.Second):
		t.Fatal("Shutdown after Close waits for holds that nothing renews, until its ctx ends")
	}
	require.ErrorIs(t, r.Shutdown(ctx), ErrClosed, "and so does a second one")
	require.EqualValues(t, 1, client.Exists(ctx, h.redisKey()).Val(), "the key stays until its lease runs out or its owner releases it")
	require.ErrorIs(t, h.Release(ctx), ErrLockLost)
}

// TestShutdownsReleaseSaysWhatItFound: a key taken from its hold behind
// its back, unseen (no tracking, no renewal), is found so by the release
// Shutdown makes once its ctx ended: the hold's error names what it found,
// not the registry's closing, which would hide that another owner may
// have held the key beside it.
func TestShutdownsReleaseSaysWhatItFound(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	r := untrackedRegistry(t, srv)
	holds := make(map[LossCause]*Hold)
	for _, cause := range []LossCause{LossDeleted, LossOverwritten} {
		h, err := r.Obtain(cause.String()).Acquire(ctx)
		require.NoError(t, err)
		holds[cause] = h
	}
	admin := srv.Client(t)
	require.NoError(t, admin.Del(ctx, holds[LossDeleted].redisKey()).Err())
	_, err := admin.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Del(ctx, holds[LossOverwritten].redisKey())
		p.HSet(ctx, holds[LossOverwritten].redisKey(), "not", "a lock")
		return nil
	})
	require.NoError(t, err)

	ended, cancel := context.WithCancel(ctx)
	cancel()
	require.ErrorIs(t, r.Shutdown(ended), context.Canceled, "Shutdown released the keys still held")
	for cause, h := range holds {
		err := h.Release(ctx)
		require.ErrorIs(t, err, ErrLockLost, h.Key())
		require.ErrorContains(t, err, cause.explain(), h.Key())
		require.ErrorContains(t, h.Err(), cause.explain(), h.Key())
	}
}

// TestShutdownsReleaseTellsWhatItFoundEverywhere: the cause Shutdown's
// release found is the one cause of the loss, told alike by the hooks'
// LossEvent and by Err once Done fires, not the registry's closing there
// and the key's deletion in Err.
func TestShutdownsReleaseTellsWhatItFoundEverywhere(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	r := untrackedRegistry(t, srv)
	var mu sync.Mutex
	told := make(map[string][]LossCause)
	r.AddHooks(Hooks{Lost: func(e LossEvent) {
		mu.Lock()
		defer mu.Unlock()
		told[e.Key] = append(told[e.Key], e.Cause)
	}})
	causes := map[string]LossCause{"deleted": LossDeleted, "kept": LossClosed}
	afterDone := make(map[string]chan error)
	holds := make(map[string]*Hold)
	for key := range causes {
		h, err := r.Obtain(key).Acquire(ctx)
		require.NoError(t, err)
		holds[key], afterDone[key] = h, make(chan error, 1)
		go func() {
			<-h.Done()
			afterDone[key] <- h.Err()
		}()
	}
	require.NoError(t, srv.Client(t).Del(ctx, holds["deleted"].redisKey()).Err())

	ended, cancel := context.WithCancel(ctx)
	cancel()
	require.ErrorIs(t, r.Shutdown(ended), context.Canceled, "Shutdown released the keys still held")
	for key, cause := range causes {
		err := <-afterDone[key]
		require.ErrorIs(t, err, ErrLockLost, key)
		require.ErrorContains(t, err, cause.explain(), "Err once Done fired: %s", key)
		require.ErrorContains(t, holds[key].Release(ctx), cause.explain(), key)
		mu.Lock()
		require.Equal(t, []LossCause{cause}, told[key], "the hooks' LossEvent: %s", key)
		mu.Unlock()
	}
}

// TestAnAcquisitionThatShutdownOvertookIsNotCounted: an acquisition whose
// attempt took the key as Shutdown began gives the key back and fails
// with ErrClosed; the caller never held it, and neither do the registry's
// Stats: no acquisition, no wait.
func TestAnAcquisitionThatShutdownOvertookIsNotCounted(t *testing.T) {
	ctx := context.Background()
	r := newRegistry(t, redistest.Shared(t).Client(t))
	shutDown := make(chan error, 1)
	r.AddHooks(Hooks{AcquireAttempt: func(context.Context, string) {
		go func() { shutDown <- r.Shutdown(ctx) }()
		for !r.closing() {
			runtime.Gosched()
		}
	}})
	_, err := r.Obtain("overtaken").Acquire(ctx)
	require.ErrorIs(t, err, ErrClosed)
	require.NoError(t, <-shutDown)
	s := r.Stats()
	require.Zero(t, s.Acquisitions, "no hold was handed out")
	require.Zero(t, s.Wait.Count, "no acquisition waited for a hold")
	require.Zero(t, s.Held)
}

// TestShutdownNamesALossThatCameBeforeIt: a hold whose lease ran out
// before Shutdown, which the watchdog had not yet signalled, was lost as
// expired, though Shutdown's release finds the key the registry's (it may
// have lapsed and come back); and one whose key an operator forced open,
// whose note came before its check did, was lost as forced, though the
// release finds the key merely gone. Err, the hooks and the owner's
// Release name those causes, as a Release would have.
func TestShutdownNamesALossThatCameBeforeIt(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	r := untrackedRegistry(t, srv) // nothing reads the keys but the releases
	told := make(chan LossEvent, 2)
	r.AddHooks(Hooks{Lost: func(e LossEvent) { told <- e }})
	lapsed, forced := lapsedAndForced(t, r) // the forced one's check had not come yet
	require.NoError(t, admin.Del(ctx, forced.redisKey()).Err())

	ended, cancel := context.WithCancel(ctx)
	cancel()
	require.ErrorIs(t, r.Shutdown(ended), ErrClosed)
	requireCause(t, lapsed, LossExpired)
	requireCause(t, forced, LossForced)
	causes := map[string]LossCause{}
	for range 2 {
		e := <-told
		causes[e.Key] = e.Cause
	}
	require.Equal(t, map[string]LossCause{"lapsed": LossExpired, "forced": LossForced}, causes)
	require.ErrorContains(t, lapsed.Release(ctx), LossExpired.explain())
	require.ErrorContains(t, forced.Release(ctx), LossForced.explain())
}

// TestCloseNamesALapseThatCameBeforeIt: a hold whose lease ran out before
// Close, which the watchdog had not yet signalled, was lost as expired,
// not by the closing.
func TestCloseNamesALapseThatCameBeforeIt(t *testing.T) {
	ctx := context.Background()
	r := newRegistry(t, redistest.Shared(t).Client(t))
	h, err := r.Obtain("lapsed").Acquire(ctx)
	require.NoError(t, err)
	h.tenure.leaseEnd.Store(int64(instantOf(time.Now().Add(-time.Millisecond))))
	require.NoError(t, r.Close())
	requireCause(t, h, LossExpired)
	require.ErrorContains(t, h.Release(ctx), LossExpired.explain())
}

// TestAShutdownCalledUnderAHoldWaitsForItUntilItsContextEnds: a Shutdown
// in Do's fn waits for fn's own hold too (as http.Server.Shutdown from a
// handler would), so until its ctx ends; then it releases that key, and
// fn's context ends with the loss.
func TestAShutdownCalledUnderAHoldWaitsForItUntilItsContextEnds(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	r := newRegistry(t, client)
	var shutdownErr, fnCause error
	err := r.Do(ctx, "k", func(fnCtx context.Context) error {
		deadline, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		shutdownErr = r.Shutdown(deadline)
		<-fnCtx.Done()
		fnCause = context.Cause(fnCtx)
		return nil
	})
	require.ErrorIs(t, shutdownErr, ErrClosed)
	require.ErrorIs(t, shutdownErr, context.DeadlineExceeded, "it waited for fn's hold until its ctx ended")
	require.ErrorIs(t, fnCause, ErrLockLost)
	require.ErrorIs(t, err, ErrLockLost)
	require.Zero(t, client.Exists(ctx, r.Obtain("k").keys().Lock()).Val(), "Shutdown released the key")
}
