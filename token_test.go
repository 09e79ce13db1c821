package lockreg

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockreg/lockreg/internal/protocol"
	"github.com/lockreg/lockreg/internal/redisstat"
	"github.com/lockreg/lockreg/internal/redistest"
)

func TestTokensIncreaseAcrossRegistries(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	registries := []*Registry{newRegistry(t, client), newRegistry(t, client), newRegistry(t, client)}
	var last int64
	for i := range 30 {
		lock := registries[i%3].Obtain("k")
		_, err := lock.Token(context.Background())
		require.ErrorIs(t, err, ErrNotHeld, "nothing held yet")
		lock.Lock()
		token := mustToken(t, lock)
		require.Greater(t, token, last, "acquisition %d", i)
		last = token

		lock.Lock()
		require.Equal(t, token, mustToken(t, lock), "a re-lock keeps the token")
		inGoroutine(func() {
			_, err := lock.Token(context.Background())
			assert.ErrorIs(t, err, ErrNotHeld, "another goroutine holds nothing")
		})
		lock.Unlock()
		lock.Unlock()
	}
}

// TestTokensAreDrawnWhenAskedFor: a hold that never asks for its token
// costs no more than its SET and its release; the first ask draws it in
// one call, later asks and a hold handed on locally cost nothing.
func TestTokensAreDrawnWhenAskedFor(t *testing.T) {
	var counter redisstat.Counter
	srv := redistest.Shared(t)
	client := srv.Client(t, &counter)
	loadScripts(t, client)
	r := newRegistry(t, client, WithLocalHandoff(16, time.Hour)) // not the default 10ms: see TestAHoldHandsOffWithRisingTokens
	lock := r.Obtain("k")
	commands := func() map[string]int64 {
		c := counter.Commands()
		return map[string]int64{"set": c["set"], "evalsha": c["evalsha"]}
	}

	lock.Lock()
	lock.Unlock()
	require.Equal(t, map[string]int64{"set": 1, "evalsha": 1}, commands(), "a plain SET and the release")

	lock.Lock()
	first := mustToken(t, lock)
	require.Equal(t, first, mustToken(t, lock), "asked again, the same token")
	require.Equal(t, map[string]int64{"set": 2, "evalsha": 2}, commands(), "one draw for two asks")

	next, unlocked := make(chan int64), make(chan struct{})
	go func() {
		defer close(unlocked)
		lock.Lock()
		next <- mustToken(t, lock)
		lock.Unlock()
	}()
	require.Eventually(t, func() bool { return waitersOf(r, "k") == 1 }, 5*time.Second, time.Millisecond, "the goroutine queued")
	lock.Unlock() // hands the hold to the goroutine
	require.Equal(t, first+1, <-next, "a hold handed on locally gets the next token")
	// Its release done, not just sent: the client closes when the test ends.
	<-unlocked
	requireReleased(t, client, lock.keys().Lock(), "the goroutine unlocked")
	require.Equal(t, map[string]int64{"set": 2, "evalsha": 3}, commands(), "and no draw for the hand-off")
	require.Equal(t, int64(1), r.Stats().LocalHandoffs)
}

// TestTokenOfALostHoldIsRefused: a hold whose key passed on gets no token;
// the draw checks the owner in Redis, before the registry noticed.
func TestTokenOfALostHoldIsRefused(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	r := newRegistry(t, client)
	other := newRegistry(t, client)
	lock := r.Obtain("k")
	lock.Lock()
	require.NoError(t, client.Del(ctx, lock.keys().Lock()).Err()) // as if the lease ran out in a pause
	taken := other.Obtain("k")
	require.True(t, taken.TryLock())

	_, err := lock.Token(ctx)
	require.ErrorIs(t, err, ErrLockLost)
	requireFires(t, lock.Lost(), time.Second, "the refused draw signals the loss")
	_, err = lock.Token(ctx)
	require.ErrorIs(t, err, ErrLockLost, "and stays refused")
	require.Positive(t, mustToken(t, taken), "the new holder gets its token")
	require.ErrorIs(t, lock.UnlockContext(ctx), ErrLockLost)
	taken.Unlock()
}

// A key made a hash behind the holder's back, which neither tracking
// (refused) nor a renewal (off) told, fails token.lua's owner check with
// WRONGTYPE: the draw finds the hold lost (overwritten), as a renewal
// would, rather than an ErrRedis error to call again for, in vain.
func TestTokenOfAHoldWhoseKeyWasMadeAnotherTypeIsRefused(t *testing.T) {
	ctx := context.Background()
	h, _ := untrackedHoldOfAHash(t)
	_, err := h.Token(ctx)
	require.ErrorIs(t, err, ErrLockLost)
	requireFires(t, h.Lost(), time.Second, "the refused draw signals the loss")
	requireCause(t, h, LossOverwritten)
	require.ErrorIs(t, h.Release(ctx), ErrLockLost)
}

func TestTokensIncreaseAcrossRedisDataLoss(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	client := srv.Client(t)
	r := newRegistry(t, client)
	lock := r.Obtain("k")
	take := func() int64 {
		lock.Lock()
		defer lock.Unlock()
		return mustToken(t, lock)
	}
	t1 := take()
	t2 := take()
	require.Greater(t, t2, t1)

	srv.Restart(t) // no persistence: the lock, the stored token and the scripts are gone
	t3 := take()
	require.Greater(t, t3, t2, "a stored counter alone would restart at 1")

	// While the stored token lives it wins over the clock, so a server clock
	// stepping back cannot hand out a lower token.
	future := t3 + int64(time.Hour/time.Microsecond)
	require.NoError(t, client.Set(ctx, "lockreg-test:"+t.Name()+":{k}:fence", future, time.Minute).Err())
	require.Equal(t, future+1, take())
}

// A Token call and a Release of the same hold, from two goroutines: the
// release deletes the key while the draw is on its way. Token must not
// answer with no token and no error.
func TestATokenDrawnWhileItsHoldIsReleasedIsNotHeld(t *testing.T) {
	ctx := context.Background()
	sent, goOn := make(chan struct{}, 1), make(chan struct{})
	tokenHash := protocol.NewPeer(scripts, protocol.Config{}).DrawToken(protocol.Keys{}).Script.Hash()
	client := redistest.Shared(t).Client(t, redistest.Hook{
		Process: func(next redis.ProcessHook) redis.ProcessHook {
			return func(ctx context.Context, cmd redis.Cmder) error {
				if args := cmd.Args(); len(args) > 1 && cmd.Name() == "evalsha" && args[1] == tokenHash {
					select {
					case sent <- struct{}{}:
						<-goOn
					default:
					}
				}
				return next(ctx, cmd)
			}
		},
	})
	h, err := newRegistry(t, client).Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	drawn := make(chan error, 1)
	go func() {
		token, err := h.Token(ctx)
		if token != 0 && err == nil {
			err = errors.New("a token")
		}
		drawn <- err
	}()
	<-sent
	require.NoError(t, h.Release(ctx))
	close(goOn)
	require.ErrorIs(t, <-drawn, ErrNotHeld)
}

// TestATokenRefusedForALapsedLeaseNamesItsCause: a hold past WithMaxHold
// whose lease ran out asks for its token before the watchdog's next tick
// (up to a third of the lease later). Token refuses it as lost, and says
// why as Err and Release will: it was held past WithMaxHold; and Lost has
// fired, as Token's doc says of a hold it calls lost.
func TestATokenRefusedForALapsedLeaseNamesItsCause(t *testing.T) {
	ctx := context.Background()
	r := newRegistry(t, redistest.Shared(t).Client(t), WithExpireAfter(300*time.Millisecond), WithMaxHold(time.Millisecond))
	// The watchdog ticks every 100 ms from New on: taken 50 ms in, the
	// lease runs out about 50 ms before the tick that signals it.
	time.Sleep(50 * time.Millisecond)
	h, err := r.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	for !h.leaseOver() {
		time.Sleep(time.Millisecond)
	}
	_, err = h.Token(ctx)
	require.ErrorIs(t, err, ErrLockLost)
	require.ErrorContains(t, err, LossMaxHold.explain(), "the cause Err and Release name")
	requireFires(t, h.Lost(), time.Millisecond, "Lost, as Token said lost")
	require.ErrorIs(t, h.Release(ctx), ErrLockLost)
}

// TestATokenHandedOffToAHoldThatLostItsKeyIsNotDrawnAgain: a local
// hand-off raises the token without a call, and the tenure's release
// stores the last one handed out. A release that finds the key taken from
// it must store it all the same: while the stored token is ahead of the
// server's clock (a clock that stepped back, a token written by hand),
// the next draw is the stored one plus one, which would hand out again a
// token that a holder used already.
func TestATokenHandedOffToAHoldThatLostItsKeyIsNotDrawnAgain(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	r := newRegistry(t, client, WithLocalHandoff(16, time.Hour))
	lock, h, handedOff := aHandOffWithAToken(t, client, r)
	require.NoError(t, client.Del(ctx, h.redisKey()).Err()) // behind the hold's back
	require.ErrorIs(t, h.Release(ctx), ErrLockLost)

	later, err := lock.Acquire(ctx)
	require.NoError(t, err)
	require.Greater(t, mustHoldToken(t, later), handedOff, "a later hold's token exceeds every earlier one")
	require.NoError(t, later.Release(ctx))
}

// aHandOffWithAToken returns the hold of key "fence" handed off locally
// from a first hold, and the token it was handed: one past the first's,
// which was drawn from a stored token ahead of the server's clock.
func aHandOffWithAToken(t *testing.T, client redis.UniversalClient, r *Registry) (lock *Lock, h *Hold, handedOff int64) {
	t.Helper()
	ctx := context.Background()
	lock = r.Obtain("fence")
	const ahead = int64(4_000_000_000_000_000) // µs: past 2096, below 2^53
	require.NoError(t, client.Set(ctx, lock.keys().Fence(), ahead, time.Minute).Err())
	first, next := heldAndWaitedFor(t, r, "fence")
	require.Equal(t, ahead+1, mustHoldToken(t, first))
	require.NoError(t, first.Release(ctx))
	h = <-next
	require.NotNil(t, h, "the waiter got the key")
	require.Equal(t, viaHandoff, h.via)
	handedOff = mustHoldToken(t, h)
	require.Equal(t, ahead+2, handedOff)
	return lock, h, handedOff
}

// A fence of another type, made by hand, fails every draw of the key's
// token, with an ErrRedis error that names it: the hold, whose key is
// still its own, is not lost, as it would be for a lock key of another
// type (above).
func TestTokenOfAHoldWhoseFenceIsOfAnotherTypeNamesIt(t *testing.T) {
	ctx := context.Background()
	h, fence := holdBeside(t, protocol.Keys.Fence)
	_, err := h.Token(ctx)
	require.ErrorIs(t, err, ErrRedis)
	require.NotErrorIs(t, err, ErrLockLost)
	require.ErrorContains(t, err, fence)
	require.NoError(t, h.Release(ctx))
}

// strikeWhileHandingOff releases h, which a waiter of its registry waits
// behind, and deletes its key behind its back while the release hands it
// off locally: tracking strikes the tenure, and the release finds h lost.
func strikeWhileHandingOff(t *testing.T, client redis.Cmdable, h *Hold) {
	t.Helper()
	ctx := context.Background()
	h.local.mu.Lock()
	released := make(chan error, 1)
	go func() { released <- h.Release(ctx) }()
	require.Eventually(t, func() bool { return goroutinesRunning("lockreg.(*Registry).nextLocalHold(") == 1 }, 5*time.Second, time.Millisecond)
	require.NoError(t, client.Del(ctx, h.redisKey()).Err()) // behind the hold's back
	require.Eventually(t, func() bool { return h.tenure.loss() != lossNone }, 5*time.Second, time.Millisecond, "tracking struck the tenure")
	h.local.mu.Unlock()
	require.ErrorIs(t, <-released, ErrLockLost)
}

// TestATokenOfAHandOffDiscardedForALossIsNotDrawnAgain: a release hands
// its key off with the next token, and a loss strikes the tenure before
// the waiter looks at what it received: the waiter discards it and takes
// the key in Redis. The releasing hold handed its token out, and no
// release script stored it; while the stored token is ahead of the clock
// the waiter's draw would hand it out again. The release is held inside
// its choice to hand off (nextLocalHold reads the waiters last, under the
// local mutex) while tracking finds the key deleted.
func TestATokenOfAHandOffDiscardedForALossIsNotDrawnAgain(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	r := newRegistry(t, client, WithLocalHandoff(16, time.Hour))
	lock, h, handedOff := aHandOffWithAToken(t, client, r)
	later := make(chan *Hold, 1)
	go func() {
		got, _ := lock.Acquire(ctx)
		later <- got
	}()
	require.Eventually(t, func() bool { return waitersOf(r, "fence") == 1 }, 5*time.Second, time.Millisecond)

	strikeWhileHandingOff(t, client, h)

	taken := <-later
	require.NotNil(t, taken, "the waiter took the key in Redis")
	require.NotEqual(t, viaHandoff, taken.via)
	require.Greater(t, mustHoldToken(t, taken), handedOff, "a later hold's token exceeds every earlier one")
	require.NoError(t, taken.Release(ctx))
}

// A waiter that discards a local hand-off a loss struck (its token was
// handed out locally, and no script stored it) and then gives up, its ctx
// ending before its first attempt, must still store that token: else a
// later draw, from a stored token ahead of the clock, hands out the
// hand-off's token again.
func TestATokenOfADiscardedHandOffIsStoredWhenItsWaiterGivesUp(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	r := newRegistry(t, client, WithLocalHandoff(16, time.Hour))
	other := newRegistry(t, client)
	lock, h, handedOff := aHandOffWithAToken(t, client, r)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	gaveUp := make(chan error, 1)
	go func() {
		got, err := lock.Acquire(wctx)
		if err == nil {
			_ = got.Release(ctx)
		}
		gaveUp <- err
	}()
	require.Eventually(t, func() bool { return waitersOf(r, "fence") == 1 }, 5*time.Second, time.Millisecond)

	// A call on the key's state still pending holds the waiter's first
	// attempt back (awaitPending), until its ctx ends.
	finish := r.startPending("fence")
	defer finish()
	strikeWhileHandingOff(t, client, h)
	require.Eventually(t, func() bool { return goroutinesRunning("lockreg.(*Lock).awaitPending(") == 1 }, 5*time.Second, time.Millisecond)
	cancel()
	err := <-gaveUp
	require.ErrorIs(t, err, ErrNotObtained)
	require.ErrorIs(t, err, context.Canceled)
	finish()
	// What the waiter leaves to do, it does before the key's local state
	// goes, as a release of a key its attempt took would.
	requireNoLocalState(t, r)

	later, err := other.Obtain("fence").Acquire(ctx)
	require.NoError(t, err)
	require.Greater(t, mustHoldToken(t, later), handedOff, "a later hold's token exceeds every earlier one")
	require.NoError(t, later.Release(ctx))
}

// TestATokenAnsweredAfterTheLeaseIsRefused: a draw whose reply came after
// the hold's lease ran out found the key the registry's, but the key may
// have lapsed and come back to it meanwhile (a grant), which the owner
// check cannot tell: the token carries no hold on. Token says the hold
// is lost, as it would had it been asked a moment later.
func TestATokenAnsweredAfterTheLeaseIsRefused(t *testing.T) {
	ctx := context.Background()
	const lease = 300 * time.Millisecond
	var held atomic.Pointer[Hold]
	tokenHash := protocol.NewPeer(scripts, protocol.Config{}).DrawToken(protocol.Keys{}).Script.Hash()
	client := redistest.Shared(t).Client(t, redistest.Hook{
		Process: func(next redis.ProcessHook) redis.ProcessHook {
			return func(ctx context.Context, cmd redis.Cmder) error {
				err := next(ctx, cmd)
				if args := cmd.Args(); len(args) > 1 && cmd.Name() == "evalsha" && args[1] == tokenHash {
					for h := held.Load(); !h.leaseOver(); {
						time.Sleep(time.Millisecond) // the reply is late
					}
				}
				return err
			}
		},
	})
	h, err := newRegistry(t, client, WithExpireAfter(lease), WithRenewal(false)).Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	held.Store(h)
	// In Redis the key outlives the lease: the late draw finds it ours.
	require.NoError(t, client.PExpire(ctx, h.redisKey(), time.Minute).Err())
	requireTokenRefused(t, h, LossExpired)
	require.ErrorIs(t, h.Release(ctx), ErrLockLost)
}

// requireTokenRefused requires h's Token to refuse it as lost for cause.
func requireTokenRefused(t *testing.T, h *Hold, cause LossCause) {
	t.Helper()
	_, err := h.Token(context.Background())
	require.ErrorIs(t, err, ErrLockLost)
	requireCause(t, h, cause)
}

// TestATokenDrawNamesAForcedUnlockWhoseNoteCameFirst: a draw that finds
// the key gone, or of another type, after the note of a forced unlock came
// (its check had not yet) names the loss forced, as a renewal or a
// release does.
func TestATokenDrawNamesAForcedUnlockWhoseNoteCameFirst(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	r := untrackedRegistry(t, srv)
	for _, key := range []string{"gone", "hash"} {
		h, err := r.Obtain(key).Acquire(ctx)
		require.NoError(t, err)
		h.mu.Lock()
		h.forced = true
		h.mu.Unlock()
		require.NoError(t, admin.Del(ctx, h.redisKey()).Err())
		if key == "hash" {
			require.NoError(t, admin.HSet(ctx, h.redisKey(), "f", "v").Err())
		}
		requireTokenRefused(t, h, LossForced)
	}
}

// TestAGrantedHoldsTokenCostsNoCall: a grant carries the token its
// release drew, so the grantee's Token asks Redis nothing (Hold.Token:
// "keys another registry passed to this one cost nothing").
func TestAGrantedHoldsTokenCostsNoCall(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	holder := newRegistry(t, client)
	grantee := newRegistry(t, client)
	var draws atomic.Int64
	grantee.AddHooks(Hooks{RedisCalls: func(op RedisOp, n int) {
		if op == OpToken {
			draws.Add(int64(n))
		}
	}})
	held, err := holder.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	holderToken := mustHoldToken(t, held)
	granted := make(chan *Hold, 1)
	go func() {
		h, err := grantee.Obtain("k").Acquire(ctx)
		assert.NoError(t, err)
		granted <- h
	}()
	waitUntilWaiting(t, grantee)
	require.NoError(t, held.Release(ctx))
	h := <-granted
	require.NotNil(t, h)
	require.Equal(t, int64(1), grantee.Stats().Grants, "the release granted the key")
	require.Greater(t, mustHoldToken(t, h), holderToken)
	require.Zero(t, draws.Load(), "the grant's token, drawn by the release")
	require.NoError(t, h.Release(ctx))
}
