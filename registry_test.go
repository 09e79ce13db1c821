package lockreg

import (
	"context"
	"log/slog"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockreg/lockreg/internal/protocol"
	"github.com/lockreg/lockreg/internal/redistest"
)

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
		{"empty namespace", client, "", nil, "namespace is empty"},
		{"zero lease", client, "k", []Option{WithExpireAfter(0)}, "WithExpireAfter(0s)"},
		{"negative lease", client, "k", []Option{WithExpireAfter(-time.Second)}, "WithExpireAfter(-1s)"},
		{"sub-millisecond lease", client, "k", []Option{WithExpireAfter(time.Microsecond)}, "WithExpireAfter(1µs)"},
		{"lease shorter than default retry", client, "k", []Option{WithExpireAfter(50 * time.Millisecond)}, "WithRetryInterval(100ms): not below the lease (WithExpireAfter, 50ms)"},
		{"zero retry", client, "k", []Option{WithRetryInterval(0)}, "WithRetryInterval(0s)"},
		{"negative retry", client, "k", []Option{WithRetryInterval(-time.Millisecond)}, "WithRetryInterval(-1ms)"},
		{"retry equal to lease", client, "k", []Option{WithExpireAfter(time.Second), WithRetryInterval(time.Second)}, "WithRetryInterval(1s): not below the lease (WithExpireAfter, 1s)"},
		{"retry longer than default lease", client, "k", []Option{WithRetryInterval(time.Minute)}, "WithRetryInterval(1m0s): not below the lease (WithExpireAfter, 30s)"},
		{"nil logger", client, "k", []Option{WithLogger(nil)}, "WithLogger(nil)"},
		{"replica wait as long as the lease", client, "k", []Option{WithExpireAfter(time.Second), WithRetryInterval(10 * time.Millisecond), WithWaitReplicas(1, time.Second)}, "WithWaitReplicas(…, 1s): not below the lease (WithExpireAfter, 1s)"},
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

// minimalACL gives the user "locker" the README's ACL for prefix, with
// more rules after it, and returns a maker of its clients: the registry's
// keys and channel, and the commands its scripts, its subscription,
// tracking, the look at the eviction policy, Inspect and Locks, and
// go-redis's handshake run.
func minimalACL(t *testing.T, admin *redis.Client, srv *redistest.Server, prefix string, more ...string) func() *redis.Client {
	t.Helper()
	args := []any{"ACL", "SETUSER", "locker", "reset", "on", ">secret", "resetkeys", "resetchannels",
		"~" + prefix + ":{*", "~" + prefix + ":owner:*",
		"&" + prefix + ":released", "&" + prefix + ":released:*", "&" + prefix + ":forced:*", "&__redis__:invalidate", "-@all",
		"+evalsha", "+eval", "+get", "+mget", "+set", "+pexpire", "+del", "+exists", "+time",
		"+zadd", "+zrem", "+zscore", "+zrangebyscore", "+zpopmin", "+pttl", "+publish", "+subscribe", "+ping", "+hello", "+hset",
		"+client|id", "+client|tracking", "+info", "+zrange", "+hget", "+scan"}
	require.NoError(t, admin.Do(context.Background(), append(args, anySlice(more)...)...).Err())
	return func() *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "locker", Password: "secret"})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
}

func TestRegistryWorksWithAMinimalACL(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	const prefix = "orders"
	restricted := minimalACL(t, admin, srv, prefix)
	var logs syncBuffer
	logger := WithLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})))
	holder, err := New(restricted(), prefix, logger)
	require.NoError(t, err)
	defer holder.Close()
	waiter, err := New(restricted(), prefix, WithRetryInterval(5*time.Second), logger)
	require.NoError(t, err)
	defer waiter.Close()
	requireTracking(t, holder, waiter)

	holder.Obtain("o-1").Lock()
	taken := lockInBackground(ctx, waiter.Obtain("o-1"))
	waitUntilWaitingSeenBy(t, waiter, admin)
	holder.Obtain("o-1").Unlock()
	select {
	case _, ok := <-taken:
		require.True(t, ok, "acquired under the ACL")
	case <-time.After(2 * time.Second):
		t.Fatal("the notification did not arrive under the ACL")
	}
	require.Equal(t, int64(1), waiter.Stats().Notifications)
	require.Empty(t, logs.String(), "nothing refused, nothing to warn of")

	verdict, err := admin.Do(ctx, "ACL", "DRYRUN", "locker", "GET", "payments:{x}").Text()
	require.NoError(t, err)
	require.Contains(t, verdict, "no permissions", "and it can touch nothing outside its prefix")
	// Nor a namespace that its own begins: "orders:eu" is another.
	for _, command := range [][]any{{"GET", "orders:eu:{x}"}, {"HGET", "orders:eu:owner:x", "name"}, {"PUBLISH", "orders:eu:released", "x"}} {
		verdict, err := admin.Do(ctx, append([]any{"ACL", "DRYRUN", "locker"}, command...)...).Text()
		require.NoError(t, err)
		require.Contains(t, verdict, "no permissions", "%v", command)
	}
	require.Eventually(t, func() bool {
		return admin.HGet(ctx, protocol.OwnerKey(holder.namespace, holder.clientID), "name").Val() == holder.cfg.owner
	}, 5*time.Second, 10*time.Millisecond, "the owner name is published under the ACL")

	// Renewal runs under it too, and under the ACL documented before
	// renew.lua read its keys with MGET: a hold outlives its lease many
	// times over.
	const lease = 300 * time.Millisecond
	renewing, err := New(restricted(), prefix, WithExpireAfter(lease), WithRetryInterval(lease/3), logger)
	require.NoError(t, err)
	defer renewing.Close()
	for _, acl := range []string{"+mget", "-mget"} {
		require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "locker", acl).Err())
		renewed, err := renewing.Obtain("o-3").Acquire(ctx)
		require.NoError(t, err)
		time.Sleep(3 * lease)
		requireOpen(t, renewed.Lost(), "renewed under the ACL with "+acl)
		require.NoError(t, renewed.Release(ctx))
		require.Empty(t, logs.String(), "no renewal refused with "+acl)
	}

	// The ACL documented before owner names, without HSET: the registry
	// works all the same, unnamed.
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "locker", "-hset").Err())
	older, err := New(restricted(), prefix)
	require.NoError(t, err)
	defer older.Close()
	require.NoError(t, older.Do(ctx, "o-2", func(context.Context) error { return nil }))
}

func TestRegistriesOfOneNamespaceExclude(t *testing.T) {
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

func TestRegistriesOfDifferentNamespacesDoNotInterfere(t *testing.T) {
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

func TestMutualExclusionStress(t *testing.T) {
	srv := redistest.Shared(t)
	var registries []*Registry
	for range 4 {
		registries = append(registries, newRegistry(t, srv.Client(t), WithRetryInterval(5*time.Millisecond)))
	}
	requireExclusiveIncrements(t, registries, srv.Client(t), "lockreg-test:"+t.Name()+":counter", 8, 250)
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
	require.Eventually(t, func() bool { return r.locals.size() == 2 && waitersOf(r, "held") == 1 }, time.Second, time.Millisecond)

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

// TestCloseRightAfterNewReturnsAtOnce: Close ends the tracker that New
// started even before its subscription is up (go-redis does not end a
// blocked read when its context ends: the subscription must be closed,
// including one made after Close came).
func TestCloseRightAfterNewReturnsAtOnce(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	for range 30 {
		r, err := New(client, "lockreg-test:"+t.Name())
		require.NoError(t, err)
		closed := make(chan struct{})
		go func() {
			defer close(closed)
			assert.NoError(t, r.Close())
		}()
		requireFires(t, closed, 2*time.Second, "Close returned; it waited for a blocked read before")
	}
}

// The README: "add +wait for WithWaitReplicas". On a server that has not
// cached obtain.lua (a fresh or restarted one), an acquisition must work
// under that ACL.
func TestWaitReplicasWorksWithTheDocumentedACL(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	redistest.StartReplica(t, srv)
	admin := srv.Client(t)
	require.NoError(t, admin.ScriptFlush(ctx).Err())
	r, err := New(minimalACL(t, admin, srv, "orders", "+wait")(), "orders", WithWaitReplicas(1, 2*time.Second))
	require.NoError(t, err)
	defer r.Close()
	tctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	require.NoError(t, r.Do(tctx, "o-1", func(context.Context) error { return nil }))
}

// An ACL that forbids WAIT is a permanent error: the acquisition ends at
// once, wrapping ErrRedis, with the server's message, and leaves the key
// free.
func TestWaitReplicasUnderAnACLWithoutWaitEndsWithErrRedis(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	r, err := New(minimalACL(t, admin, srv, "orders", "+script|load")(), "orders", WithWaitReplicas(1, 100*time.Millisecond))
	require.NoError(t, err)
	defer r.Close()
	tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	start := time.Now()
	err = r.Do(tctx, "o-1", func(context.Context) error { return nil })
	require.Less(t, time.Since(start), time.Second, "it ended at once")
	require.ErrorIs(t, err, ErrNotObtained)
	require.ErrorIs(t, err, ErrRedis)
	require.ErrorContains(t, err, "NOPERM")
	require.NotContains(t, err.Error(), "%!")
	require.Zero(t, admin.Exists(ctx, "orders:{o-1}").Val(), "the key is free")
}

// The README's minimal ACL is all a registry needs for every call it
// makes, the operators' included: Inspect, Locks, ForceUnlock (whose
// warning names the holder) and Token.
func TestTheMinimalACLServesInspectLocksAndForceUnlock(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	const prefix = "orders"
	restricted := minimalACL(t, srv.Client(t), srv, prefix)
	var logs syncBuffer
	r, err := New(restricted(), prefix, WithOwner("billing"), WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	require.NoError(t, err)
	defer r.Close()
	h, err := r.Obtain("o-1").Acquire(ctx)
	require.NoError(t, err)
	_, err = h.Token(ctx)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return r.owner.freshUntil.Load() > 0 }, 5*time.Second, time.Millisecond)

	info, err := r.Inspect(ctx, "o-1")
	require.NoError(t, err, "Inspect")
	require.Equal(t, "billing", info.Owner)
	require.Equal(t, []string{"o-1"}, listedKeys(t, r))
	forced, err := r.ForceUnlockHeldBy(ctx, "o-1", r.OwnerID())
	require.NoError(t, err)
	require.True(t, forced)
	require.Contains(t, logs.String(), "owner=billing", "the warning names the holder")
	require.ErrorIs(t, h.Release(ctx), ErrLockLost)
}
