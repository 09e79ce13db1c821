package lockreg

import (
	"context"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/lockreg/lockreg/internal/protocol"
	"github.com/lockreg/lockreg/internal/redistest"
)

func TestRedisDown(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	r := newRegistry(t, srv.Client(t), WithRetryInterval(20*time.Millisecond))
	// A client that gives up on a dead server at once, so that attempts
	// fail inside the deadline rather than in go-redis's own retries.
	failFast := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, DialerRetries: 1})
	defer failFast.Close()
	rFast := newRegistry(t, failFast, WithRetryInterval(20*time.Millisecond))
	srv.Stop(t)

	require.False(t, r.Obtain("k").TryLock())
	for _, reg := range []*Registry{r, rFast} {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		start := time.Now()
		err := reg.Obtain("k").LockContext(ctx)
		cancel()
		require.ErrorIs(t, err, ErrNotObtained)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Less(t, time.Since(start), time.Second, "returns by its deadline")
		if reg == rFast {
			require.ErrorIs(t, err, ErrRedis, "the last Redis error is joined")
			require.Contains(t, err.Error(), "connection refused")
		}
	}
	requireNoLocalState(t, rFast)
	// The default client's attempt was cut short by the deadline while
	// dialing; as it may have reached Redis, a background release clears it
	// before the local state goes (here: once go-redis gives up dialing).
	require.Eventually(t, func() bool { return r.locals.size() == 0 }, 10*time.Second, 10*time.Millisecond)

	srv.Restart(t)
	lock := r.Obtain("k")
	require.NoError(t, lock.LockContext(context.Background()), "works again once Redis is back")
	lock.Unlock()
}

func TestRedisRestartWhileHeldIsReportedAtRelease(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	client := srv.Client(t)
	r := newRegistry(t, client)
	lock := r.Obtain("k")
	lock.Lock()

	srv.Restart(t) // no persistence: the key is gone

	require.ErrorIs(t, lock.UnlockContext(ctx), ErrLockLost)
	require.Zero(t, r.locals.size())
	require.NoError(t, lock.LockContext(ctx), "the next acquisition works normally")
	require.Equal(t, r.clientID, client.Get(ctx, "lockreg-test:"+t.Name()+":{k}").Val())
	require.NoError(t, lock.UnlockContext(ctx))
}

func TestUnlockWhenRedisFailsStillFreesLocally(t *testing.T) {
	srv := redistest.Start(t)
	r := newRegistry(t, srv.Client(t))
	lock := r.Obtain("k")
	lock.Lock()
	srv.Stop(t)

	err := lock.UnlockContext(context.Background())
	require.ErrorIs(t, err, ErrRedis)
	require.NotErrorIs(t, err, ErrLockLost)
	require.Zero(t, r.locals.size(), "the local mutex is freed even when Redis fails")
}

// silentRedis accepts connections and reads, but never answers; or, with
// garbage set, answers the first answered reads of each connection with it
// (all of them if answered is negative), then none.
func silentRedis(t *testing.T, garbage string, answered int) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				buf := make([]byte, 4096)
				for reads := 0; ; reads++ {
					if _, err := conn.Read(buf); err != nil {
						return
					}
					if garbage != "" && (answered < 0 || reads < answered) {
						if _, err := conn.Write([]byte(garbage)); err != nil {
							return
						}
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

func TestRedisThatHangsOrAnswersGarbage(t *testing.T) {
	for name, garbage := range map[string]string{"hangs": "", "garbage": "%%not resp%%\r\n"} {
		t.Run(name, func(t *testing.T) {
			client := redis.NewClient(&redis.Options{
				Addr: silentRedis(t, garbage, -1), ReadTimeout: 300 * time.Millisecond,
				MaxRetries: -1, Protocol: 2, DisableIdentity: true,
			})
			defer client.Close()
			r, err := New(client, "hostile", WithRetryInterval(20*time.Millisecond))
			require.NoError(t, err)
			defer r.Close() // waits for the attempt still in flight: goleak checks it ends

			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			start := time.Now()
			err = r.Obtain("k").LockContext(ctx)
			require.ErrorIs(t, err, ErrNotObtained)
			require.ErrorIs(t, err, context.DeadlineExceeded)
			require.Less(t, time.Since(start), time.Second, "the context rules, not the server")
			if garbage != "" {
				require.ErrorIs(t, err, ErrRedis, "the cause is reported")
			}
			require.False(t, r.Obtain("k").TryLock())
		})
	}
}

// TestASubscriptionThatRedisNeverConfirmsFailsInTime: a failed attempt
// subscribes, holding the lock Close takes, and go-redis reads the
// confirmations with no deadline unless told one, whatever the client's
// ReadTimeout; a Redis that answers the handshake and then falls silent
// (stalled, or behind a black hole) must hold neither the acquisition nor
// Close for ever.
func TestASubscriptionThatRedisNeverConfirmsFailsInTime(t *testing.T) {
	client := redis.NewClient(&redis.Options{
		// Answers HELLO with an error, which makes go-redis go on in RESP2,
		// then nothing.
		Addr:       silentRedis(t, "-ERR unknown command 'HELLO'\r\n", 1),
		MaxRetries: -1, DisableIdentity: true,
	})
	defer client.Close()
	r, err := New(client, "hostile")
	require.NoError(t, err)

	start := time.Now()
	err = r.subscribe(context.Background())
	require.ErrorIs(t, err, ErrRedis, "the subscription failed, and says so")
	require.Less(t, time.Since(start), subscribeTimeout+2*time.Second)
	require.False(t, r.notes.subscribed.Load())
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		_ = r.Close()
	}()
	select {
	case <-closed:
	case <-time.After(2 * time.Second):
		t.Fatal("Close did not return")
	}
}

func TestAPermanentErrorEndsTheAcquisitionAtOnce(t *testing.T) {
	// Retrying would only fail again, until ctx ends, which with
	// context.Background() is never.
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	closed := srv.Client(t)
	require.NoError(t, closed.Close())
	cases := map[string]struct {
		client redis.UniversalClient
		setUp  func(redisKey string)
		says   string
	}{
		"the key holds a hash": {srv.Client(t), func(redisKey string) {
			require.NoError(t, admin.HSet(ctx, redisKey, "not", "a lock").Err())
		}, "WRONGTYPE"},
		"an ACL forbids SET":   {aclClient(t, srv, "+@all", "-set"), func(string) {}, "NOPERM"},
		"the client is closed": {closed, func(string) {}, "client is closed"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			r := newRegistry(t, tc.client)
			tc.setUp(r.Obtain("k").keys().Lock())
			start := time.Now()
			err := r.Do(ctx, "k", func(context.Context) error {
				t.Error("fn ran")
				return nil
			})
			require.Less(t, time.Since(start), time.Second, "it ended at once")
			require.ErrorIs(t, err, ErrRedis)
			require.ErrorIs(t, err, ErrNotObtained)
			require.ErrorContains(t, err, tc.says)
			require.Zero(t, r.locals.size(), "and left nothing behind")
		})
	}
}

func TestAForeignValueWithoutExpiryShowsAsHeldByAnUnknownOwnerForever(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	r := newRegistry(t, client)
	for _, value := range []string{"someone", ""} { // an empty value blocks the key as well
		require.NoError(t, client.Set(ctx, r.Obtain("k").keys().Lock(), value, 0).Err())
		info, err := r.Inspect(ctx, "k")
		require.NoError(t, err)
		require.True(t, info.Held, "%q", value)
		require.Equal(t, value, info.OwnerID)
		require.Empty(t, info.Owner)
		require.Equal(t, NoExpiry, info.TTL, "no expiry, not 0s")
		require.Equal(t, []string{"k"}, listedKeys(t, r), "Locks lists it")
	}
}

// A lock key of another type (a hash someone wrote) blocks the lock as a
// foreign value does: Inspect shows it so, and Locks lists it beside the
// other locks rather than failing the listing.
func TestALockKeyOfAnotherTypeShowsAsHeldAndLocksListsTheRest(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	r := newRegistry(t, client)
	h, err := r.Obtain("mine").Acquire(ctx)
	require.NoError(t, err)
	defer h.Release(ctx)
	require.NoError(t, client.HSet(ctx, r.Obtain("hash").keys().Lock(), "field", "value").Err())
	info, err := r.Inspect(ctx, "hash")
	require.NoError(t, err)
	require.True(t, info.Held)
	require.Equal(t, NoExpiry, info.TTL)
	require.ElementsMatch(t, []string{"hash", "mine"}, listedKeys(t, r))
}

// refusal is an error reply from Redis, as go-redis types them: a call it
// refused without running.
type refusal string

func (e refusal) Error() string { return string(e) }
func (refusal) RedisError()     {}

// The first attempt's SET runs but its reply is lost (a read timeout);
// the next attempts are refused without running (LOADING). The
// acquisition gives up at its deadline, and releases the key the first
// attempt may have taken, rather than leaving it locked for the lease.
func TestAKeyAnAttemptMayHaveTakenIsReleasedWhenLaterAttemptsAreRefused(t *testing.T) {
	type attempts struct{}
	srv := redistest.Start(t)
	var calls atomic.Int32
	client := srv.Client(t, redistest.Hook{Process: func(next redis.ProcessHook) redis.ProcessHook {
		return func(ctx context.Context, cmd redis.Cmder) error {
			if ctx.Value(attempts{}) == nil { // the background release, say
				return next(ctx, cmd)
			}
			err := error(refusal("LOADING Redis is loading the dataset in memory"))
			if calls.Add(1) == 1 {
				_ = next(ctx, cmd)
				err = &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
			}
			cmd.SetErr(err)
			return err
		}
	}})
	r := newRegistry(t, client, WithRetryInterval(20*time.Millisecond))
	deadline, cancel := context.WithTimeout(context.WithValue(context.Background(), attempts{}, true), 300*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, r.Obtain("k").LockContext(deadline), ErrNotObtained)
	require.GreaterOrEqual(t, calls.Load(), int32(2), "attempts after the lost reply")
	other := newRegistry(t, srv.Client(t))
	require.Eventually(t, func() bool {
		if !other.Obtain("k").TryLock() {
			return false
		}
		other.Obtain("k").Unlock()
		return true
	}, 5*time.Second, 10*time.Millisecond, "the key is free again, not locked for the lease")
}

// Lock cannot return a refusal, so it logs it and tries again every retry
// interval; a refusal that lasts (a key of another type, an ACL) is
// logged once, not at every retry, as an acquisition logs a Redis error
// only when it changes.
func TestLockLogsALastingRefusalOnce(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	logs := &syncBuffer{}
	r := newRegistry(t, client, WithLogger(slog.New(slog.NewTextHandler(logs, nil))), WithRetryInterval(10*time.Millisecond))
	lock := r.Obtain("k")
	require.NoError(t, client.HSet(ctx, lock.keys().Lock(), "not", "a lock").Err())
	locked := make(chan struct{})
	go func() {
		lock.Lock()
		lock.Unlock()
		close(locked)
	}()
	time.Sleep(500 * time.Millisecond) // 50 retries
	require.NoError(t, client.Del(ctx, lock.keys().Lock()).Err())
	requireFires(t, locked, 5*time.Second, "Lock took the key once it was free")
	require.Equal(t, 1, strings.Count(logs.String(), "Lock cannot take the key"), logs.String())
}

// With WithWaitReplicas, an attempt whose key too few replicas
// acknowledged gives the key back at once. If Redis refuses that give-back
// without running it (an error reply: BUSY, say), the key is still the
// registry's: an acquisition that ends then (TryLock's one attempt, or a
// LockContext whose ctx ends before its next attempt) must release it,
// not leave it locked for the lease with nobody holding it.
func TestAnUnacknowledgedKeyWhoseGiveBackRedisRefusedIsReleased(t *testing.T) {
	srv := redistest.Start(t) // no replica: WAIT 1 acknowledges nothing
	var refuse atomic.Value   // the Redis key whose next release is refused
	refuse.Store("")
	client := srv.Client(t, redistest.Hook{Process: func(next redis.ProcessHook) redis.ProcessHook {
		return func(ctx context.Context, cmd redis.Cmder) error {
			key := refuse.Load().(string)
			if n := cmd.Name(); key != "" && (n == "evalsha" || n == "eval") && slices.Contains(cmd.Args(), any(key)) && refuse.CompareAndSwap(key, "") {
				err := refusal("BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSCRIPT.")
				cmd.SetErr(err)
				return err
			}
			return next(ctx, cmd)
		}
	}})
	r := newRegistry(t, client, WithWaitReplicas(1, 20*time.Millisecond), WithRetryInterval(5*time.Second))
	// Subscribed already, a failed attempt is followed by a pause, not by
	// another attempt at once.
	require.NoError(t, r.subscribe(context.Background()))
	other := newRegistry(t, srv.Client(t))
	for _, c := range []struct {
		name    string
		acquire func(l *Lock) error
	}{
		{"TryLock", func(l *Lock) error {
			if l.TryLock() {
				return nil
			}
			return ErrNotObtained
		}},
		{"LockContext", func(l *Lock) error {
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			return l.LockContext(ctx)
		}},
	} {
		name, acquire := c.name, c.acquire
		t.Run(name, func(t *testing.T) {
			lock := r.Obtain(name)
			refuse.Store(lock.keys().Lock())
			require.ErrorIs(t, acquire(lock), ErrNotObtained)
			require.Empty(t, refuse.Load(), "the give-back was refused")
			requireNoLocalState(t, r)
			require.Eventually(t, func() bool {
				if !other.Obtain(name).TryLock() {
					return false
				}
				other.Obtain(name).Unlock()
				return true
			}, 2*time.Second, 10*time.Millisecond, "the key is free again, not locked for the lease")
		})
	}
}

// TestARedisCallsHookThatPanicsInTheBackgroundFailsTheCall: a RedisCalls
// hook that panics in the registry's background work (a renewal, a
// tracker's read) has no caller to panic to: the registry logs it and
// fails the call as a Redis error would, rather than crash the process.
// A renewal that always panics leaves the hold to lapse, signalled lost;
// a tracker's read leaves the hold to its renewals.
func TestARedisCallsHookThatPanicsInTheBackgroundFailsTheCall(t *testing.T) {
	srv := redistest.Shared(t)
	for _, op := range []RedisOp{OpRenew, OpTrack} {
		t.Run(string(op), func(t *testing.T) {
			ctx := context.Background()
			var logs syncBuffer
			r := newRegistry(t, srv.Client(t), WithExpireAfter(300*time.Millisecond),
				WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
			var panics atomic.Int64
			r.AddHooks(Hooks{RedisCalls: func(o RedisOp, _ int) {
				if o == op {
					panics.Add(1)
					panic("hook")
				}
			}})
			h, err := r.Obtain("k").Acquire(ctx)
			require.NoError(t, err)
			require.Eventually(t, func() bool { return panics.Load() > 0 }, 2*time.Second, time.Millisecond)
			if op == OpRenew {
				requireFires(t, h.Lost(), 2*time.Second, "the unrenewed hold lapses")
				require.ErrorIs(t, h.Release(ctx), ErrLockLost)
			} else {
				time.Sleep(time.Second) // three leases: the renewals carry the hold
				requireOpen(t, h.Lost(), "the hold is renewed")
				require.NoError(t, h.Release(ctx))
			}
			require.Contains(t, logs.String(), "panicked")
		})
	}
}

// A lock's queue of another type, made by hand, ends a contended
// acquisition at once, with an ErrRedis error that names that key, and
// leaves no mark behind; a fence of another type does not keep the lock
// from being forced open.
func TestAKeyOfAnotherTypeBesideTheLockIsNamedAndLeavesNothing(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	holder, waiter := newRegistry(t, client), newRegistry(t, client)
	keys := holder.Obtain("k").keys()
	t.Cleanup(func() { client.Del(ctx, keys.Queue(), keys.Fence()) })
	h, err := holder.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	require.NoError(t, client.Set(ctx, keys.Queue(), "x", 0).Err())
	waitCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = waiter.Obtain("k").Acquire(waitCtx)
	require.ErrorIs(t, err, ErrNotObtained)
	require.ErrorIs(t, err, ErrRedis)
	require.ErrorContains(t, err, keys.Queue())
	require.NoError(t, waitCtx.Err(), "refused for good: no retries")
	require.Zero(t, client.Exists(ctx, keys.Marker()).Val(), "a mark left behind")

	require.NoError(t, client.HSet(ctx, keys.Fence(), "field", "value").Err())
	forced, err := waiter.ForceUnlock(ctx, "k")
	require.NoError(t, err)
	require.True(t, forced)
	require.ErrorIs(t, h.Release(ctx), ErrLockLost)
}

// A release that meets the lock's marker of another type, made by hand,
// is an ErrRedis error naming it, as a failed call is: the hold's key is
// its own still, not overwritten, and is not reported lost.
func TestAReleaseThatMeetsAMarkerOfAnotherTypeIsNoLoss(t *testing.T) {
	h, marker := holdBeside(t, protocol.Keys.Marker)
	err := h.Release(context.Background())
	require.ErrorIs(t, err, ErrRedis)
	require.NotErrorIs(t, err, ErrLockLost)
	require.ErrorContains(t, err, marker)
}

// TestALostHookThatPanicsIsLoggedAndTheOthersAreTold: a Lost hook is told
// from the goroutine that found the loss, mostly the registry's own (here
// a tracker's), where a panic would crash the process, and on the
// watchdog end every other hold's renewal. The registry logs it, tells
// the other hooks and goes on renewing.
func TestALostHookThatPanicsIsLoggedAndTheOthersAreTold(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	var logs syncBuffer
	r := newRegistry(t, client, WithExpireAfter(300*time.Millisecond),
		WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	told := make(chan LossEvent, 1)
	r.AddHooks(Hooks{Lost: func(LossEvent) { panic("hook") }})
	r.AddHooks(Hooks{Lost: func(e LossEvent) { told <- e }})
	lost, err := r.Obtain("lost").Acquire(ctx)
	require.NoError(t, err)
	kept, err := r.Obtain("kept").Acquire(ctx)
	require.NoError(t, err)

	require.NoError(t, client.Del(ctx, lost.redisKey()).Err()) // behind the holder's back
	requireFires(t, lost.Lost(), 2*time.Second, "the holder learns of it")
	select {
	case e := <-told:
		require.Equal(t, "lost", e.Key, "the next hook is told")
	case <-time.After(2 * time.Second):
		t.Fatal("the hook after the one that panicked was not told")
	}
	require.Contains(t, logs.String(), "a Lost hook panicked")
	time.Sleep(time.Second) // three leases
	requireOpen(t, kept.Lost(), "the other hold is still renewed")
	require.NoError(t, kept.Release(ctx))
	require.ErrorIs(t, lost.Release(ctx), ErrLockLost)
}

// TestAReleaseThatPanicsStillSaysTheHoldWasLost: a hold signalled lost
// (a LossEvent told the hooks) whose release a panic cuts short, a
// ReleaseStart hook's or one in its Redis calls, is reported WasLost all
// the same: hooks that count the holds (lockregotel's, lockregtest's)
// count each hold ended once, by its loss, not once more by its release.
func TestAReleaseThatPanicsStillSaysTheHoldWasLost(t *testing.T) {
	for _, panicking := range []Hooks{
		{ReleaseStart: func(context.Context, string) context.Context { panic("hook") }},
		{RedisCalls: func(op RedisOp, _ int) {
			if op == OpRelease {
				panic("hook")
			}
		}},
	} {
		ctx := context.Background()
		r := newRegistry(t, redistest.Shared(t).Client(t))
		rec := &recorder{}
		r.AddHooks(rec.hooks())
		h, err := r.Obtain("k").Acquire(ctx)
		require.NoError(t, err)
		forced, err := r.ForceUnlockHeldBy(ctx, "k", r.OwnerID()) // tells h at once
		require.NoError(t, err)
		require.True(t, forced)
		require.Eventually(t, func() bool {
			_, _, _, lost, _ := rec.snapshot()
			return len(lost) == 1
		}, 5*time.Second, time.Millisecond, "the hooks are told of the loss")
		r.AddHooks(panicking)
		require.PanicsWithValue(t, "hook", func() { _ = h.Release(ctx) })
		_, _, released, _, _ := rec.snapshot()
		require.Len(t, released, 1)
		require.True(t, released[0].WasLost, "the hold's loss was told before its release")
		require.Zero(t, released[0].FoundLost)
	}
}

// TestAHoldWhoseRenewalsAreRefusedSaysSo: an ACL without PEXPIRE lets a
// registry take keys (a plain SET) but refuses every renewal; the hold is
// lost when its lease runs out, and its error says that renewals failed,
// not only that Redis may have been unreachable.
func TestAHoldWhoseRenewalsAreRefusedSaysSo(t *testing.T) {
	client := aclClient(t, redistest.Start(t), "+@all", "-pexpire")
	r := newRegistry(t, client, WithExpireAfter(300*time.Millisecond), WithLogger(slog.New(slog.DiscardHandler)))
	h, err := r.Obtain("k").Acquire(context.Background())
	require.NoError(t, err)
	requireFires(t, h.Lost(), 5*time.Second, "the hold whose renewals Redis refused was lost")
	require.ErrorIs(t, h.Err(), ErrLockLost)
	require.ErrorContains(t, h.Err(), "renewals failing")
}

// TestATryLockThatRedisFailsIsAnErrorToTheHooks: a TryLock whose attempt
// Redis failed (a broken connection) did not find the key held: the hooks
// hear of an error that says what failed, not of a key not obtained.
func TestATryLockThatRedisFailsIsAnErrorToTheHooks(t *testing.T) {
	var failing atomic.Bool
	client := redistest.Shared(t).Client(t, redistest.Hook{Process: func(next redis.ProcessHook) redis.ProcessHook {
		return func(ctx context.Context, cmd redis.Cmder) error {
			if !failing.Load() {
				return next(ctx, cmd)
			}
			err := &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
			cmd.SetErr(err)
			return err
		}
	}})
	r := newRegistry(t, client)
	var told []AcquireEvent
	r.AddHooks(Hooks{AcquireDone: func(_ context.Context, e AcquireEvent) { told = append(told, e) }})
	failing.Store(true)
	require.False(t, r.Obtain("k").TryLock())
	require.Len(t, told, 1)
	require.Equal(t, OutcomeError, told[0].Outcome)
	require.ErrorIs(t, told[0].Err, ErrNotObtained)
	require.ErrorIs(t, told[0].Err, ErrRedis, "%v", told[0].Err)
	require.ErrorIs(t, told[0].Err, syscall.ECONNRESET)
}
