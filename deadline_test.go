package lockreg

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockreg/lockreg/internal/protocol"
	"github.com/lockreg/lockreg/internal/redistest"
)

// setSender records, through its go-redis hook, which goroutine sent the
// last plain SET.
type setSender struct{ gid atomic.Int64 }

func (s *setSender) hook() redis.Hook {
	return redistest.Hook{Process: func(next redis.ProcessHook) redis.ProcessHook {
		return func(ctx context.Context, cmd redis.Cmder) error {
			if cmd.Name() == "set" {
				s.gid.Store(goroutineID())
			}
			return next(ctx, cmd)
		}
	}}
}

func TestTheFirstAttemptRunsOnTheCallersGoroutineOnlyIfItCannotOutlastCtx(t *testing.T) {
	// A cancellable ctx needs the attempts in a goroutine of their own, so
	// that LockContext can return at ctx's end while Redis hangs, unless
	// the client itself ends the call at ctx's deadline.
	withDeadline := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), time.Minute)
	}
	withCancel := func() (context.Context, context.CancelFunc) {
		return context.WithCancel(context.Background())
	}
	background := func() (context.Context, context.CancelFunc) {
		return context.Background(), func() {}
	}
	client := func(contextTimeoutEnabled bool) func(t *testing.T) redis.UniversalClient {
		return func(t *testing.T) redis.UniversalClient {
			return redis.NewClient(&redis.Options{Addr: redistest.SharedAddr(), ContextTimeoutEnabled: contextTimeoutEnabled})
		}
	}
	ring := func(t *testing.T) redis.UniversalClient {
		return redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"only": redistest.SharedAddr()}, ContextTimeoutEnabled: true})
	}
	cluster := func(t *testing.T) redis.UniversalClient {
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: redistest.StartCluster(t, 3), ContextTimeoutEnabled: true})
	}
	for _, c := range []struct {
		name   string
		client func(t *testing.T) redis.UniversalClient
		ctx    func() (context.Context, context.CancelFunc)
		inline bool
	}{
		{"ContextTimeoutEnabled, deadline", client(true), withDeadline, true},
		{"default client, deadline", client(false), withDeadline, false},
		{"ContextTimeoutEnabled, cancel only", client(true), withCancel, false},
		{"default client, Background", client(false), background, true},
		{"Ring with ContextTimeoutEnabled, deadline", ring, withDeadline, true},
		{"Cluster with ContextTimeoutEnabled, deadline", cluster, withDeadline, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			client := c.client(t)
			t.Cleanup(func() { _ = client.Close() })
			sender := &setSender{}
			client.AddHook(sender.hook())
			lock := newRegistry(t, client).Obtain("k")

			ctx, cancel := c.ctx()
			defer cancel()
			require.NoError(t, lock.LockContext(ctx))
			require.NoError(t, lock.UnlockContext(ctx))
			require.NotZero(t, sender.gid.Load(), "the key was free: a plain SET took it")
			require.Equal(t, c.inline, sender.gid.Load() == goroutineID(), "sent on the caller's goroutine")
		})
	}
}

func TestLockContextReturnsAtItsDeadlineWhileItsInlineAttemptHangs(t *testing.T) {
	// With ContextTimeoutEnabled, the first attempt runs on the caller's
	// goroutine, and go-redis ends it at ctx's deadline. If Redis ran the
	// SET after all, the registry deletes the key in the background.
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = client.Close() })
	r := newRegistry(t, client, WithExpireAfter(1000*time.Second))
	require.NoError(t, client.Ping(context.Background()).Err()) // a connection ready for the SET

	srv.Pause(t)
	elapsed, err := lockWithin(r.Obtain("k"), 200*time.Millisecond)
	srv.Resume(t)
	require.ErrorIs(t, err, ErrNotObtained)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorIs(t, err, ErrRedis, "the SET that the deadline cut")
	require.Less(t, elapsed, time.Second, "returns at ctx's deadline, not at go-redis's 5s read timeout")

	require.Eventually(t, func() bool { return r.locals.size() == 0 }, 5*time.Second, time.Millisecond)
	other := newRegistry(t, srv.Client(t))
	require.True(t, other.Obtain("k").TryLock(), "no key left behind for the 1000s lease")
	other.Obtain("k").Unlock()
}

func TestAnInlineAttemptThatFindsTheKeyTakenWaitsForIt(t *testing.T) {
	// The inline SET finds the key taken; the acquisition goes on in the
	// background, is marked as waiting, and gets the key when it is
	// released, well before the waiter's 5s retry interval.
	srv := redistest.Shared(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = client.Close() })
	holder := newRegistry(t, srv.Client(t))
	waiter := newRegistry(t, client, WithRetryInterval(5*time.Second))
	holder.Obtain("k").Lock()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got := make(chan error, 1)
	go func() {
		lock := waiter.Obtain("k")
		err := lock.LockContext(ctx)
		if err == nil {
			err = lock.UnlockContext(ctx)
		}
		got <- err
	}()
	require.Eventually(t, func() bool { return waiter.Stats().FailedAttempts > 0 }, 5*time.Second, time.Millisecond,
		"obtain.lua found the key taken and marked the waiter")
	start := time.Now()
	holder.Obtain("k").Unlock()
	require.NoError(t, <-got)
	require.Less(t, time.Since(start), 2*time.Second, "woken by the release, not by the retry 5s later")
}

// holdSets, through its go-redis hook, keeps the plain SETs of keys
// containing "busy" from going out until release is closed, counting them
// in held.
type holdSets struct {
	held    atomic.Int64
	release chan struct{}
}

func (h *holdSets) hook() redis.Hook {
	return redistest.Hook{Process: func(next redis.ProcessHook) redis.ProcessHook {
		return func(ctx context.Context, cmd redis.Cmder) error {
			if cmd.Name() == "set" && strings.Contains(fmt.Sprint(cmd.Args()[1]), "busy") {
				h.held.Add(1)
				<-h.release
			}
			return next(ctx, cmd)
		}
	}}
}

func TestAnInlineAttemptDoesNotQueueBehindSlowCalls(t *testing.T) {
	// With protocol.MaxInFlight calls on the wire, a call queues, and a queued call
	// waits for them whatever its ctx: the first attempt then goes to the
	// background, and LockContext still returns at its deadline.
	srv := redistest.Shared(t)
	slow := &holdSets{release: make(chan struct{})}
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	client.AddHook(slow.hook())
	t.Cleanup(func() { _ = client.Close() })
	r := newRegistry(t, client)
	var busy sync.WaitGroup
	for i := range protocol.MaxInFlight {
		busy.Go(func() {
			lock := r.Obtain(fmt.Sprint("busy", i))
			lock.Lock()
			lock.Unlock()
		})
	}
	require.Eventually(t, func() bool { return slow.held.Load() == protocol.MaxInFlight }, 5*time.Second, time.Millisecond)
	time.AfterFunc(2*time.Second, func() { close(slow.release) })

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := r.Obtain("k").LockContext(ctx)
	require.Less(t, time.Since(start), time.Second, "returns at ctx's deadline, not when the slow calls end")
	require.ErrorIs(t, err, ErrNotObtained)
	require.ErrorIs(t, err, context.DeadlineExceeded)

	// The queued SET goes out once the slow calls end; the registry then
	// deletes the key it took.
	busy.Wait()
	require.Eventually(t, func() bool { return r.locals.size() == 0 }, 5*time.Second, time.Millisecond)
	other := newRegistry(t, srv.Client(t))
	require.True(t, other.Obtain("k").TryLock(), "no key left behind for the lease")
	other.Obtain("k").Unlock()
}

// lockWithin runs LockContext with a deadline d away, and returns how long
// it took and its error.
func lockWithin(lock *Lock, d time.Duration) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	start := time.Now()
	err := lock.LockContext(ctx)
	return time.Since(start), err
}

func TestLockContextThatTimesOutWhileWaitingLeavesTheKeyFreeLocally(t *testing.T) {
	// With a cancellable ctx, only Redis calls run off the caller's
	// goroutine; the waiting between attempts is the caller's own. When
	// ctx ends there, the acquisition has given up the key's local mutex
	// by the time LockContext returns, so another goroutine of the
	// registry can try the key at once.
	srv := redistest.Shared(t)
	holder := newRegistry(t, srv.Client(t))
	waiter := newRegistry(t, srv.Client(t), WithRetryInterval(5*time.Second))
	holder.Obtain("k").Lock()
	for range 5 {
		_, err := lockWithin(waiter.Obtain("k"), 100*time.Millisecond)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Zero(t, waiter.locals.size(), "the waiter left nothing behind")
	}
	holder.Obtain("k").Unlock()
}

// replyWatcher records, through its go-redis hook, whether a reply
// carried the error text it watches for.
type replyWatcher struct {
	text string
	seen atomic.Bool
}

func (w *replyWatcher) hook() redis.Hook {
	return redistest.AfterReply(func(cmd redis.Cmder) { w.saw(cmd.Err()) })
}

func (w *replyWatcher) saw(err error) {
	if err != nil && strings.Contains(err.Error(), w.text) {
		w.seen.Store(true)
	}
}

func TestAnAttemptCutShortByCtxKeepsTheRedisErrorBeforeIt(t *testing.T) {
	// The caller's error says that ctx ended; what Redis said before that
	// is why the key was not taken, and it must not give way to the error
	// of the last attempt, which ctx's end cut short: a read past ctx's
	// deadline, or ctx's own error.
	for _, ending := range []string{"deadline", "cancel"} {
		t.Run(ending, func(t *testing.T) {
			ctx := context.Background()
			srv := redistest.Start(t)
			admin := srv.Client(t)
			client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
			t.Cleanup(func() { _ = client.Close() })
			refused := &replyWatcher{text: "OOM"}
			client.AddHook(refused.hook())
			r := newRegistry(t, client, WithRetryInterval(20*time.Millisecond))
			lock := r.Obtain("k")
			// Every attempt's SET fails with OOM, an error a retry may
			// outlast (a permanent one ends the acquisition at once).
			require.NoError(t, admin.ConfigSet(ctx, "maxmemory", "1").Err())

			lockCtx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
			defer cancel()
			var cut atomic.Bool
			r.AddHooks(Hooks{AcquireAttempt: func(context.Context, string) {
				// Once Redis refused an attempt, the next one is cut short:
				// Redis stops answering writes until after the deadline,
				// or ctx is cancelled as the attempt starts.
				if !refused.seen.Load() || !cut.CompareAndSwap(false, true) {
					return
				}
				if ending == "cancel" {
					cancel()
				} else {
					require.NoError(t, admin.ConfigSet(ctx, "maxmemory", "0").Err())
					require.NoError(t, admin.Do(ctx, "CLIENT", "PAUSE", 2000, "WRITE").Err())
				}
			}})

			err := lock.LockContext(lockCtx)
			require.True(t, cut.Load(), "an attempt was cut short")
			require.ErrorIs(t, err, ErrNotObtained)
			require.ErrorIs(t, err, lockCtx.Err())
			require.ErrorIs(t, err, ErrRedis)
			require.Contains(t, err.Error(), "OOM", "the Redis error before the cut-short attempt")
			require.NoError(t, admin.Do(ctx, "CLIENT", "UNPAUSE").Err())
		})
	}
}

// An attempt cut short by ctx after an earlier one found the key held is
// no Redis failure: Redis answered, and the key was another's. (Under
// load, a waiter's last attempt is often in flight at its deadline.)
func TestAnAttemptCutShortAfterTheKeyWasFoundHeldIsNoRedisError(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	holder := newRegistry(t, srv.Client(t)).Obtain("k")
	holder.Lock()
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = client.Close() })
	r := newRegistry(t, client, WithRetryInterval(20*time.Millisecond))
	lockCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var attempts atomic.Int32
	r.AddHooks(Hooks{AcquireAttempt: func(context.Context, string) {
		// The first attempt finds the key held; the second is cut short,
		// as ctx ends when it starts.
		if attempts.Add(1) == 2 {
			cancel()
		}
	}})
	err := r.Obtain("k").LockContext(lockCtx)
	require.GreaterOrEqual(t, attempts.Load(), int32(2), "an attempt was cut short")
	require.ErrorIs(t, err, ErrNotObtained)
	require.ErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, ErrRedis, "Redis answered: the key was held")
	holder.Unlock()
}

// TestAFirstAttemptFinishedAsideIsToldOnce: with a deadline, on a client
// that ends its calls at it, the first attempt's SET runs on the calling
// goroutine and, the key held, obtain.lua ends that attempt aside. The
// hooks hear of one attempt per attempt, as Stats counts them.
func TestAFirstAttemptFinishedAsideIsToldOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := redistest.Shared(t)
	holder := newRegistry(t, srv.Client(t)).Obtain("k")
	holder.Lock()
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = client.Close() })
	r := newRegistry(t, client)
	var attempts atomic.Int64
	var path atomic.Value
	r.AddHooks(Hooks{
		AcquireAttempt: func(context.Context, string) { attempts.Add(1) },
		AcquireDone:    func(_ context.Context, e AcquireEvent) { path.Store(e.Path) },
	})
	lockCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	acquired := make(chan *Hold, 1)
	go func() {
		h, err := r.Obtain("k").Acquire(lockCtx)
		assert.NoError(t, err)
		acquired <- h
	}()
	require.Eventually(t, func() bool { return r.Stats().FailedAttempts > 0 }, 5*time.Second, time.Millisecond)
	holder.Unlock()
	h := <-acquired
	require.NotNil(t, h)
	taken := r.Stats().FailedAttempts
	if path.Load() == PathRedis {
		taken++
	}
	require.Equal(t, taken, attempts.Load(), "attempts told (the key came by %v)", path.Load())
	require.NoError(t, h.Release(ctx))
}

func TestLockContextReturnsAtItsDeadlineWhileSubscribing(t *testing.T) {
	// A waiter subscribes after its first failed attempt. If Redis hangs
	// then, so does the subscription's call (go-redis reads the
	// confirmation with no deadline), but the caller still gets its
	// answer at its own deadline.
	srv := redistest.Start(t)
	holder := newRegistry(t, srv.Client(t))
	holder.Obtain("k").Lock()
	hang := &afterScript{do: func() { srv.Pause(t) }}
	waiter := newRegistry(t, srv.Client(t, hang.hook()))

	elapsed, err := lockWithin(waiter.Obtain("k"), 200*time.Millisecond)
	srv.Resume(t)
	require.True(t, hang.done.Load(), "the attempt failed, then Redis hung")
	require.ErrorIs(t, err, ErrNotObtained)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Less(t, elapsed, time.Second, "returns at its deadline, not when Redis wakes")
	// The subscription's call ends once Redis wakes, and the registry
	// then drops the key's local state.
	require.Eventually(t, func() bool { return waiter.locals.size() == 0 }, 5*time.Second, time.Millisecond)
	holder.Obtain("k").Unlock()
}

// afterScript, through its go-redis hook, runs do once, after the first
// script call that Redis answered without an error.
type afterScript struct {
	done atomic.Bool
	do   func()
}

func (a *afterScript) hook() redis.Hook {
	return redistest.Hook{Process: func(next redis.ProcessHook) redis.ProcessHook {
		return func(ctx context.Context, cmd redis.Cmder) error {
			err := next(ctx, cmd)
			if (cmd.Name() == "evalsha" || cmd.Name() == "eval") && err == nil && a.done.CompareAndSwap(false, true) {
				a.do()
			}
			return err
		}
	}}
}

func TestAbandonedAttemptIsCleanedUp(t *testing.T) {
	// The attempt reaches Redis, but its answer comes after the caller gave
	// up: the key it took must not block other registries for the lease.
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	client := srv.Client(t)
	r := newRegistry(t, client, WithExpireAfter(1000*time.Second))
	other := newRegistry(t, admin)
	r.Obtain("k").Lock() // loads the scripts: the attempt below must run, not fail NOSCRIPT
	r.Obtain("k").Unlock()

	require.NoError(t, admin.Ping(ctx).Err()) // connected, so DEBUG SLEEP goes out at once
	slept := make(chan error, 1)
	go func() { slept <- admin.Do(ctx, "DEBUG", "SLEEP", "0.5").Err() }()
	time.Sleep(50 * time.Millisecond)
	tctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	require.ErrorIs(t, r.Obtain("k").LockContext(tctx), ErrNotObtained)
	require.Less(t, time.Since(start), 300*time.Millisecond, "returns at its deadline, not when Redis wakes")
	require.NoError(t, <-slept)

	// The attempt ran once Redis woke; the registry settles it in the
	// background and only then drops the key's local state.
	require.Eventually(t, func() bool { return r.locals.size() == 0 }, 5*time.Second, time.Millisecond)
	require.True(t, other.Obtain("k").TryLock(), "no key left behind for the 1000s lease")
	other.Obtain("k").Unlock()
}

func TestUnlockContextHonoursCtxAsFarAsTheClientDoes(t *testing.T) {
	// A go-redis client with ContextTimeoutEnabled applies ctx's deadline
	// to its calls: UnlockContext then returns at that deadline while
	// Redis hangs, with an ErrRedis error, and frees the lock locally.
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = client.Close() })
	r := newRegistry(t, client)
	lock := r.Obtain("k")
	lock.Lock()

	srv.Pause(t)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := lock.UnlockContext(ctx)
	elapsed := time.Since(start)
	srv.Resume(t)
	require.ErrorIs(t, err, ErrRedis)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Less(t, elapsed, time.Second, "returns at ctx's deadline, not at go-redis's 5s read timeout")
	requireNoLocalState(t, r)
}
