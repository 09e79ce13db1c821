package lockreg

import (
	"context"
	"errors"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockreg/lockreg/internal/redisstat"
	"github.com/lockreg/lockreg/internal/redistest"
)

func TestGoroutineIDMatchesRuntime(t *testing.T) {
	// goid reads the id from the runtime's g struct; a Go release that moves
	// it must fail here, not silently merge owners.
	stackID := func() int64 {
		buf := make([]byte, 64)
		buf = buf[:runtime.Stack(buf, false)]
		id, err := strconv.ParseInt(strings.Fields(string(buf))[1], 10, 64)
		require.NoError(t, err)
		return id
	}
	require.Equal(t, stackID(), goroutineID())
	var ids [2]int64
	inGoroutine(func() {
		ids[0] = goroutineID()
		ids[1] = stackID()
	})
	require.Equal(t, ids[1], ids[0])
	require.NotEqual(t, goroutineID(), ids[0])
}

func TestReentrantLockingMakesNoRedisCalls(t *testing.T) {
	ctx := context.Background()
	var counter redisstat.Counter
	srv := redistest.Shared(t)
	client := srv.Client(t) // for checks, not counted
	r := newRegistry(t, srv.Client(t, &counter))
	lock := r.Obtain("k")
	lock.Lock() // loads both scripts into Redis, so no NOSCRIPT fallback below
	lock.Unlock()
	requireSettled(t, r)

	lock.Lock()
	before := counter.RoundTrips()
	require.True(t, lock.TryLock())
	require.NoError(t, lock.LockContext(ctx))
	lock.Lock()
	require.True(t, r.Obtain("k").TryLock(), "another Lock value of the same key shares the hold")
	for range 4 {
		require.NoError(t, lock.UnlockContext(ctx))
	}
	require.Equal(t, before, counter.RoundTrips(), "re-locking and inner unlocks stay local")
	require.Equal(t, int64(1), client.Exists(ctx, "lockreg-test:"+t.Name()+":{k}").Val(), "still held at depth 1")

	require.NoError(t, lock.UnlockContext(ctx))
	require.Equal(t, before+1, counter.RoundTrips(), "the last unlock is one release call")
	require.Zero(t, client.Exists(ctx, "lockreg-test:"+t.Name()+":{k}").Val())
	require.Zero(t, r.locals.size())
}

func TestOtherGoroutinesOfTheOwnerWaitLocally(t *testing.T) {
	var counter redisstat.Counter
	r := newRegistry(t, redistest.Shared(t).Client(t, &counter))
	lock := r.Obtain("k")
	lock.Lock()
	requireSettled(t, r)

	before := counter.RoundTrips()
	inGoroutine(func() {
		require.False(t, lock.TryLock(), "a goroutine started by the owner is not the owner")
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		require.ErrorIs(t, lock.LockContext(ctx), ErrNotObtained)
	})
	require.Equal(t, before, counter.RoundTrips(), "waiting behind a local owner costs no Redis traffic")

	acquired := make(chan struct{})
	released := make(chan struct{})
	go func() {
		lock.Lock()
		close(acquired)
		lock.Unlock()
		close(released)
	}()
	select {
	case <-acquired:
		t.Fatal("a second goroutine acquired a held lock")
	case <-time.After(100 * time.Millisecond):
	}
	lock.Unlock()
	<-acquired
	<-released
	require.Zero(t, r.locals.size())
}

func TestUnlockByNonOwner(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	r := newRegistry(t, client)
	lock := r.Obtain("order-7")

	require.ErrorIs(t, lock.UnlockContext(ctx), ErrNotHeld, "never locked")
	lock.Lock()
	defer lock.Unlock()
	inGoroutine(func() {
		err := lock.UnlockContext(ctx)
		require.ErrorIs(t, err, ErrNotHeld)
		require.Contains(t, err.Error(), `"order-7"`)
		defer func() {
			v := recover()
			err, ok := v.(error)
			require.True(t, ok, "Unlock by a non-owner panics with an error, got %v", v)
			require.ErrorIs(t, err, ErrNotHeld)
			require.Contains(t, err.Error(), `"order-7"`)
		}()
		lock.Unlock()
	})
	require.Equal(t, r.clientID, client.Get(ctx, "lockreg-test:"+t.Name()+":{order-7}").Val(), "still held")
	require.True(t, lock.TryLock(), "the owner still holds it (reentrantly)")
	lock.Unlock()
}

// A goroutine whose hold is lost, with another registry holding the key
// since, does not lock it again as if it held it: LockContext fails at
// once, matching ErrNotObtained and ErrLockLost, and TryLock fails, as a
// nested Do does. Lock, which cannot report, locks again rather than
// hang; the outer Unlock reports the loss.
func TestALostHoldIsNotLockedAgain(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	r := newRegistry(t, client)
	lock := r.Obtain("k")
	require.NoError(t, lock.LockContext(ctx))
	require.NoError(t, client.Del(ctx, lock.keys().Lock()).Err())
	requireFires(t, lock.Lost(), blindLimit, "the key was deleted")
	taken, err := newRegistry(t, client).Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	defer func() { require.NoError(t, taken.Release(ctx)) }()

	err = lock.LockContext(ctx)
	require.ErrorIs(t, err, ErrNotObtained)
	require.ErrorIs(t, err, ErrLockLost)
	require.False(t, lock.TryLock())
	lock.Lock()
	lock.Unlock()
	require.ErrorIs(t, lock.UnlockContext(ctx), ErrLockLost, "the outer Unlock, the last")
	requireOpen(t, taken.Lost(), "the other registry's hold is untouched")
}

// Lock's doc: a goroutine that holds the lock locks again, even if its
// hold is lost. Close loses every hold; a reentrant Lock after it must not
// park the goroutine for good while it holds the key, whose outer Unlock
// would then never come and which would stay locked in Redis for its lease.
func TestAHoldersLockAfterCloseLocksAgainAndItsUnlockReleases(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	r := newRegistry(t, client)
	lock := r.Obtain("k")
	done := make(chan error, 1)
	go func() {
		lock.Lock()
		if err := r.Close(); err != nil {
			done <- err
			return
		}
		lock.Lock() // reentrant, under a hold Close lost
		lock.Unlock()
		done <- lock.UnlockContext(ctx)
	}()
	select {
	case err := <-done:
		require.ErrorIs(t, err, ErrLockLost, "the outer Unlock reports the loss")
	case <-time.After(5 * time.Second):
		t.Fatal("the holder's Lock parked for good after Close")
	}
	require.Zero(t, client.Exists(ctx, lock.keys().Lock()).Val(), "the outer Unlock released the key")
}

// TestLockingAgainPastTheLeaseFails: once a hold's lease ran out
// unrenewed, locking its key again through it (a reentrant LockContext or
// TryLock, a nested Do or DoAll) fails with ErrLockLost, as a Do whose
// acquisition came too late runs nothing: the section would run
// unprotected. It does not wait for the watchdog's next tick to signal the
// loss, which comes up to lease/3 later.
func TestLockingAgainPastTheLeaseFails(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	const lease = 2 * time.Second
	// Taken right after New, whose watchdog ticks every lease/3 from then:
	// the tick after the leases end comes about lease/3 after them.
	r := newRegistry(t, client, WithRenewal(false), WithExpireAfter(lease))
	lock := r.Obtain("k")
	require.NoError(t, lock.LockContext(ctx))
	defer lock.Unlock()
	h := r.locals.ownedBy("k", goroutineID()).hold.Load()
	ran := false
	err := r.Do(ctx, "j", func(ctx context.Context) error {
		outer := r.HoldFor(ctx, "j")
		require.Eventually(t, func() bool { return h.leaseOver() && outer.leaseOver() }, 2*lease, time.Millisecond)

		err := lock.LockContext(ctx)
		require.ErrorIs(t, err, ErrNotObtained, "a reentrant LockContext past the lease")
		require.ErrorIs(t, err, ErrLockLost)
		require.False(t, lock.TryLock(), "a reentrant TryLock past the lease")
		err = r.Do(ctx, "j", func(context.Context) error { ran = true; return nil })
		require.ErrorIs(t, err, ErrNotObtained, "a nested Do past the lease")
		require.ErrorIs(t, err, ErrLockLost)
		err = r.DoAll(ctx, []string{"j", "x"}, func(context.Context) error { ran = true; return nil })
		require.ErrorIs(t, err, ErrNotObtained, "a nested DoAll past the lease")
		require.ErrorIs(t, err, ErrLockLost)
		require.Error(t, ctx.Err(), "the loss found is signalled: fn's context ends")
		return nil
	})
	require.ErrorIs(t, err, ErrLockLost)
	require.False(t, ran)
	requireFires(t, h.Lost(), time.Second, "the loss found is signalled")
}

// TestANestedCallRunsNothingUnderAHoldReleasedEarly: fn released its Do's
// hold early (HoldFor(ctx, key).Release); a Do or DoAll nested through
// its context must not run at once as if the key were still held.
func TestANestedCallRunsNothingUnderAHoldReleasedEarly(t *testing.T) {
	ctx := context.Background()
	r := newRegistry(t, redistest.Shared(t).Client(t))
	ran := false
	_ = r.Do(ctx, "k", func(ctx context.Context) error {
		require.NoError(t, r.HoldFor(ctx, "k").Release(ctx))
		err := r.Do(ctx, "k", func(context.Context) error { ran = true; return nil })
		require.ErrorIs(t, err, ErrNotObtained, "a nested Do")
		err = r.DoAll(ctx, []string{"j", "k"}, func(context.Context) error { ran = true; return nil })
		require.ErrorIs(t, err, ErrNotObtained, "a nested DoAll")
		return nil
	})
	require.False(t, ran, "a nested call ran with the key released")
	requireNoLocalState(t, r)
}

// A nested Do or DoAll whose context ended, cancelled with a cause of the
// caller's, matches ErrNotObtained and the context's error, as an
// acquisition's does; and the cause.
func TestANestedCallWhoseContextEndedMatchesItsError(t *testing.T) {
	r := newRegistry(t, redistest.Shared(t).Client(t))
	cause := errors.New("the request went away")
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	err := r.Do(ctx, "k", func(ctx context.Context) error {
		cancel(cause)
		nested := r.Do(ctx, "k", func(context.Context) error { return nil })
		require.ErrorIs(t, nested, ErrNotObtained)
		require.ErrorIs(t, nested, context.Canceled)
		require.ErrorIs(t, nested, cause)
		all := r.DoAll(ctx, []string{"k"}, func(context.Context) error { return nil })
		require.ErrorIs(t, all, ErrNotObtained)
		require.ErrorIs(t, all, context.Canceled)
		require.NotErrorIs(t, all, ErrLockLost, "the outer hold was not lost")
		return nil
	})
	require.NoError(t, err)
}

// A Do whose fn released its hold early (HoldFor(ctx, key).Release) reports
// how that hold ended, as it would had it released the hold itself: nil,
// not ErrNotHeld for its own release; ErrLockLost if the hold was lost
// while fn ran, even though fn returned nil.
func TestADoWhoseFnReleasedItsHoldEarlyReportsHowItEnded(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	r := newRegistry(t, client)
	err := r.Do(ctx, "k", func(ctx context.Context) error {
		return r.HoldFor(ctx, "k").Release(ctx)
	})
	require.NoError(t, err, "the early release was the hold's release")

	err = r.Do(ctx, "k", func(ctx context.Context) error {
		h := r.HoldFor(ctx, "k")
		require.NoError(t, client.Del(ctx, h.redisKey()).Err()) // behind the hold's back
		requireFires(t, h.Lost(), 5*time.Second, "tracking found the key gone")
		_ = h.Release(context.WithoutCancel(ctx)) // fn ignores what it says
		return nil
	})
	require.ErrorIs(t, err, ErrLockLost, "lost while fn ran")
	require.NotErrorIs(t, err, ErrNotHeld)
	requireNoLocalState(t, r)
}
