package lockreg

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockreg/lockreg/internal/redisstat"
	"github.com/lockreg/lockreg/internal/redistest"
)

// acquireIn acquires lock in a goroutine of its own, which then returns,
// and hands the Hold over.
func acquireIn(t *testing.T, ctx context.Context, lock *Lock) *Hold {
	t.Helper()
	got := make(chan *Hold, 1)
	go func() {
		h, err := lock.Acquire(ctx)
		assert.NoError(t, err)
		got <- h
	}()
	h := <-got
	require.NotNil(t, h)
	return h
}

// TestAHoldBelongsToNoGoroutine: the goroutine that acquired may return;
// any other may watch, draw the token and release.
func TestAHoldBelongsToNoGoroutine(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	r := newRegistry(t, client)
	lock := r.Obtain("k")
	h := acquireIn(t, ctx, lock)
	require.Equal(t, "k", h.Key())
	require.Equal(t, r.clientID, client.Get(ctx, lock.keys().Lock()).Val(), "held in Redis")

	var token int64
	inGoroutine(func() {
		requireOpen(t, h.Lost(), "a watcher on another goroutine sees a live hold")
		var err error
		token, err = h.Token(ctx)
		assert.NoError(t, err)
	})
	require.Positive(t, token)
	again, err := h.Token(ctx)
	require.NoError(t, err)
	require.Equal(t, token, again, "one token per hold")

	inGoroutine(func() { assert.NoError(t, h.Release(ctx)) })
	require.Zero(t, client.Exists(ctx, lock.keys().Lock()).Val(), "released in Redis")
	requireOpen(t, h.Lost(), "a release is not a loss")
	require.ErrorIs(t, h.Release(ctx), ErrNotHeld, "a hold is released once")
	_, err = h.Token(ctx)
	require.ErrorIs(t, err, ErrNotHeld)
	requireNoLocalState(t, r)
}

// TestAHoldMakesEveryOtherAcquisitionWait: a Hold is not reentrant; while
// it lives, every acquisition of its key in the registry, by any method
// and from any goroutine (the one that acquired included), waits in one
// FIFO queue, and only the owner talks to Redis.
func TestAHoldMakesEveryOtherAcquisitionWait(t *testing.T) {
	ctx := context.Background()
	var counter redisstat.Counter
	r := newRegistry(t, redistest.Shared(t).Client(t, &counter), WithLocalHandoff(16, time.Hour))
	lock := r.Obtain("k")
	h, err := lock.Acquire(ctx)
	require.NoError(t, err)

	require.False(t, lock.TryLock(), "not even the goroutine that acquired it takes it again")
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, lock.LockContext(short), ErrNotObtained)
	_, err = lock.Acquire(short)
	require.ErrorIs(t, err, ErrNotObtained)

	// Three waiters of three kinds, queued in a known order.
	var order []string
	var mu sync.Mutex
	served := func(name string) {
		mu.Lock()
		order = append(order, name)
		mu.Unlock()
	}
	var wg sync.WaitGroup
	queued := func(n int) {
		require.Eventually(t, func() bool { return waitersOf(r, "k") == n }, time.Second, time.Millisecond)
	}
	wg.Go(func() {
		assert.NoError(t, lock.LockContext(ctx))
		served("LockContext")
		assert.NoError(t, lock.UnlockContext(ctx))
	})
	queued(1)
	wg.Go(func() {
		assert.NoError(t, r.Do(ctx, "k", func(context.Context) error { served("Do"); return nil }))
	})
	queued(2)
	wg.Go(func() {
		h, err := lock.Acquire(ctx)
		if assert.NoError(t, err) {
			served("Acquire")
			assert.NoError(t, h.Release(ctx))
		}
	})
	queued(3)
	requireSettled(t, r)
	calls := counter.RoundTrips()
	time.Sleep(3 * r.cfg.retryInterval)
	require.Equal(t, calls, counter.RoundTrips(), "local waiters make no Redis calls")

	require.NoError(t, h.Release(ctx))
	wg.Wait()
	require.Equal(t, []string{"LockContext", "Do", "Acquire"}, order, "first come, first served")
	require.Equal(t, int64(3), r.Stats().LocalHandoffs, "each release passed the key on without Redis")
	requireNoLocalState(t, r)
}

// TestAHoldHandsOffWithRisingTokens: a Release passes the key to the next
// local waiter as Unlock does, with the next token.
func TestAHoldHandsOffWithRisingTokens(t *testing.T) {
	ctx := context.Background()
	// The default 10ms run of hand-offs can pass before the goroutine
	// queues, on a busy machine under -race (CI saw it).
	r := newRegistry(t, redistest.Shared(t).Client(t), WithLocalHandoff(16, time.Hour))
	lock := r.Obtain("k")
	h, err := lock.Acquire(ctx)
	require.NoError(t, err)
	first, err := h.Token(ctx)
	require.NoError(t, err)
	next := make(chan *Hold, 1)
	go func() {
		h, err := lock.Acquire(ctx)
		assert.NoError(t, err)
		next <- h
	}()
	require.Eventually(t, func() bool { return waitersOf(r, "k") == 1 }, time.Second, time.Millisecond)
	require.NoError(t, h.Release(ctx))
	h2 := <-next
	second, err := h2.Token(ctx)
	require.NoError(t, err)
	require.Equal(t, first+1, second)
	require.NoError(t, h2.Release(ctx))

	h3, err := lock.Acquire(ctx)
	require.NoError(t, err)
	require.Greater(t, mustHoldToken(t, h3), second, "the release stored the token handed out")
	require.NoError(t, h3.Release(ctx))
}

// TestAHoldsReleaseGrantsTheKeyToAWaitingRegistry: Release passes the key
// to another process's waiter as Unlock does.
func TestAHoldsReleaseGrantsTheKeyToAWaitingRegistry(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	holder := newRegistry(t, client)
	waiter := newRegistry(t, client, WithRetryInterval(5*time.Second))
	h, err := holder.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	taken := lockInBackground(ctx, waiter.Obtain("k"))
	waitUntilWaiting(t, waiter)
	require.NoError(t, h.Release(ctx))
	requireTaken(t, taken)
	require.Equal(t, int64(1), waiter.Stats().Grants, "protocol.Granted, not found by the 5s retry")
}

// TestAReleaseWithAnEndedContextStillReleases: a request context that has
// ended by the deferred unlock must not leave the key held for a lease.
func TestAReleaseWithAnEndedContextStillReleases(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	r := newRegistry(t, client)
	ended, cancel := context.WithCancel(context.Background())
	cancel()

	h, err := r.Obtain("hold").Acquire(context.Background())
	require.NoError(t, err)
	require.NoError(t, h.Release(ended))
	require.Zero(t, client.Exists(context.Background(), h.lock.keys().Lock()).Val())

	lock := r.Obtain("lock")
	lock.Lock()
	require.NoError(t, lock.UnlockContext(ended))
	require.Zero(t, client.Exists(context.Background(), lock.keys().Lock()).Val())
}

// TestALostHoldsReleaseSparesTheNewOwner: after a loss, Release reports
// ErrLockLost, naming the cause, and leaves the new owner's key alone.
func TestALostHoldsReleaseSparesTheNewOwner(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	r := newRegistry(t, client)
	h, err := r.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	require.NoError(t, client.Set(ctx, h.lock.keys().Lock(), "another owner", time.Minute).Err())
	r.renewHolds(ctx)
	requireFires(t, h.Lost(), time.Second, "renewal found the key taken")
	err = h.Release(ctx)
	require.ErrorIs(t, err, ErrLockLost)
	require.ErrorContains(t, err, "passed to another owner", "found by tracking (overwritten) or by the renewal (deleted)")
	require.Equal(t, "another owner", client.Get(ctx, h.lock.keys().Lock()).Val())
	require.ErrorIs(t, h.Release(ctx), ErrNotHeld)
}

// TestAReleaseThatFindsItsKeyOfAnotherTypeReportsItLost: a key made a
// hash behind the holder's back, which neither tracking (refused) nor a
// renewal (off) told, is found by the release's owner check, which Redis
// refuses (WRONGTYPE): the key went to someone else, as a renewal or
// tracking would have said (overwritten), not merely a failed call.
func TestAReleaseThatFindsItsKeyOfAnotherTypeReportsItLost(t *testing.T) {
	ctx := context.Background()
	h, admin := untrackedHoldOfAHash(t)
	err := h.Release(ctx)
	require.ErrorIs(t, err, ErrLockLost)
	requireCause(t, h, LossOverwritten)
	require.EqualValues(t, 1, admin.Exists(ctx, h.redisKey()).Val(), "left alone")
}

// TestALostHoldsReleaseReportsTheLossWhenRedisFailsToo: Lost fired, then
// Redis went down: the release says both.
func TestALostHoldsReleaseReportsTheLossWhenRedisFailsToo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := redistest.Start(t)
	const lease = 200 * time.Millisecond
	r := newRegistry(t, srv.Client(t), WithExpireAfter(lease), WithRetryInterval(50*time.Millisecond), WithRenewal(false))
	h, err := r.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	lock := r.Obtain("facade")
	lock.Lock()
	requireFires(t, h.Lost(), 2*time.Second, "the fixed lease ran out")
	requireFires(t, lock.Lost(), 2*time.Second, "the fixed lease ran out")
	srv.Stop(t)
	for _, err := range []error{h.Release(ctx), lock.UnlockContext(ctx)} {
		require.ErrorIs(t, err, ErrLockLost)
		require.ErrorIs(t, err, ErrRedis)
		require.ErrorContains(t, err, "lease ran out unrenewed")
	}
}

// TestALossNamesItsCause: each way a hold is lost says so.
func TestALossNamesItsCause(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	maxHeld := newRegistry(t, client, WithExpireAfter(150*time.Millisecond), WithRetryInterval(20*time.Millisecond), WithMaxHold(10*time.Millisecond))
	h, err := maxHeld.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	requireFires(t, h.Lost(), 2*time.Second, "WithMaxHold let the lease run out")
	require.ErrorContains(t, h.Release(ctx), "held past WithMaxHold")

	r, err := New(client, "lockreg-test:"+t.Name()+"-closed")
	require.NoError(t, err)
	h, err = r.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	require.NoError(t, r.Close())
	require.ErrorContains(t, h.Release(ctx), "the registry was closed")
}

// TestHoldersHearOfARedisRestartAtOnce: a restart that wiped a holder's
// key lets another process take it at once; with pub/sub on, the holder
// hears of it when its subscription comes back, long before its next
// renewal (10s with the default lease).
func TestHoldersHearOfARedisRestartAtOnce(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	r := newRegistry(t, srv.Client(t))
	h, err := r.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	lock := r.Obtain("facade")
	lock.Lock()
	require.Eventually(t, r.notes.subscribed.Load, 5*time.Second, time.Millisecond, "a holder subscribes")
	srv.Stop(t)
	time.Sleep(time.Second) // down for a while: the subscription retries meanwhile
	require.NoError(t, srv.Relaunch())
	restarted := time.Now()
	requireFires(t, h.Lost(), r.cfg.expireAfter/6, "the holder heard of the restart")
	t.Logf("Lost fired %v after Redis answered again", time.Since(restarted))
	requireFires(t, lock.Lost(), time.Second, "every hold was checked")
	err = h.Release(ctx)
	require.ErrorIs(t, err, ErrLockLost)
	require.ErrorContains(t, err, "restart or failover")
	require.ErrorIs(t, lock.UnlockContext(ctx), ErrLockLost)
}

// TestHoldsWhoseKeysSurviveAReconnectStayHeld: the subscription's
// connection broke but Redis kept the keys: nothing is lost.
func TestHoldsWhoseKeysSurviveAReconnectStayHeld(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	var checks atomic.Int64
	r := newRegistry(t, srv.Client(t))
	r.AddHooks(Hooks{RedisCalls: func(op RedisOp, n int) {
		if op == OpTrack || op == OpCheck {
			checks.Add(int64(n))
		}
	}})
	h, err := r.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return r.notes.subscribed.Load() && checks.Load() > 0 }, 5*time.Second, time.Millisecond, "subscribed and armed")
	armed := checks.Load()
	killed, err := srv.Client(t).ClientKillByFilter(ctx, "TYPE", "pubsub").Result()
	require.NoError(t, err)
	require.Equal(t, int64(2), killed, "the subscription, and the tracker's target")
	require.Eventually(t, func() bool { return checks.Load() > armed }, 5*time.Second, time.Millisecond, "the holds were checked after the reconnect")
	requireOpen(t, h.Lost(), "the key survived")
	require.NoError(t, h.Release(ctx))
}

func waitGroupWithin(t *testing.T, wg *sync.WaitGroup, limit time.Duration, msg string) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(limit):
		t.Fatal(msg)
	}
}

// TestLockParksWhenTheRegistryClosesWhileItWaits: a Lock cannot report
// ErrClosed; it must neither panic (a normal shutdown would crash) nor
// return (its critical section would run unlocked).
func TestLockParksWhenTheRegistryClosesWhileItWaits(t *testing.T) {
	ctx := context.Background()
	r := newRegistry(t, redistest.Shared(t).Client(t))
	h, err := r.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	shutDown := make(chan error, 1)
	requireParksForGood(t, func() {
		go func() {
			assert.Eventually(t, func() bool { return waitersOf(r, "k") == 1 }, time.Second, time.Millisecond)
			shutDown <- r.Shutdown(ctx)
		}()
		r.Obtain("k").Lock()
	}, "Lock while the registry shuts down")
	require.NoError(t, h.Release(ctx), "Shutdown waits for the holds")
	require.NoError(t, <-shutDown)
	require.True(t, errors.Is(r.Obtain("k").LockContext(ctx), ErrClosed))
}

func TestDoneClosesWhenTheHoldEndsAndErrSaysHow(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	r := newRegistry(t, client)

	h, err := r.Obtain("released").Acquire(ctx)
	require.NoError(t, err)
	requireOpen(t, h.Done(), "held")
	require.NoError(t, h.Err())
	require.NoError(t, h.Release(ctx))
	requireFires(t, h.Done(), time.Second, "a release ends the hold")
	require.ErrorIs(t, h.Err(), ErrNotHeld)
	requireOpen(t, h.Lost(), "a release is no loss")

	h, err = r.Obtain("lost").Acquire(ctx)
	require.NoError(t, err)
	done := h.Done()
	require.NoError(t, client.Del(ctx, h.redisKey()).Err())
	requireFires(t, done, blindLimit, "a loss ends the hold")
	require.ErrorIs(t, h.Err(), ErrLockLost)
	require.ErrorIs(t, h.Release(ctx), ErrLockLost)
	require.ErrorIs(t, h.Err(), ErrLockLost, "released after its loss, it still says it was lost")

	h, err = r.Obtain("closed").Acquire(ctx)
	require.NoError(t, err)
	require.NoError(t, r.Close())
	requireFires(t, h.Done(), time.Second, "Close ends the hold")
	require.ErrorIs(t, h.Err(), ErrLockLost)
}

func TestAWatcherOfDoneEndsWithItsHold(t *testing.T) {
	ctx := context.Background()
	r := newRegistry(t, redistest.Shared(t).Client(t))
	before := runtime.NumGoroutine()
	var watchers sync.WaitGroup
	for i := range 1000 {
		h, err := r.Obtain("job-" + strconv.Itoa(i%10)).Acquire(ctx)
		require.NoError(t, err)
		watchers.Go(func() {
			select {
			case <-h.Lost():
			case <-h.Done():
			}
		})
		require.NoError(t, h.Release(ctx))
	}
	waitGroupWithin(t, &watchers, 5*time.Second, "every watcher ended with its hold")
	require.InDelta(t, before, runtime.NumGoroutine(), 5, "no watcher left behind")
}

// Done closes once the release's outcome is known, so that Err read then
// says what Release says: here, that the key had been deleted behind the
// holder's back, which only the release's owner check finds.
func TestDoneClosesOnceErrSaysWhatTheReleaseFound(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	var gate atomic.Bool
	sent, goOn := make(chan struct{}), make(chan struct{})
	client := aclClient(t, srv, "+@all", "-client") // no tracking: nothing else sees the DEL
	client.AddHook(redistest.Hook{Process: func(next redis.ProcessHook) redis.ProcessHook {
		return func(ctx context.Context, cmd redis.Cmder) error {
			if cmd.Name() == "evalsha" && gate.CompareAndSwap(true, false) { // the release
				close(sent)
				<-goOn
			}
			return next(ctx, cmd)
		}
	}})
	r := newRegistry(t, client, WithRenewal(false))
	// A first hold starts what checks held keys in the background (the
	// subscription, the tracker, whose refusal checks them once): a DEL
	// seen by one of those would not be the release's to find.
	h, err := r.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	requireSettled(t, r)
	require.Eventually(t, r.tracking.refused.Load, 5*time.Second, time.Millisecond, "tracking refused")
	require.NoError(t, h.Release(ctx))
	h, err = r.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	require.NoError(t, srv.Client(t).Del(ctx, h.redisKey()).Err())
	gate.Store(true)
	released := make(chan error, 1)
	go func() { released <- h.Release(ctx) }()
	<-sent
	requireOpen(t, h.Done(), "the release is under way")
	require.NoError(t, h.Err(), "the release is under way")
	close(goOn)
	require.ErrorIs(t, <-released, ErrLockLost)
	requireFires(t, h.Done(), time.Second, "the release is done")
	require.ErrorIs(t, h.Err(), ErrLockLost, "as Release said")
}

// A release that hands its key off locally waits for a read that confirms
// the key (tenure.go). With Redis down that read never comes: the wait
// must end with the release's ctx, as the release's own call would, not
// hold the caller for a lease.
func TestAHandOffsReleaseEndsWithItsContextWhileRedisIsDown(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	const lease = 10 * time.Second
	r := newRegistry(t, srv.Client(t), WithLocalHandoff(16, time.Hour), WithExpireAfter(lease))
	first, err := r.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	requireTracking(t, r)
	next := make(chan *Hold, 1)
	go func() {
		h, _ := r.Obtain("k").Acquire(ctx)
		next <- h
	}()
	require.Eventually(t, func() bool { return waitersOf(r, "k") == 1 }, 5*time.Second, time.Millisecond)
	srv.Stop(t)

	releaseCtx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = first.Release(releaseCtx)
	took := time.Since(start)
	require.Less(t, took, lease/2, "Release returned %v after %v, past its ctx", err, took)
	require.ErrorIs(t, err, ErrRedis, "no read confirmed the key")
	h := <-next
	require.NotNil(t, h, "the waiter got the key")
	require.Equal(t, viaHandoff, h.via)
}

// Do documents ErrClosed as "fn did not run". A Do whose fn ran and whose
// release handed the key off locally must not say ErrClosed when Close
// comes while that release waits for the read that confirms the key (here
// Redis is down, so the read never comes): a caller would run fn again.
func TestADoWhoseHandOffCloseCutShortDoesNotSayClosed(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	r := newRegistry(t, srv.Client(t), WithLocalHandoff(16, time.Hour), WithExpireAfter(3*time.Second))
	require.NoError(t, r.Do(ctx, "first", func(context.Context) error { return nil }))
	requireTracking(t, r)
	waiter := make(chan *Hold, 1)
	ran := false
	doErr := make(chan error, 1)
	go func() {
		doErr <- r.Do(ctx, "k", func(context.Context) error {
			ran = true
			go func() {
				h, _ := r.Obtain("k").Acquire(ctx)
				waiter <- h
			}()
			assert.Eventually(t, func() bool { return waitersOf(r, "k") == 1 }, 5*time.Second, time.Millisecond)
			srv.Stop(t)
			return nil
		})
	}()
	select {
	case err := <-doErr:
		t.Fatalf("Do returned %v before its hand-off was confirmed", err)
	case <-time.After(300 * time.Millisecond):
	}
	require.NoError(t, r.Close())
	err := <-doErr
	require.True(t, ran)
	require.NotErrorIs(t, err, ErrClosed, "fn ran: %v", err)
	next := <-waiter
	require.NotNil(t, next, "the waiter got the key")
	require.ErrorIs(t, next.Release(ctx), ErrLockLost, "Close lost the hold handed off")
}

// TestAReleaseWaitsForAGiveBackWhateverEndsMeanwhile: a release waits
// for a give-back of its key under way (a grant landed while the hold was
// current), which judges the hold, and may take a while. A context that
// ends meanwhile must not cut the release short, which would leave the key
// held for a lease (as one that had ended before the release began does
// not), nor may a Shutdown that began skip the wait, and the verdict.
func TestAReleaseWaitsForAGiveBackWhateverEndsMeanwhile(t *testing.T) {
	for _, shuttingDown := range []bool{false, true} {
		t.Run(fmt.Sprint("shutting down ", shuttingDown), func(t *testing.T) {
			srv := redistest.Start(t)
			g := newScriptGate() // for the give-back's call
			defer close(g.gate)
			client := srv.Client(t, g.hook())
			r := newRegistry(t, client, WithRetryInterval(time.Second))
			bg := context.Background()
			lock := r.Obtain("g")
			h, err := lock.Acquire(bg)
			require.NoError(t, err)
			// The key went through another owner, whose release granted it
			// back, and a renewal of h extended it.
			raw := srv.Client(t)
			require.NoError(t, raw.Set(bg, h.redisKey(), r.clientID, time.Minute).Err())
			require.NoError(t, raw.Set(bg, lock.keys().Fence(), "1000000", time.Minute).Err())
			g.armed.Store(true)
			r.receiveGrant("g", 1_000_000) // lands while h is current
			<-g.blocked
			shutdown := make(chan error, 1)
			if shuttingDown {
				go func() { shutdown <- r.Shutdown(bg) }()
				require.Eventually(t, r.closing, time.Second, time.Millisecond)
			}
			ctx, cancel := context.WithCancel(bg)
			released := make(chan error, 1)
			go func() { released <- h.Release(ctx) }()
			require.Eventually(t, func() bool { return goroutinesRunning("lockreg.waitFor[") > 0 }, 5*time.Second, time.Millisecond,
				"the release waits for the give-back")
			cancel()
			g.gate <- struct{}{}
			err = <-released
			require.ErrorIs(t, err, ErrLockLost, "the give-back found the hold broken")
			require.NotErrorIs(t, err, ErrRedis, "the release ran all the same")
			requireReleased(t, raw, h.redisKey(), "the key is not left held for a lease")
			if shuttingDown {
				require.NoError(t, <-shutdown)
			}
		})
	}
}

// TestAReleaseAfterTheLeaseRanOutSaysTheHoldWasLost: a release that comes
// after the hold's lease ran out, before anything signalled it (the
// process stood still past the lease), finds the key with the registry's
// client id whether or not it passed through another owner meanwhile: it
// releases the key, and says the hold was lost.
func TestAReleaseAfterTheLeaseRanOutSaysTheHoldWasLost(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	_, lock, h := holdPastItsLease(t, client, "k")
	requireOpen(t, h.Lost(), "nothing signalled the lapse yet")
	err := lock.UnlockContext(ctx)
	require.ErrorIs(t, err, ErrLockLost, "the release did not count the lapse")
	require.ErrorContains(t, err, LossExpired.explain())
	require.Zero(t, client.Exists(ctx, lock.keys().Lock()).Val(), "and it released the key all the same")
}
