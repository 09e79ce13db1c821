package lockreg

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/lockreg/lockreg/internal/protocol"
	"github.com/lockreg/lockreg/internal/redistest"
)

// Tests that start servers of their own (a Cluster, a Sentinel group, a
// private redis-server) and take seconds call t.Parallel: they
// spend their time waiting for failovers, leases and gossip, and share
// nothing with the others. They run after the tests on the shared server,
// which stay serial because they count its commands or change its
// configuration, and so do tests that change a package variable
// (subscriptionCheck, policyRecheck) or look at every goroutine
// (requireDialProbesEnd, which another test's dead server would keep
// failing). make test runs four at a time.
func TestMain(m *testing.M) {
	if spec := os.Getenv(contenderEnv); spec != "" {
		os.Exit(runContender(spec))
	}
	// requireParksForGood leaves goroutines in parkForever on purpose.
	goleak.VerifyTestMain(redistest.M(m), goleak.IgnoreTopFunction("github.com/lockreg/lockreg.parkForever"))
}

// newRegistry makes a registry on client, namespaced by the test's name and
// closed when the test ends; registries of one test share the namespace.
func newRegistry(t testing.TB, client redis.UniversalClient, opts ...Option) *Registry {
	t.Helper()
	opts = append([]Option{WithLogger(slog.New(slog.DiscardHandler))}, opts...)
	r, err := New(client, "lockreg-test:"+t.Name(), opts...)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, r.Close()) })
	// The look at the servers' eviction policy, which New starts, is over
	// before the test counts calls.
	select {
	case <-r.servers.looked:
	case <-time.After(5 * time.Second):
	}
	return r
}

// trackingReads counts the reads r's trackers make (arming and verifying
// held keys).
func trackingReads(r *Registry) *atomic.Int64 {
	reads := new(atomic.Int64)
	r.AddHooks(Hooks{RedisCalls: func(op RedisOp, n int) {
		if op == OpTrack {
			reads.Add(int64(n))
		}
	}})
	return reads
}

// readsSettled waits until the tracker's reads counted by reads (the
// arming, the checks a new tracking connection or an invalidation asks
// for) stop, so that a read from then on is news.
func readsSettled(reads *atomic.Int64) {
	for last := int64(-1); last != reads.Load(); time.Sleep(20 * time.Millisecond) {
		last = reads.Load()
	}
}

// requireSettled waits for what a registry's first acquisition starts in
// the background on its client (the owner name's publication, the
// subscription), so that a test counts its own calls only.
func requireSettled(t *testing.T, r *Registry) {
	t.Helper()
	require.Eventually(t, func() bool {
		return r.owner.freshUntil.Load() > 0 && !r.owner.publishing.Load() && r.notes.subscribed.Load()
	}, 5*time.Second, time.Millisecond, "the registry settled")
}

// requireTracking waits until each registry tracks its held keys.
func requireTracking(t *testing.T, registries ...*Registry) {
	t.Helper()
	for _, r := range registries {
		require.Eventually(t, func() bool { return r.Stats().Tracking }, 5*time.Second, time.Millisecond, "tracking is on")
	}
}

// inGoroutine runs fn in a new goroutine, which is not the owner of anything
// the caller holds, and waits for it.
func inGoroutine(fn func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	<-done
}

// requireNoLocalState checks that r keeps no per-key state. An attempt
// still in flight when its caller gave up settles once Redis answers, a
// moment later, so it waits briefly for that.
func requireNoLocalState(t *testing.T, r *Registry, msgAndArgs ...any) {
	t.Helper()
	require.Eventually(t, func() bool { return r.locals.size() == 0 }, time.Second, time.Millisecond, msgAndArgs...)
}

// waitersOf is how many goroutines of r wait in key's local queue. A
// goroutine counts in refsOf before it joins the queue, so a test that
// needs it behind the holder (a release hands off only to the queue)
// waits for this.
func waitersOf(r *Registry, key string) int {
	l, ok := r.locals.m.Load(key)
	if !ok {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.queue)
}

// refsOf is how many goroutines hold or wait for key in r.
func refsOf(r *Registry, key string) int {
	var refs int
	r.locals.m.Compute(key, func(l *localLock, loaded bool) (*localLock, bool) {
		if loaded {
			refs = int(l.refs)
		}
		return l, !loaded
	})
	return refs
}

// requireParksForGood checks that fn, run in a goroutine of its own,
// blocks for good in parkForever, and leaves that goroutine there.
func requireParksForGood(t *testing.T, fn func(), msgAndArgs ...any) {
	t.Helper()
	parked := func() int {
		buf := make([]byte, 1<<20)
		return strings.Count(string(buf[:runtime.Stack(buf, true)]), "lockreg.parkForever(")
	}
	before := parked()
	returned := make(chan struct{})
	go func() {
		fn()
		close(returned)
	}()
	require.Eventually(t, func() bool { return parked() == before+1 }, 5*time.Second, time.Millisecond, msgAndArgs...)
	select {
	case <-returned:
		require.Fail(t, "it returned", msgAndArgs...)
	default:
	}
}

// mustToken returns the calling goroutine's fencing token for l, failing
// the test (without stopping it, so that goroutines may call it too) if
// there is none.
func mustToken(t testing.TB, l *Lock) int64 {
	t.Helper()
	token, err := l.Token(context.Background())
	assert.NoError(t, err, "token of %q", l.Key())
	return token
}

func mustHoldToken(t *testing.T, h *Hold) int64 {
	t.Helper()
	token, err := h.Token(context.Background())
	require.NoError(t, err)
	return token
}

// requireFires waits for ch to close within limit and returns how long it
// took.
func requireFires(t *testing.T, ch <-chan struct{}, limit time.Duration, msg string) time.Duration {
	t.Helper()
	start := time.Now()
	select {
	case <-ch:
		return time.Since(start)
	case <-time.After(limit):
		t.Fatalf("%s: no signal within %v", msg, limit)
		return 0
	}
}

func requireOpen(t *testing.T, ch <-chan struct{}, msg string) {
	t.Helper()
	select {
	case <-ch:
		t.Fatal(msg)
	default:
	}
}

// waitUntilWaiting returns once r has failed an attempt and, with pub/sub
// on, holds its subscription and has marked itself as taking grants, so
// that the next release must grant it the key or wake it. (A registry
// that subscribes on its first failed attempt marks without grants first,
// then again at once: a release in between wakes it instead of granting.)
func waitUntilWaiting(t *testing.T, r *Registry) {
	t.Helper()
	waitUntilWaitingSeenBy(t, r, r.client)
}

// waitUntilWaitingSeenBy is waitUntilWaiting for a registry whose client
// may not read the marks (an ACL): admin reads them.
func waitUntilWaitingSeenBy(t *testing.T, r *Registry, admin redis.UniversalClient) {
	t.Helper()
	require.Eventually(t, func() bool {
		return r.Stats().FailedAttempts > 0 && (!r.cfg.pubSub || r.notes.subscribed.Load() && markedAnywhere(r, admin))
	}, 5*time.Second, time.Millisecond)
}

// markedAnywhere says whether a key of r's namespace has r's mark as r
// sets it now (markOf) among its waiting registries, as admin reads them.
func markedAnywhere(r *Registry, admin redis.UniversalClient) bool {
	var found atomic.Bool
	look := func(ctx context.Context, c *redis.Client) error {
		iter := c.Scan(ctx, 0, r.namespace+":{*}:waiting", 0).Iterator()
		for iter.Next(ctx) {
			if c.ZScore(ctx, iter.Val(), markOf(r)).Err() == nil {
				found.Store(true)
			}
		}
		return iter.Err()
	}
	ctx := context.Background()
	switch c := admin.(type) {
	case *redis.ClusterClient:
		_ = c.ForEachMaster(ctx, look)
	case *redis.Client:
		_ = look(ctx, c)
	default:
		panic(fmt.Sprintf("markedAnywhere: a client of type %T", admin))
	}
	return found.Load()
}

// lockInBackground starts lock.LockContext in a goroutine that unlocks at
// once; the channel reports the error and when the lock was taken.
func lockInBackground(ctx context.Context, lock *Lock) <-chan time.Time {
	taken := make(chan time.Time, 1)
	go func() {
		if err := lock.LockContext(ctx); err != nil {
			close(taken)
			return
		}
		taken <- time.Now()
		lock.Unlock()
	}()
	return taken
}

// requireTaken waits until lockInBackground's goroutine took its lock, and
// returns when it did.
func requireTaken(t *testing.T, taken <-chan time.Time) time.Time {
	t.Helper()
	select {
	case at, ok := <-taken:
		require.True(t, ok, "the waiter's acquisition failed")
		return at
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter did not acquire")
		return time.Time{}
	}
}

// holdKeys takes n locks of r named prefix-0, prefix-1, ..., as the
// calling goroutine.
func holdKeys(t *testing.T, r *Registry, prefix string, n int) []*Lock {
	t.Helper()
	locks := make([]*Lock, n)
	for i := range locks {
		locks[i] = r.Obtain(prefix + "-" + strconv.Itoa(i))
		require.NoError(t, locks[i].LockContext(context.Background()))
	}
	return locks
}

// requireReleased checks that a released key leaves Redis. When another
// registry gave up waiting for it just before, the release may grant it to
// that registry, which gives it back within a round trip or two.
func requireReleased(t *testing.T, client redis.Cmdable, redisKey, msg string) {
	t.Helper()
	require.Eventually(t, func() bool {
		return client.Exists(context.Background(), redisKey).Val() == 0
	}, 2*time.Second, time.Millisecond, msg)
}

// requireHeldByAnother checks that r cannot take key because another owner
// holds it, not because Redis failed.
func requireHeldByAnother(t *testing.T, r *Registry, key, msg string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err := r.Obtain(key).LockContext(ctx)
	require.ErrorIs(t, err, ErrNotObtained, msg)
	require.NotErrorIs(t, err, ErrRedis, msg)
}

// requireExclusiveIncrements has goroutines of every registry increment a
// counter under one lock, as a non-atomic GET then SET that only the lock
// keeps exact, and checks that no two holders overlapped and no increment
// was lost.
func requireExclusiveIncrements(t *testing.T, registries []*Registry, counter redis.UniversalClient, counterKey string, goroutines, increments int) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, counter.Del(ctx, counterKey).Err())
	var inside, overlaps atomic.Int32
	var wg sync.WaitGroup
	for _, r := range registries {
		for range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				lock := r.Obtain("counter")
				for range increments {
					if !assert.NoError(t, lock.LockContext(ctx)) {
						return
					}
					if inside.Add(1) != 1 {
						overlaps.Add(1)
					}
					n, err := counter.Get(ctx, counterKey).Int()
					if err != nil && !errors.Is(err, redis.Nil) {
						t.Error(err)
					}
					assert.NoError(t, counter.Set(ctx, counterKey, n+1, 0).Err())
					inside.Add(-1)
					assert.NoError(t, lock.UnlockContext(ctx))
				}
			}()
		}
	}
	wg.Wait()
	require.Zero(t, overlaps.Load(), "two holders overlapped")
	n, err := counter.Get(ctx, counterKey).Int()
	require.NoError(t, err)
	require.Equal(t, len(registries)*goroutines*increments, n)
}

// waitingMark is a registry's mark on a key: member, waiting since since,
// lapsing at lapse.
type waitingMark struct {
	member       string
	since, lapse time.Time
}

// markWaiting puts a registry's mark on key, as a failed attempt would,
// lapsing in a minute.
func markWaiting(t *testing.T, client redis.Cmdable, lock *Lock, mark string) {
	t.Helper()
	putMarks(t, client, lock, waitingMark{mark, time.Now(), time.Now().Add(time.Minute)})
}

// putMarks leaves marks on lock's key as failed attempts would (see
// markwaiting.lua): each in the marker, scored by its lapse, and in the queue, by
// when it began to wait, both expiring with the latest lapse.
func putMarks(t testing.TB, client redis.Cmdable, lock *Lock, marks ...waitingMark) {
	t.Helper()
	if len(marks) == 0 {
		return
	}
	ctx := context.Background()
	var last time.Time
	_, err := client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, m := range marks {
			p.ZAdd(ctx, lock.keys().Marker(), redis.Z{Score: float64(m.lapse.UnixMilli()), Member: m.member})
			p.ZAdd(ctx, lock.keys().Queue(), redis.Z{Score: float64(m.since.UnixMilli()), Member: m.member})
			if m.lapse.After(last) {
				last = m.lapse
			}
		}
		p.PExpire(ctx, lock.keys().Marker(), time.Until(last))
		p.PExpire(ctx, lock.keys().Queue(), time.Until(last))
		return nil
	})
	require.NoError(t, err)
}

// renewHolds runs one watchdog tick, its renewal round included, on the
// caller's goroutine.
func (r *Registry) renewHolds(ctx context.Context) {
	r.renew(ctx, r.renewalBatches(r.dueForRenewal()))
	r.loseLapsed()
}

// clusterClient returns a new client of the cluster at addrs, closed when
// the test ends.
func clusterClient(t *testing.T, addrs []string) *redis.ClusterClient {
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// syncBuffer is a log destination that tests can read while the registry
// writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// loadScripts loads the registry's scripts into client's server, so that
// the calls a test counts draw no NOSCRIPT retries.
func loadScripts(t testing.TB, client redis.Scripter) {
	t.Helper()
	k := protocol.LockKeys("load", "k")
	p := protocol.NewPeer(scripts, protocol.Config{Namespace: "load", ClientID: "load"})
	for _, c := range []protocol.Call{p.Obtain(k, false, false), p.Release(k, "k", protocol.Release{}), p.DrawToken(k), p.Renew(nil)} {
		require.NoError(t, c.Script.Load(context.Background(), client).Err())
	}
}

// markOf is r's waiting mark (docs/PROTOCOL.md, Keys).
func markOf(r *Registry) string {
	if r.grants.lease == 0 {
		return r.clientID
	}
	return r.clientID + ":" + strconv.FormatInt(r.grants.lease.Milliseconds(), 10)
}

// aclClient returns a client of srv logged in as a user of its own with
// the ACL rules (for example "+@all", "-client").
func aclClient(t *testing.T, srv *redistest.Server, rules ...string) *redis.Client {
	t.Helper()
	args := append([]any{"ACL", "SETUSER", "locker", "on", ">pw", "~*", "&*"}, anySlice(rules)...)
	require.NoError(t, srv.Client(t).Do(context.Background(), args...).Err())
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "locker", Password: "pw"})
	t.Cleanup(func() { _ = client.Close() })
	return client
}

func anySlice(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

// listedKeys is the keys that r.Locks lists, in its order; it fails t on
// an error.
func listedKeys(t *testing.T, r *Registry) []string {
	t.Helper()
	var listed []string
	for info, err := range r.Locks(context.Background()) {
		require.NoError(t, err, "Locks")
		listed = append(listed, info.Key)
	}
	return listed
}

// scriptGate holds back the first script call a client makes once armed
// is set, until gate is closed; blocked is closed when that call arrives.
type scriptGate struct {
	armed         atomic.Bool
	blocked, gate chan struct{}
}

func newScriptGate() *scriptGate {
	return &scriptGate{blocked: make(chan struct{}), gate: make(chan struct{})}
}

// hook is the gate, as a client's hook.
func (g *scriptGate) hook() redistest.Hook {
	return redistest.Hook{Process: func(next redis.ProcessHook) redis.ProcessHook {
		return func(ctx context.Context, cmd redis.Cmder) error {
			if n := cmd.Name(); (n == "evalsha" || n == "eval") && g.armed.CompareAndSwap(true, false) {
				close(g.blocked)
				<-g.gate
			}
			return next(ctx, cmd)
		}
	}}
}

// untrackedRegistry is a registry of srv that renews nothing and cannot
// track its keys (an ACL without CLIENT), once it has said so: a change to
// a held key is found only by the calls of the hold itself.
func untrackedRegistry(t *testing.T, srv *redistest.Server) *Registry {
	t.Helper()
	var logs syncBuffer
	r := newRegistry(t, aclClient(t, srv, "+@all", "-client"), WithRenewal(false),
		WithLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))))
	lock := r.Obtain("untracked")
	require.NoError(t, lock.LockContext(context.Background()))
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "CLIENT TRACKING unavailable") }, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, lock.UnlockContext(context.Background()))
	return r
}

// untrackedHoldOfAHash takes a key on an untrackedRegistry and makes its
// Redis key a hash behind the hold's back, which nothing tells the hold
// but its own next call; it returns the hold and an admin client.
func untrackedHoldOfAHash(t *testing.T) (*Hold, *redis.Client) {
	t.Helper()
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	h, err := untrackedRegistry(t, srv).Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	_, err = admin.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Del(ctx, h.redisKey())
		p.HSet(ctx, h.redisKey(), "not", "a lock")
		return nil
	})
	require.NoError(t, err)
	return h, admin
}

// holdBeside is a hold of key "k" whose lock's key that keyOf names (its
// fence, marker or queue) was then made a hash by hand, and that key.
func holdBeside(t *testing.T, keyOf func(protocol.Keys) string) (*Hold, string) {
	t.Helper()
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	lock := newRegistry(t, client).Obtain("k")
	key := keyOf(lock.keys())
	t.Cleanup(func() { client.Del(ctx, key) })
	h, err := lock.Acquire(ctx)
	require.NoError(t, err)
	require.NoError(t, client.HSet(ctx, key, "field", "value").Err())
	return h, key
}

// requireDialProbesEnd waits until go-redis stops probing servers whose
// dials failed (once a second, even after their client closed), which
// goleak would report: call it once the clients of a dead server closed.
func requireDialProbesEnd(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool {
		buf := make([]byte, 1<<20)
		return !strings.Contains(string(buf[:runtime.Stack(buf, true)]), "(*ConnPool).tryDial")
	}, 3*time.Second, 10*time.Millisecond, "go-redis's dial probes end")
}

// lapsedAndForced takes two keys on r, an untrackedRegistry, before
// anything reads them: the lease of "lapsed" has run out as the registry
// counts it (unsignalled yet), and the note that "forced" was forced open
// came.
func lapsedAndForced(t *testing.T, r *Registry) (lapsed, forced *Hold) {
	t.Helper()
	ctx := context.Background()
	lapsed, err := r.Obtain("lapsed").Acquire(ctx)
	require.NoError(t, err)
	forced, err = r.Obtain("forced").Acquire(ctx)
	require.NoError(t, err)
	lapsed.tenure.leaseEnd.Store(int64(instantOf(time.Now().Add(-time.Millisecond))))
	forced.mu.Lock()
	forced.forced = true
	forced.mu.Unlock()
	return lapsed, forced
}

// launchCluster starts a Redis Cluster of three primaries with replicasEach
// replicas each, stopped when t ends.
func launchCluster(t *testing.T, replicasEach int) *redistest.Cluster {
	t.Helper()
	c, stop, err := redistest.LaunchCluster(3, replicasEach)
	require.NoError(t, err)
	t.Cleanup(stop)
	return c
}
