package lockreg

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"log/slog"
	"maps"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
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

func TestNewRejectsBadArguments(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": redistest.SharedAddr(), "b": redistest.SharedAddr()}})
	t.Cleanup(func() { _ = ring.Close() })
	cases := []struct {
		name   string
		client redis.UniversalClient
		key    string
		opts   []Option
		names  string // what the message must name
	}{
		{"nil client", nil, "k", nil, "client is nil"},
		{"empty registryKey", client, "", nil, "registryKey is empty"},
		{"zero lease", client, "k", []Option{WithExpireAfter(0)}, "WithExpireAfter(0s)"},
		{"negative lease", client, "k", []Option{WithExpireAfter(-time.Second)}, "WithExpireAfter(-1s)"},
		{"sub-millisecond lease", client, "k", []Option{WithExpireAfter(time.Microsecond)}, "WithExpireAfter(1µs)"},
		{"lease shorter than default retry", client, "k", []Option{WithExpireAfter(50 * time.Millisecond)}, "(WithRetryInterval, 100ms) must be shorter than the lease (WithExpireAfter, 50ms)"},
		{"zero retry", client, "k", []Option{WithRetryInterval(0)}, "WithRetryInterval(0s)"},
		{"negative retry", client, "k", []Option{WithRetryInterval(-time.Millisecond)}, "WithRetryInterval(-1ms)"},
		{"retry equal to lease", client, "k", []Option{WithExpireAfter(time.Second), WithRetryInterval(time.Second)}, "retry interval (WithRetryInterval, 1s) must be shorter than the lease (WithExpireAfter, 1s)"},
		{"retry longer than default lease", client, "k", []Option{WithRetryInterval(time.Minute)}, "(WithRetryInterval, 1m0s) must be shorter than the lease (WithExpireAfter, 30s)"},
		{"nil logger", client, "k", []Option{WithLogger(nil)}, "WithLogger(nil)"},
		{"Ring of two shards", ring, "k", nil, "redis.Ring with 2 shards"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, err := New(tc.client, tc.key, tc.opts...)
			require.Nil(t, r)
			require.ErrorIs(t, err, ErrInvalidOption)
			require.Contains(t, err.Error(), tc.names)
		})
	}

	r, err := New(client, "k", WithExpireAfter(1500*time.Microsecond), WithRetryInterval(500*time.Microsecond))
	require.NoError(t, err)
	require.Equal(t, time.Millisecond, r.cfg.expireAfter, "the lease is kept in whole milliseconds, as PX takes it")
	require.NoError(t, r.Close())
}

func TestObtainEmptyKeyPanics(t *testing.T) {
	r := newRegistry(t, redistest.Shared(t).Client(t))
	require.PanicsWithValue(t, "lockreg: Obtain with an empty key", func() { r.Obtain("") })
}

func TestRedisKeyHoldsClientIDWithLease(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	r1 := newRegistry(t, client, WithExpireAfter(7*time.Second))
	r2 := newRegistry(t, client)
	require.NotEqual(t, r1.clientID, r2.clientID)
	_, err := uuid.Parse(r1.clientID)
	require.NoError(t, err)

	lock := r1.Obtain("order-1")
	require.Equal(t, "order-1", lock.Key())
	lock.Lock()
	redisKey := "lockreg-test:" + t.Name() + ":{order-1}"
	require.Equal(t, r1.clientID, client.Get(ctx, redisKey).Val())
	ttl := client.PTTL(ctx, redisKey).Val()
	require.Greater(t, ttl, 6*time.Second)
	require.LessOrEqual(t, ttl, 7*time.Second)

	lock.Unlock()
	require.Zero(t, client.Exists(ctx, redisKey).Val(), "the last unlock deletes the key")
}

func TestRegistriesWithSameRegistryKeyExclude(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	r1 := newRegistry(t, client)
	r2 := newRegistry(t, client)

	r1.Obtain("k").Lock()
	require.False(t, r2.Obtain("k").TryLock())
	ctx, cancel := context.WithTimeout(context.Background(), 250*time.Millisecond)
	defer cancel()
	err := r2.Obtain("k").LockContext(ctx)
	require.ErrorIs(t, err, ErrNotObtained)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	requireNoLocalState(t, r2, "a failed acquisition leaves no local state")

	r1.Obtain("k").Unlock()
	require.True(t, r2.Obtain("k").TryLock())
	r2.Obtain("k").Unlock()
}

func TestRegistriesWithDifferentRegistryKeysDoNotInterfere(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	a, err := New(client, "lockreg-test:"+t.Name()+":a")
	require.NoError(t, err)
	defer a.Close()
	b, err := New(client, "lockreg-test:"+t.Name()+":b")
	require.NoError(t, err)
	defer b.Close()

	a.Obtain("k").Lock()
	require.True(t, b.Obtain("k").TryLock())
	b.Obtain("k").Unlock()
	a.Obtain("k").Unlock()
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

// inFlight records, through its go-redis hook, how many acquisition
// scripts run at once.
type inFlight struct {
	now, max, total atomic.Int64
}

func (f *inFlight) hook() redis.Hook {
	return redistest.Hook{Process: func(next redis.ProcessHook) redis.ProcessHook {
		return func(ctx context.Context, cmd redis.Cmder) error {
			if cmd.Name() != "evalsha" && cmd.Name() != "eval" {
				return next(ctx, cmd)
			}
			f.total.Add(1)
			n := f.now.Add(1)
			for m := f.max.Load(); n > m && !f.max.CompareAndSwap(m, n); m = f.max.Load() {
			}
			// Widen the window in which a second caller would overlap.
			time.Sleep(2 * time.Millisecond)
			defer f.now.Add(-1)
			return next(ctx, cmd)
		}
	}}
}

func TestOnlyOneGoroutinePerRegistryPollsRedis(t *testing.T) {
	srv := redistest.Shared(t)
	holder := newRegistry(t, srv.Client(t))
	holder.Obtain("k").Lock()
	defer holder.Obtain("k").Unlock()

	var flight inFlight
	const interval = 20 * time.Millisecond
	waiters := newRegistry(t, srv.Client(t, flight.hook()), WithRetryInterval(interval))
	ctx, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
	defer cancel()
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			assert.ErrorIs(t, waiters.Obtain("k").LockContext(ctx), ErrNotObtained)
		}()
	}
	wg.Wait()
	require.Equal(t, int64(1), flight.max.Load(), "at most one goroutine per registry and key talks to Redis")
	// One poller makes about 400ms/(20ms+2ms) attempts; eight would make
	// eight times as many.
	require.Less(t, flight.total.Load(), int64(2*400/20), "attempts grow with time, not with waiters")
	require.Greater(t, flight.total.Load(), int64(400/20/4), "the poller keeps retrying")
	requireNoLocalState(t, waiters)
}

func TestReleaseHandsOverWithoutWaitingForTheLease(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	r1 := newRegistry(t, client, WithExpireAfter(1000*time.Second))
	r2 := newRegistry(t, client, WithExpireAfter(1000*time.Second))
	for range 3 {
		r1.Obtain("k").Lock()
		require.False(t, r2.Obtain("k").TryLock())
		r1.Obtain("k").Unlock()
		require.True(t, r2.Obtain("k").TryLock(), "free right after unlock, not after the 1000s lease")
		r2.Obtain("k").Unlock()
	}
}

func TestExpiredLockIsReportedLostAndSuccessorKept(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	var logs syncBuffer
	r1 := newRegistry(t, client, WithExpireAfter(50*time.Millisecond), WithRetryInterval(10*time.Millisecond),
		WithRenewal(false), WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	r2 := newRegistry(t, client, WithExpireAfter(time.Minute))
	redisKey := "lockreg-test:" + t.Name() + ":{k}"

	lock := r1.Obtain("k")
	lock.Lock()
	// The holder outlives its lease and a second registry takes the key.
	require.NoError(t, r2.Obtain("k").LockContext(ctx))
	require.Equal(t, r2.clientID, client.Get(ctx, redisKey).Val())

	err := lock.UnlockContext(ctx)
	require.ErrorIs(t, err, ErrLockLost)
	require.Contains(t, err.Error(), `"k"`)
	require.Equal(t, r2.clientID, client.Get(ctx, redisKey).Val(), "the successor's key survives")
	require.Greater(t, client.PTTL(ctx, redisKey).Val(), 50*time.Second, "and keeps its lease")
	require.Zero(t, r1.locals.size(), "the local mutex is freed")

	// Unlock, which cannot return the error, logs it at warning level.
	r2.Obtain("k").Unlock()
	lock.Lock()
	require.NoError(t, client.Set(ctx, redisKey, "someone-else", time.Minute).Err())
	lock.Unlock()
	require.Contains(t, logs.String(), "level=WARN")
	require.Contains(t, logs.String(), ErrLockLost.Error())
	require.Equal(t, "someone-else", client.Get(ctx, redisKey).Val())
	require.NoError(t, client.Del(ctx, redisKey).Err())
}

func TestFailedAttemptLeavesOwnerKeyUntouched(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	holder := newRegistry(t, client, WithExpireAfter(10*time.Second))
	other := newRegistry(t, client, WithExpireAfter(1000*time.Second), WithRetryInterval(10*time.Millisecond))
	redisKey := "lockreg-test:" + t.Name() + ":{k}"

	holder.Obtain("k").Lock()
	defer holder.Obtain("k").Unlock()
	require.NoError(t, client.PExpire(ctx, redisKey, 5*time.Second).Err())

	require.False(t, other.Obtain("k").TryLock())
	tctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, other.Obtain("k").LockContext(tctx), ErrNotObtained)

	require.Equal(t, holder.clientID, client.Get(ctx, redisKey).Val())
	ttl := client.PTTL(ctx, redisKey).Val()
	require.LessOrEqual(t, ttl, 5*time.Second, "failed attempts never extend another owner's lease")
	require.Greater(t, ttl, 4*time.Second)
	requireNoLocalState(t, other)

	// Nor does an unlock attempt by a registry that never held it.
	inGoroutine(func() {
		require.ErrorIs(t, other.Obtain("k").UnlockContext(ctx), ErrNotHeld)
	})
	require.Equal(t, holder.clientID, client.Get(ctx, redisKey).Val())
}

func TestRedisDown(t *testing.T) {
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

func TestCancelWhileWaitingLocally(t *testing.T) {
	r := newRegistry(t, redistest.Shared(t).Client(t), WithRetryInterval(5*time.Second))
	lock := r.Obtain("k")
	lock.Lock()
	defer lock.Unlock()

	inGoroutine(func() {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(50*time.Millisecond, cancel)
		start := time.Now()
		err := lock.LockContext(ctx)
		require.ErrorIs(t, err, ErrNotObtained)
		require.ErrorIs(t, err, context.Canceled)
		require.Less(t, time.Since(start), time.Second, "returns well within one retry interval")
	})
	require.Equal(t, 1, refsOf(r, "k"), "the cancelled waiter left")
}

func TestCancelWhileSpinning(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	holder := newRegistry(t, client)
	waiter := newRegistry(t, client, WithRetryInterval(5*time.Second))
	holder.Obtain("k").Lock()
	defer holder.Obtain("k").Unlock()

	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	err := waiter.Obtain("k").LockContext(cctx)
	require.ErrorIs(t, err, ErrNotObtained)
	require.ErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, ErrRedis, "no Redis error happened")
	require.Less(t, time.Since(start), time.Second, "returns well within one retry interval")
	requireNoLocalState(t, waiter)
	require.Equal(t, holder.clientID, client.Get(ctx, "lockreg-test:"+t.Name()+":{k}").Val())
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

func TestCloseStopsAcquisitions(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	other := newRegistry(t, client)
	r, err := New(client, "lockreg-test:"+t.Name(), WithRetryInterval(5*time.Second))
	require.NoError(t, err)

	held := r.Obtain("held")
	held.Lock()
	other.Obtain("remote").Lock() // r's waiter below spins in Redis
	defer other.Obtain("remote").Unlock()

	waitErrs := make(chan error, 2)
	go func() { waitErrs <- r.Obtain("held").LockContext(ctx) }()   // waits locally
	go func() { waitErrs <- r.Obtain("remote").LockContext(ctx) }() // waits in Redis
	require.Eventually(t, func() bool { return r.locals.size() == 2 && refsOf(r, "held") == 2 }, time.Second, time.Millisecond)

	require.NoError(t, r.Close())
	require.NoError(t, r.Close(), "Close is idempotent")
	for range 2 {
		select {
		case err := <-waitErrs:
			require.ErrorIs(t, err, ErrClosed)
		case <-time.After(time.Second):
			t.Fatal("a waiting acquisition did not end at Close")
		}
	}
	require.ErrorIs(t, r.Obtain("x").LockContext(ctx), ErrClosed)
	require.False(t, r.Obtain("x").TryLock())
	requireParksForGood(t, func() { r.Obtain("x").Lock() }, "Lock on a closed registry")

	redisKey := "lockreg-test:" + t.Name() + ":{held}"
	require.Equal(t, r.clientID, client.Get(ctx, redisKey).Val(), "Close leaves held keys to their lease")
	require.ErrorIs(t, held.UnlockContext(ctx), ErrLockLost, "a holder can still unlock after Close, and hears that nothing renewed its key")
	require.Zero(t, client.Exists(ctx, redisKey).Val())
	require.Zero(t, r.locals.size())
}

// gate stops the first command named name before it goes out, until
// released is closed.
type gate struct {
	name              string
	once              sync.Once
	entered, released chan struct{}
}

func newGate(name string) *gate {
	return &gate{name: name, entered: make(chan struct{}), released: make(chan struct{})}
}

func (g *gate) hook() redis.Hook {
	return redistest.Hook{Process: func(next redis.ProcessHook) redis.ProcessHook {
		return func(ctx context.Context, cmd redis.Cmder) error {
			if cmd.Name() == g.name {
				g.once.Do(func() {
					close(g.entered)
					<-g.released
				})
			}
			return next(ctx, cmd)
		}
	}}
}

// TestAnAcquisitionThatCloseOvertakesFailsAndGivesTheKeyBack: Close
// signals the holds it finds; an acquisition whose call was on its way
// then must not end with a hold that nothing renews and whose Lost never
// fires. It fails with ErrClosed, as the waiting ones do, and the key it
// took goes back.
func TestAnAcquisitionThatCloseOvertakesFailsAndGivesTheKeyBack(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Shared(t)
	g := newGate("set")
	r, err := New(srv.Client(t, g.hook()), "lockreg-test:"+t.Name())
	require.NoError(t, err)

	got := make(chan error, 1)
	go func() { got <- r.Obtain("k").LockContext(ctx) }()
	select {
	case <-g.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the acquisition did not send its SET")
	}
	require.NoError(t, r.Close())
	close(g.released)
	select {
	case err := <-got:
		require.ErrorIs(t, err, ErrClosed)
	case <-time.After(5 * time.Second):
		t.Fatal("the acquisition did not end")
	}
	require.Zero(t, srv.Client(t).Exists(ctx, "lockreg-test:"+t.Name()+":{k}").Val(), "the key it took went back")
	require.Zero(t, r.locals.size())
}

func TestLocksOfOneKeyShareState(t *testing.T) {
	r := newRegistry(t, redistest.Shared(t).Client(t))
	a, b := r.Obtain("k"), r.Obtain("k")
	a.Lock()
	b.Lock() // reentrant: same key, same owner
	inGoroutine(func() {
		require.False(t, a.TryLock())
		require.False(t, b.TryLock())
	})
	b.Unlock()
	inGoroutine(func() { require.False(t, b.TryLock(), "still held at depth 1") })
	a.Unlock()
	inGoroutine(func() {
		require.True(t, b.TryLock())
		b.Unlock()
	})
}

func heapInUse() uint64 {
	var m runtime.MemStats
	for range 3 {
		runtime.GC()
	}
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

func TestRegistryForgetsKeysNoLongerUsed(t *testing.T) {
	r := newRegistry(t, redistest.Shared(t).Client(t))
	before := heapInUse()
	for i := range 1_000_000 {
		_ = r.Obtain("obtained-" + strconv.Itoa(i))
	}
	const noise = 1 << 20
	require.Less(t, int64(heapInUse())-int64(before), int64(noise), "Obtain keeps nothing")

	lockAll := func(prefix string, keys int) {
		var wg sync.WaitGroup
		const workers = 8
		for w := range workers {
			wg.Go(func() {
				for i := w; i < keys; i += workers {
					lock := r.Obtain(prefix + strconv.Itoa(i))
					lock.Lock()
					lock.Unlock()
				}
			})
		}
		wg.Wait()
	}
	// The client's connections, each with its buffers (128 KiB a side for
	// go-redis's pipeline pool), are no state of the keys: open them first.
	lockAll("warm-up-", 2_000)
	before = heapInUse()
	lockAll("locked-", 20_000)
	require.Zero(t, r.locals.size())
	require.Less(t, int64(heapInUse())-int64(before), int64(noise), "released keys leave no state behind")
}

func TestKeyStateNeverSplitsUnderChurn(t *testing.T) {
	// Goroutines come and go on one key, so its local state is dropped and
	// made again all the time; a split state would let two hold it at once.
	r := newRegistry(t, redistest.Shared(t).Client(t))
	var inside, overlaps, acquired atomic.Int32
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 100 {
				lock := r.Obtain("churn") // a fresh Lock value every time
				if (g+i)%3 == 0 {
					if !lock.TryLock() {
						continue
					}
				} else {
					lock.Lock()
				}
				acquired.Add(1)
				if inside.Add(1) != 1 {
					overlaps.Add(1)
				}
				runtime.Gosched()
				inside.Add(-1)
				lock.Unlock()
				if i%10 == 0 {
					time.Sleep(time.Millisecond) // let the key's state drop
				}
			}
		}()
	}
	wg.Wait()
	require.Zero(t, overlaps.Load())
	require.Greater(t, acquired.Load(), int32(16*100/2))
	require.Zero(t, r.locals.size())
}

func TestMutualExclusionStress(t *testing.T) {
	srv := redistest.Shared(t)
	var registries []*Registry
	for range 4 {
		registries = append(registries, newRegistry(t, srv.Client(t), WithRetryInterval(5*time.Millisecond)))
	}
	requireExclusiveIncrements(t, registries, srv.Client(t), "lockreg-test:"+t.Name()+":counter", 8, 250)
}

// TestErrorsAreShortAndTheirDocsSayWhatToDo: an error's text is logged
// wrapped, so it says what happened, in a few words; what to do about it
// is in its sentinel's doc comment.
func TestErrorsAreShortAndTheirDocsSayWhatToDo(t *testing.T) {
	sentinels := map[string]error{
		"ErrNotObtained": ErrNotObtained, "ErrNotHeld": ErrNotHeld, "ErrLockLost": ErrLockLost, "ErrClosed": ErrClosed,
		"ErrInvalidOption": ErrInvalidOption, "ErrInvalidKey": ErrInvalidKey, "ErrRedis": ErrRedis, "ErrNotReplicated": ErrNotReplicated,
	}
	for name, err := range sentinels {
		require.Regexp(t, regexp.MustCompile(`^lockreg: [a-zA-Z][a-z A-Z]+$`), err.Error(), name)
		require.LessOrEqual(t, len(err.Error()), 50, name)
	}
	pkgs, err := parser.ParseDir(token.NewFileSet(), ".", func(fi fs.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, parser.ParseComments)
	require.NoError(t, err)
	documented := map[string]string{}
	for _, file := range pkgs["lockreg"].Files {
		ast.Inspect(file, func(n ast.Node) bool {
			if spec, ok := n.(*ast.ValueSpec); ok && spec.Doc != nil {
				for _, name := range spec.Names {
					documented[name.Name] = spec.Doc.Text()
				}
			}
			return true
		})
	}
	for name := range sentinels {
		// "<Name>: <when>. <What to do>."
		require.Regexp(t, regexp.MustCompile(`(?s)^`+name+`: .+\. [A-Z].+\.\s*$`), documented[name], name)
	}
	// Every sentinel is in this test.
	require.Len(t, sentinels, strings.Count(strings.Join(slices.Collect(maps.Keys(documented)), " "), "Err"))
}

// TestAContendedKeySkipsThePlainSet: an attempt on a key this registry
// found taken goes straight to obtain.lua, as a plain SET would fail and
// cost a round trip, until a lease has passed without contention.
func TestAContendedKeySkipsThePlainSet(t *testing.T) {
	ctx := context.Background()
	const lease = 300 * time.Millisecond
	var counter redisstat.Counter
	srv := redistest.Shared(t)
	client := srv.Client(t, &counter)
	for _, script := range []*redis.Script{obtainScript, releaseScript} {
		require.NoError(t, script.Load(ctx, client).Err())
	}
	r := newRegistry(t, client, WithExpireAfter(lease), WithRetryInterval(10*time.Millisecond))
	other := newRegistry(t, srv.Client(t))
	key := "c" + strconv.FormatInt(time.Now().UnixNano(), 10)
	calls := func() [2]int64 {
		c := counter.Commands()
		return [2]int64{c["set"], c["evalsha"]}
	}
	held := other.Obtain(key)
	held.Lock()
	lock := r.Obtain(key)
	require.False(t, lock.TryLock())
	require.Equal(t, [2]int64{1, 1}, calls(), "a plain SET, then obtain.lua to see whose the key is")
	require.False(t, lock.TryLock())
	require.Equal(t, [2]int64{1, 2}, calls(), "a key found taken: obtain.lua alone")
	held.Unlock()
	require.True(t, lock.TryLock())
	lock.Unlock() // nobody waits, but the key still counts as contended
	require.True(t, lock.TryLock())
	lock.Unlock()
	require.Equal(t, [2]int64{1, 6}, calls(), "obtain.lua and a release twice")

	time.Sleep(lease) // a lease without contention
	require.True(t, lock.TryLock())
	require.Equal(t, [2]int64{2, 6}, calls(), "uncontended again: a plain SET")
	lock.Unlock()
}

// TestRegistryWorksOverRESP2: every other test's client speaks RESP3,
// go-redis's default; a client set to RESP2 (Protocol: 2, as some proxies
// require) gets other reply shapes for pub/sub messages, and the registry
// must read those and all the rest alike: the plain SET, the scripts'
// integers, the renewal's array, tokens, and grants heard by subscription.
func TestRegistryWorksOverRESP2(t *testing.T) {
	ctx := context.Background()
	resp2 := func() *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: redistest.Shared(t).Addr(), Protocol: 2})
		t.Cleanup(func() { _ = c.Close() })
		info, err := c.ClientInfo(ctx).Result()
		require.NoError(t, err)
		require.Equal(t, 2, info.Resp, "the connection speaks RESP2")
		return c
	}
	const lease = 300 * time.Millisecond
	holder := newRegistry(t, resp2(), WithExpireAfter(lease))
	// A retry interval far past the test's waits: only a grant heard by
	// subscription can pass it the key in time.
	waiter := newRegistry(t, resp2(), WithRetryInterval(10*time.Second))

	lock := holder.Obtain("k")
	lock.Lock()
	lock.Lock()
	first := mustToken(t, lock)
	time.Sleep(3 * lease)
	requireOpen(t, lock.Lost(), "the renewal kept the hold")
	require.False(t, waiter.Obtain("k").TryLock(), "and kept other owners out")

	taken := lockInBackground(ctx, waiter.Obtain("k"))
	waitUntilWaiting(t, waiter)
	lock.Unlock()
	require.NoError(t, lock.UnlockContext(ctx))
	requireTaken(t, taken)
	require.Positive(t, waiter.Stats().Notifications, "the waiter heard its grant")

	lock.Lock()
	require.Greater(t, mustToken(t, lock), first, "tokens grow across owners")
	redisKey := "lockreg-test:" + t.Name() + ":{k}"
	require.NoError(t, resp2().Del(ctx, redisKey).Err())
	requireFires(t, lock.Lost(), lease+500*time.Millisecond, "a key deleted behind the holder's back")
	require.ErrorIs(t, lock.UnlockContext(ctx), ErrLockLost)
}
