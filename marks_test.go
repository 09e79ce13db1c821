package lockreg

import (
	"context"
	"errors"
	"net"
	"os"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/lockreg/lockreg/internal/protocol"
	"github.com/lockreg/lockreg/internal/redistest"
)

func TestWaiterThatGivesUpWithdrawsItsMark(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	holder := newRegistry(t, client)
	// Its marks lapse after two retry intervals, 2s: only the withdrawal
	// removes one sooner.
	waiter := newRegistry(t, client, WithRetryInterval(time.Second))
	held := holder.Obtain("g")
	held.Lock()
	defer held.Unlock()
	mark := markOf(waiter)

	waitCtx, cancel := context.WithCancel(ctx)
	gaveUp := make(chan error, 1)
	go func() { gaveUp <- waiter.Obtain("g").LockContext(waitCtx) }()
	require.Eventually(t, func() bool {
		return client.ZScore(ctx, held.keys().Marker(), mark).Err() == nil
	}, time.Second, time.Millisecond, "the waiting registry is marked")
	cancel()
	require.ErrorIs(t, <-gaveUp, ErrNotObtained)
	require.Eventually(t, func() bool {
		return client.ZScore(ctx, held.keys().Marker(), mark).Err() == redis.Nil && client.ZScore(ctx, held.keys().Queue(), mark).Err() == redis.Nil
	}, time.Second, time.Millisecond, "the mark is withdrawn, from the queue too, not left to lapse")
}

// TestAWithdrawalSparesTheMarkOfTheGoroutineThatWaitsNext: a goroutine
// that gives up withdraws its registry's mark, and the next goroutine of
// the registry waiting for the key marks it again, with the same mark. Had
// the withdrawal, slow here, landed after that, it would have taken the
// new mark with it: no release would wake that goroutine, nor grant it the
// key, until its next retry, 2s away, after its deadline.
func TestAWithdrawalSparesTheMarkOfTheGoroutineThatWaitsNext(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Shared(t)
	slowWithdrawal := redistest.Hook{ProcessPipeline: func(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
		return func(ctx context.Context, cmds []redis.Cmder) error {
			if slices.ContainsFunc(cmds, func(c redis.Cmder) bool { return c.Name() == "zrem" }) {
				time.Sleep(100 * time.Millisecond)
			}
			return next(ctx, cmds)
		}
	}}
	holder := newRegistry(t, srv.Client(t))
	waiter := newRegistry(t, srv.Client(t, slowWithdrawal), WithRetryInterval(2*time.Second))
	held := holder.Obtain("g")
	held.Lock()

	first, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	gaveUp := make(chan error, 1)
	go func() { gaveUp <- waiter.Obtain("g").LockContext(first) }()
	waitUntilWaiting(t, waiter)
	second, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer cancel()
	taken := lockInBackground(second, waiter.Obtain("g"))
	require.Eventually(t, func() bool { return waitersOf(waiter, "g") == 1 }, time.Second, time.Millisecond, "the second goroutine waits behind the first")
	require.ErrorIs(t, <-gaveUp, ErrNotObtained)

	time.Sleep(300 * time.Millisecond) // the withdrawal landed, and the second goroutine attempted
	held.Unlock()
	requireTaken(t, taken)
}

// TestATakenKeyLeavesNoMarkBehind: the attempt that takes a key its
// registry waited for withdraws the registry's mark, from the queue too,
// so that a later wait starts at the back.
func TestATakenKeyLeavesNoMarkBehind(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	holder := newRegistry(t, client)
	waiter := newRegistry(t, client, WithPubSub(false), WithRetryInterval(20*time.Millisecond)) // takes the key by an attempt
	held := holder.Obtain("g")
	held.Lock()
	lock := waiter.Obtain("g")
	taken := lockInBackground(ctx, lock)
	mark := markOf(lock.r)
	require.Eventually(t, func() bool {
		return client.ZScore(ctx, held.keys().Marker(), mark).Err() == nil && client.ZScore(ctx, held.keys().Queue(), mark).Err() == nil
	}, time.Second, time.Millisecond, "the waiting registry is marked and queued")
	held.Unlock()
	requireTaken(t, taken)
	require.Zero(t, waiter.Stats().Grants, "the waiter took the key itself")
	require.ErrorIs(t, client.ZScore(ctx, held.keys().Marker(), mark).Err(), redis.Nil, "its mark is gone")
	require.ErrorIs(t, client.ZScore(ctx, held.keys().Queue(), mark).Err(), redis.Nil, "and its place in the queue")
}

func TestFailedTryLockLeavesNoMark(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	holder := newRegistry(t, client)
	other := newRegistry(t, client)
	held := holder.Obtain("g")
	held.Lock()
	require.False(t, other.Obtain("g").TryLock())
	require.Zero(t, client.Exists(ctx, held.keys().Marker()).Val(), "nobody waits, so nobody is marked")
	held.Unlock()
	requireReleased(t, client, held.keys().Lock(), "the release deletes the key")
}

func TestReplicatedWaiterMarksItselfForWakeUps(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	holder := newRegistry(t, client)
	waiter := newRegistry(t, client, WithWaitReplicas(1, 10*time.Millisecond), WithRetryInterval(time.Second))
	held := holder.Obtain("g")
	held.Lock()
	defer held.Unlock()
	waitCtx, cancel := context.WithCancel(ctx)
	gaveUp := make(chan error, 1)
	go func() { gaveUp <- waiter.Obtain("g").LockContext(waitCtx) }()
	require.Eventually(t, func() bool {
		return client.ZScore(ctx, held.keys().Marker(), waiter.clientID).Err() == nil
	}, time.Second, time.Millisecond, "a waiting WithWaitReplicas registry asks to be woken (it takes no grants)")
	cancel()
	require.ErrorIs(t, <-gaveUp, ErrNotObtained)
}

// holdAndWaitBehind has holder take key and another registry wait for it
// (marked), then queues a second goroutine of holder behind the holder
// with ctx, unlocking at once when it gets the key. It returns the held
// lock, the other registry's lock, a channel that reports when the other
// registry took the key, one to let it release, and the second goroutine's.
func holdAndWaitBehind(t *testing.T, ctx context.Context, holder, other *Registry, key string) (held *Lock, otherTaken, otherRelease chan struct{}, behind <-chan time.Time) {
	t.Helper()
	held = holder.Obtain(key)
	held.Lock()
	require.NoError(t, holder.subscribe(ctx))
	otherTaken, otherRelease = make(chan struct{}), make(chan struct{})
	go func() {
		lock := other.Obtain(key)
		if err := lock.LockContext(context.Background()); err != nil {
			return
		}
		close(otherTaken)
		<-otherRelease
		lock.Unlock()
	}()
	waitUntilWaiting(t, other)
	behind = lockInBackground(ctx, holder.Obtain(key))
	require.Eventually(t, func() bool {
		local, ok := holder.locals.m.Load(key)
		return ok && local.waited()
	}, time.Second, time.Millisecond)
	return held, otherTaken, otherRelease, behind
}

func TestAReleasePassingTheKeyOnMarksTheGoroutineWaitingBehind(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	// Retry intervals longer than the test: every attempt is one it makes
	// by itself, not one a timer made. No local hand-off: the holder's
	// unlock releases the key in Redis.
	holder := newRegistry(t, client, WithRetryInterval(time.Second), WithLocalHandoff(0, 0))
	other := newRegistry(t, client, WithRetryInterval(time.Second))
	held, otherTaken, otherRelease, behind := holdAndWaitBehind(t, ctx, holder, other, "g")
	// A wake-up from before the release, still pending when the mutex
	// passes, must not cost the waiter an attempt either.
	require.NoError(t, client.Publish(ctx, protocol.ReleaseChannel(holder.namespace), "wg").Err())
	require.Eventually(t, func() bool { return holder.Stats().Notifications > 0 }, time.Second, time.Millisecond)
	calls := holder.Stats().AcquireCalls

	held.Unlock()
	<-otherTaken
	mark := markOf(held.r)
	require.NoError(t, client.ZScore(ctx, held.keys().Marker(), mark).Err(), "the release marked the holder as waiting")
	close(otherRelease)
	_, ok := <-behind
	require.True(t, ok, "the goroutine waiting behind the holder acquired")
	s := holder.Stats()
	require.Equal(t, int64(1), s.Grants, "by a grant")
	require.Equal(t, calls, s.AcquireCalls, "without an attempt of its own")
	requireReleased(t, client, held.keys().Lock(), "and released")
}

func TestAWaiterGivingUpWithdrawsTheMarkItsReleaseLeft(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	holder := newRegistry(t, client, WithRetryInterval(time.Second), WithLocalHandoff(0, 0))
	other := newRegistry(t, client, WithRetryInterval(time.Second))
	wctx, giveUp := context.WithCancel(ctx)
	defer giveUp()
	held, otherTaken, otherRelease, behind := holdAndWaitBehind(t, wctx, holder, other, "g")

	held.Unlock()
	<-otherTaken
	mark := markOf(held.r)
	require.NoError(t, client.ZScore(ctx, held.keys().Marker(), mark).Err(), "the release marked the holder as waiting")
	giveUp()
	_, ok := <-behind
	require.False(t, ok, "the waiter gave up")
	require.Eventually(t, func() bool {
		return errors.Is(client.ZScore(ctx, held.keys().Marker(), mark).Err(), redis.Nil)
	}, time.Second, time.Millisecond, "and withdrew the mark")
	close(otherRelease)
	requireReleased(t, client, held.keys().Lock(), "the other registry's release deleted the key")
	require.Zero(t, holder.Stats().Grants, "and granted the holder nothing")
}

// TestAGrantingReleaseLeavesOtherMarksAsTheyWere: a release that may grant
// pops the queue's first mark. One that takes no grants (a
// WithWaitReplicas or WithPubSub(false) registry's) stays in the marker as
// it was and, woken, goes to the back of the queue, with the queue's TTL;
// lapsed marks must not be granted.
func TestAGrantingReleaseLeavesOtherMarksAsTheyWere(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	r := newRegistry(t, client)
	lock := r.Obtain("m" + strconv.FormatInt(time.Now().UnixNano(), 10))
	marker, queue := lock.keys().Marker(), lock.keys().Queue()
	hold := func(marks ...waitingMark) {
		t.Helper()
		require.NoError(t, client.Set(ctx, lock.keys().Lock(), r.clientID, time.Minute).Err())
		require.NoError(t, client.Del(ctx, marker, queue).Err())
		putMarks(t, client, lock, marks...)
	}
	release := func() protocol.ReleaseReply {
		t.Helper()
		found, err := lock.releaseRedis(ctx, protocol.Release{})
		require.NoError(t, err)
		return found
	}
	now := time.Now()
	in := func(d time.Duration) time.Time { return now.Add(d) }

	// The only mark, which takes no grants: popping it deleted the queue.
	hold(waitingMark{"replicated", in(-time.Second), in(5 * time.Second)})
	require.Equal(t, protocol.DeletedWaited, release().Outcome, "the waiter is woken, not granted")
	require.Equal(t, float64(in(5*time.Second).UnixMilli()), client.ZScore(ctx, marker, "replicated").Val(), "its mark is as it was")
	require.NoError(t, client.ZScore(ctx, queue, "replicated").Err(), "and it is queued again")
	ttl := client.PTTL(ctx, queue).Val()
	require.Greater(t, ttl, time.Duration(0), "the queue expires")
	require.LessOrEqual(t, ttl, 5*time.Second, "when the mark lapses")

	// First in the queue, it is woken even if a mark that takes grants
	// waits behind it, and goes behind that one: the next release grants
	// the key. The queue keeps its own, longer TTL.
	hold(waitingMark{"replicated", in(-2 * time.Second), in(3 * time.Second)}, waitingMark{"other:1000", in(-time.Second), in(9 * time.Second)})
	require.Equal(t, protocol.DeletedWaited, release().Outcome)
	require.Equal(t, int64(2), client.ZCard(ctx, marker).Val(), "both marks stay")
	require.Equal(t, []string{"other:1000", "replicated"}, client.ZRange(ctx, queue, 0, -1).Val(), "the woken one now queues last")
	require.Greater(t, client.PTTL(ctx, queue).Val(), 3*time.Second, "whose TTL is the marker's")
	require.NoError(t, client.Set(ctx, lock.keys().Lock(), r.clientID, time.Minute).Err())
	require.Equal(t, protocol.Granted, release().Outcome)
	require.Equal(t, "other", client.Get(ctx, lock.keys().Lock()).Val(), "the next release granted the key behind it")

	// A lapsed mark is passed over for the next live one.
	hold(waitingMark{"lapsed:1000", in(-3 * time.Second), in(-time.Second)}, waitingMark{"live:1000", in(-2 * time.Second), in(5 * time.Second)})
	require.Equal(t, protocol.Granted, release().Outcome)
	require.Equal(t, "live", client.Get(ctx, lock.keys().Lock()).Val(), "the key went to the live mark")
	require.Zero(t, client.Exists(ctx, marker, queue).Val(), "no mark is left")

	// The mark that has waited longest gets the key, not the one that
	// lapses first: a waiting registry renews its mark with every attempt.
	hold(waitingMark{"early:1000", in(-3 * time.Second), in(5 * time.Second)}, waitingMark{"late:1000", in(-time.Second), in(2 * time.Second)})
	require.Equal(t, protocol.Granted, release().Outcome)
	require.Equal(t, "early", client.Get(ctx, lock.keys().Lock()).Val(), "the key went to the registry waiting longest")
	require.Equal(t, []string{"late:1000"}, client.ZRange(ctx, queue, 0, -1).Val(), "the other waits on")
	require.Equal(t, []string{"late:1000"}, client.ZRange(ctx, marker, 0, -1).Val())

	// A live mark outside the queue (an earlier version marked in the
	// marker alone) is woken.
	hold()
	require.NoError(t, client.ZAdd(ctx, marker, redis.Z{Score: float64(in(5 * time.Second).UnixMilli()), Member: "older:1000"}).Err())
	require.Equal(t, protocol.DeletedWaited, release().Outcome)
	require.Zero(t, client.Exists(ctx, lock.keys().Lock()).Val(), "the key is free for it")
}

// TestAMarkNeverShortensALongerOne: registries with different retry
// intervals mark a key as waited for during different times, in one
// marker whose TTL must cover the longest mark. A short mark that cut it
// would delete a longer one with the marker, and that mark's registry
// would miss its grant or wake-up until its own next attempt.
func TestAMarkNeverShortensALongerOne(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	key := "m" + strconv.FormatInt(time.Now().UnixNano(), 10)
	lock := newRegistry(t, client).Obtain(key)
	marker, queue := lock.keys().Marker(), lock.keys().Queue()
	markedFor := func(d time.Duration, member string) {
		t.Helper()
		putMarks(t, client, lock, waitingMark{member, time.Now().Add(-time.Second), time.Now().Add(d)})
	}
	failedAttempt := func(r *Registry) {
		t.Helper()
		lock := r.Obtain(key)
		require.NoError(t, client.Set(ctx, lock.keys().Lock(), "another", time.Minute).Err())
		reply, err := lock.obtain(ctx, true, false)
		require.NoError(t, err)
		require.False(t, reply.Held, "the attempt failed")
		require.Positive(t, reply.LastToken, "and reported the key's last token")
		require.NoError(t, client.ZScore(ctx, marker, markOf(lock.r)).Err(), "and marked its registry")
	}
	hasty := newRegistry(t, client, WithRetryInterval(10*time.Millisecond)) // marks for 20ms

	// A failed attempt, beside a registry that waits longer.
	markedFor(9*time.Second, "patient:1000")
	failedAttempt(hasty)
	require.Greater(t, client.PTTL(ctx, marker).Val(), 3*time.Second, "the short mark left the marker's TTL as it was")
	require.Greater(t, client.PTTL(ctx, queue).Val(), 3*time.Second, "and the queue's")

	// A release that grants the key and marks its own registry again.
	require.NoError(t, client.Del(ctx, marker, queue).Err())
	putMarks(t, client, lock, waitingMark{"first:1000", time.Now().Add(-2 * time.Second), time.Now().Add(2 * time.Second)})
	markedFor(9*time.Second, "patient:1000")
	released := hasty.Obtain(key)
	require.NoError(t, client.Set(ctx, released.keys().Lock(), hasty.clientID, time.Minute).Err())
	found, err := released.releaseRedis(ctx, protocol.Release{MarkNext: true})
	require.NoError(t, err)
	require.Equal(t, protocol.Granted, found.Outcome, "the release granted the key")
	require.Positive(t, found.MarkToken, "and marked its registry")
	require.Equal(t, "first", client.Get(ctx, released.keys().Lock()).Val())
	require.Greater(t, client.PTTL(ctx, marker).Val(), 3*time.Second, "the short mark left the marker's TTL as it was")
	require.Greater(t, client.PTTL(ctx, queue).Val(), 3*time.Second, "and the queue's")
	require.NoError(t, client.ZScore(ctx, marker, "patient:1000").Err(), "and the longer mark with it")

	// A mark longer than the marker's TTL extends it.
	require.NoError(t, client.Del(ctx, marker, queue).Err())
	markedFor(200*time.Millisecond, "hasty")
	failedAttempt(newRegistry(t, client, WithRetryInterval(5*time.Second)))
	require.Greater(t, client.PTTL(ctx, marker).Val(), 3*time.Second, "the longer mark extended the marker's TTL")
	require.Greater(t, client.PTTL(ctx, queue).Val(), 3*time.Second, "and the queue's")
}

// An attempt's obtain.lua runs and marks the registry as waiting, but its
// reply is lost (a timeout), and the acquisition then gives up: its mark
// is withdrawn, as that of any acquisition that gives up, rather than
// left to lapse while releases grant the key to a registry nobody waits
// in.
func TestTheMarkOfAnAttemptWhoseReplyWasLostIsWithdrawn(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	obtainHash := protocol.NewPeer(scripts, protocol.Config{}).Obtain(protocol.Keys{}, true, false).Script.Hash()
	var obtains atomic.Int32
	client := srv.Client(t, redistest.Hook{Process: func(next redis.ProcessHook) redis.ProcessHook {
		return func(ctx context.Context, cmd redis.Cmder) error {
			if args := cmd.Args(); len(args) > 1 && args[0] == "evalsha" && args[1] == obtainHash && obtains.Add(1) == 1 {
				_ = next(ctx, cmd) // it runs, and marks the registry
				err := &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
				cmd.SetErr(err)
				return err
			}
			return next(ctx, cmd)
		}
	}})
	loadScripts(t, admin) // the hooked call runs rather than fail with NOSCRIPT
	held := newRegistry(t, admin).Obtain("k")
	held.Lock()
	defer held.Unlock()
	r := newRegistry(t, client, WithRetryInterval(time.Second)) // marks last 2 s
	r.contention.saw("k")                                       // straight to obtain.lua
	other := r.Obtain("other")                                  // subscribes the registry, as any hold does
	other.Lock()
	other.Unlock()
	require.Eventually(t, r.notes.subscribed.Load, 5*time.Second, time.Millisecond)

	deadline, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, r.Obtain("k").LockContext(deadline), ErrNotObtained)
	require.Equal(t, int32(1), obtains.Load(), "one attempt, whose reply was lost")
	require.Eventually(t, func() bool {
		return errors.Is(admin.ZScore(ctx, r.Obtain("k").keys().Marker(), markOf(r)).Err(), redis.Nil)
	}, time.Second, 10*time.Millisecond, "the mark is withdrawn, not left to lapse")
}
