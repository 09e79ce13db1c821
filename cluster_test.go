package lockreg

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/lockreg/lockreg/internal/protocol"
	"github.com/lockreg/lockreg/internal/redisstat"
	"github.com/lockreg/lockreg/internal/redistest"
)

// TestRedisCluster runs the registry on a real three-primary Redis Cluster:
// keys on every node, exclusion, renewal, tokens and pub/sub wake-ups
// across nodes.
func TestRedisCluster(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	addrs := redistest.StartCluster(t, 3)
	const lease = 600 * time.Millisecond
	a := newRegistry(t, clusterClient(t, addrs), WithExpireAfter(lease), WithRetryInterval(5*lease/6))
	b := newRegistry(t, clusterClient(t, addrs), WithExpireAfter(lease), WithRetryInterval(5*lease/6))

	// Keys spread over the slots of all three nodes.
	nodes := map[string]bool{}
	admin := clusterClient(t, addrs)
	var locks []*Lock
	for i := range 30 {
		lock := a.Obtain("order-" + strconv.Itoa(i))
		require.NoError(t, lock.LockContext(ctx))
		locks = append(locks, lock)
		node, err := admin.MasterForKey(ctx, lock.keys().Lock())
		require.NoError(t, err)
		nodes[node.Options().Addr] = true
		require.False(t, b.Obtain(lock.Key()).TryLock(), "exclusion across registries")
	}
	require.Len(t, nodes, 3, "the keys live on every node")

	// Renewal, batched per slot, keeps every hold past three leases.
	time.Sleep(3 * lease)
	for _, lock := range locks {
		requireOpen(t, lock.Lost(), "renewed on its own node")
		require.False(t, b.Obtain(lock.Key()).TryLock())
	}

	// A waiter in the other registry wakes on the release, well before its
	// 500ms retry, whichever node holds the key and the subscription.
	var woken atomic.Int64
	var latencies []time.Duration
	for i, lock := range locks[:6] {
		taken := lockInBackground(ctx, b.Obtain(lock.Key()))
		require.Eventually(t, func() bool { return b.Stats().FailedAttempts > int64(i)+30 }, 5*time.Second, time.Millisecond)
		released := time.Now()
		require.NoError(t, lock.UnlockContext(ctx))
		at, ok := <-taken
		require.True(t, ok)
		latencies = append(latencies, at.Sub(released))
		if at.Sub(released) < 250*time.Millisecond {
			woken.Add(1)
		}
	}
	slices.Sort(latencies)
	t.Logf("release to acquisition across nodes (classic PUBLISH, one subscription per registry): median %v, max %v", latencies[3], latencies[5])
	require.Equal(t, int64(6), woken.Load(), "every release woke the waiter by pub/sub")

	// Tokens rise across registries on the cluster too.
	var last int64
	for i := range 10 {
		lock := []*Registry{a, b}[i%2].Obtain("fenced")
		lock.Lock()
		require.Greater(t, mustToken(t, lock), last)
		last = mustToken(t, lock)
		lock.Unlock()
	}
	for _, lock := range locks[6:] {
		require.NoError(t, lock.UnlockContext(ctx))
	}
}

// TestRedisClusterMutualExclusion is the stress test of the core, on a
// cluster, each registry with its own cluster client.
func TestRedisClusterMutualExclusion(t *testing.T) {
	t.Parallel()
	addrs := redistest.StartCluster(t, 3)
	var registries []*Registry
	for range 3 {
		registries = append(registries, newRegistry(t, clusterClient(t, addrs), WithRetryInterval(5*time.Millisecond)))
	}
	requireExclusiveIncrements(t, registries, clusterClient(t, addrs), "stress-counter", 4, 50)
}

// migrateSlotSlowly moves slot to another primary with pauses of one lease
// at every stage, so that renewals run while the slot is migrating with its
// keys on the source, split between both nodes, all on the target but the
// slot not yet handed over, and after the hand-over.
func migrateSlotSlowly(t *testing.T, addrs []string, slot int, lease time.Duration, during func(stage string)) *redistest.SlotMigration {
	t.Helper()
	m := redistest.BeginSlotMigration(t, addrs, slot)
	time.Sleep(lease)
	during("slot migrating, keys on the source")
	for {
		key, ok := m.MoveKey(t)
		if !ok {
			break
		}
		time.Sleep(lease)
		during("moved " + key)
	}
	m.Finish(t)
	return m
}

// TestRedisClusterSlotMigrationWhileHeld moves a held lock's slot to
// another primary while the holder renews its lease every 200ms: the hold
// stays renewed through and after the move, excludes other registries,
// and is released on its new node.
func TestRedisClusterSlotMigrationWhileHeld(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	addrs := redistest.StartCluster(t, 3)
	const lease = 600 * time.Millisecond
	var logs syncBuffer
	a := newRegistry(t, clusterClient(t, addrs), WithExpireAfter(lease), WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	b := newRegistry(t, clusterClient(t, addrs), WithExpireAfter(lease))

	lock := a.Obtain("order-42")
	require.NoError(t, lock.LockContext(ctx))
	slot := protocol.Slot(lock.keys().Lock())
	renewals := a.Stats().RenewCalls
	m := migrateSlotSlowly(t, addrs, slot, lease, func(stage string) {
		requireOpen(t, lock.Lost(), "the hold was reported lost during the migration, "+stage)
	})
	during := a.Stats().RenewCalls - renewals
	time.Sleep(2*lease + lease/2)
	requireOpen(t, lock.Lost(), "the hold was reported lost after the migration")
	t.Logf("slot %d moved from %s to %s; %d renewals during the move, %d in the %v after",
		slot, m.From, m.To, during, a.Stats().RenewCalls-renewals-during, 2*lease+lease/2)

	target := redis.NewClient(&redis.Options{Addr: m.To})
	t.Cleanup(func() { _ = target.Close() })
	require.Equal(t, a.clientID, target.Get(ctx, lock.keys().Lock()).Val(), "the lock's key lives on the target now")
	require.Greater(t, target.PTTL(ctx, lock.keys().Lock()).Val(), lease/3, "and its lease is renewed there")
	requireHeldByAnother(t, b, lock.Key(), "the moved hold still excludes other registries")
	require.NoError(t, lock.UnlockContext(ctx), "the holder releases it on its new node")
	requireReleased(t, target, lock.keys().Lock(), "released on the target")
	taken := b.Obtain(lock.Key())
	require.True(t, taken.TryLock(), "another registry takes it after the release")
	require.NoError(t, taken.UnlockContext(ctx))
	require.NotContains(t, logs.String(), "renewal failed", "renewal never failed during the migration")
}

// TestRedisClusterSlotMigrationWhileWaited moves a held lock's slot while
// another registry waits for it: the waiter keeps retrying through the
// move and, after it, takes the lock on the release, woken by pub/sub.
func TestRedisClusterSlotMigrationWhileWaited(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	addrs := redistest.StartCluster(t, 3)
	const lease = 600 * time.Millisecond
	const retry = 5 * lease / 6
	var logs syncBuffer
	a := newRegistry(t, clusterClient(t, addrs), WithExpireAfter(lease), WithRetryInterval(retry))
	b := newRegistry(t, clusterClient(t, addrs), WithExpireAfter(lease), WithRetryInterval(retry), WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))

	lock := a.Obtain("order-42")
	require.NoError(t, lock.LockContext(ctx))
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	taken := lockInBackground(wctx, b.Obtain(lock.Key()))
	waitUntilWaiting(t, b)

	migrateSlotSlowly(t, addrs, protocol.Slot(lock.keys().Lock()), lease, func(stage string) {
		requireOpen(t, lock.Lost(), "the hold was reported lost during the migration, "+stage)
		select {
		case <-taken:
			t.Fatalf("the waiter took a held lock during the migration, %s", stage)
		default:
		}
	})
	// Two failed attempts on the slot's new node mark the waiter there.
	failed := b.Stats().FailedAttempts
	require.Eventually(t, func() bool { return b.Stats().FailedAttempts >= failed+2 }, 5*time.Second, 10*time.Millisecond)
	requireOpen(t, lock.Lost(), "the hold was reported lost after the migration")

	released := time.Now()
	require.NoError(t, lock.UnlockContext(ctx))
	var at time.Time
	select {
	case got, ok := <-taken:
		require.True(t, ok, "the waiter got the lock")
		at = got
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter never got the lock after the release")
	}
	t.Logf("release to acquisition after the slot moved: %v (retry interval %v)", at.Sub(released), retry)
	require.Less(t, at.Sub(released), retry/2, "the release woke the waiter by pub/sub")
	t.Logf("the waiter's log (its attempts during the move, retried):\n%s", logs.String())
}

// TestRedisClusterSlotMigrationKeepsHoldsSharingASlot: a namespace with
// a hash tag puts all of a registry's locks in one slot, and the watchdog
// renews them with one script call per slot. While a migration has moved
// one lock's key but not the other's, Redis refuses that call (TRYAGAIN,
// or ASK), though each key alone can still be renewed where it is: the
// holds must not be reported lost, however long the migration takes.
func TestRedisClusterSlotMigrationKeepsHoldsSharingASlot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	addrs := redistest.StartCluster(t, 3)
	client := clusterClient(t, addrs)
	const lease = 600 * time.Millisecond
	var logs syncBuffer
	r, err := New(client, "{lockreg-test:"+t.Name()+"}", WithExpireAfter(lease), WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, r.Close()) })

	locks := holdKeys(t, r, "order", 2)
	slot := protocol.Slot(locks[0].keys().Lock())
	require.Equal(t, slot, protocol.Slot(locks[1].keys().Lock()), "the hash tag puts both locks in one slot")
	m := redistest.BeginSlotMigration(t, addrs, slot)
	for split := false; !split; {
		key, ok := m.MoveKey(t)
		require.True(t, ok)
		split = key == locks[0].keys().Lock() || key == locks[1].keys().Lock()
	}
	time.Sleep(2 * lease)
	for _, lock := range locks {
		requireOpen(t, lock.Lost(), "a hold was reported lost while the keys of its slot were split between two nodes; the registry's log:\n"+logs.String())
	}
	m.Finish(t)
	time.Sleep(lease)
	for _, lock := range locks {
		requireOpen(t, lock.Lost(), "a hold was reported lost after the migration")
		require.NoError(t, lock.UnlockContext(ctx))
	}
}

// TestRedisClusterLocksWorkDuringSlotMigration releases a hold, and takes
// a free lock, while their slot is migrating. obtain.lua and release.lua
// name four keys, the lock, its fence, its waiting marker and its queue,
// and the last two (like the fence of a key never locked) seldom exist:
// Redis answers TRYAGAIN to a script whose keys a migrating or importing
// slot has only some of, from the first step of the migration to the
// last, even before any key moved. Locks must keep working meanwhile: a release
// that fails leaves the key a whole lease (30s by default) for waiters.
func TestRedisClusterLocksWorkDuringSlotMigration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	addrs := redistest.StartCluster(t, 3)
	a := newRegistry(t, clusterClient(t, addrs))
	b := newRegistry(t, clusterClient(t, addrs))

	lock := a.Obtain("order-42")
	require.NoError(t, lock.LockContext(ctx))
	m := redistest.BeginSlotMigration(t, addrs, protocol.Slot(lock.keys().Lock()))
	require.NoError(t, lock.UnlockContext(ctx), "a release while the slot migrates goes through")
	source := redis.NewClient(&redis.Options{Addr: m.From})
	t.Cleanup(func() { _ = source.Close() })
	require.Zero(t, source.Exists(ctx, lock.keys().Lock()).Val(), "and deletes the key")
	free := b.Obtain(lock.Key())
	require.True(t, free.TryLock(), "another registry takes the free lock while its slot migrates")
	require.NoError(t, free.UnlockContext(ctx))
}

// TestRedisClusterRenewsInOneRoundTripPerNode holds locks in slots of their
// own on every node: each renewal tick is one pipeline per node, on the
// node's tracking connection (trackedrenewal.go), carrying a renewal for
// every key it holds. The client's hooks do not see that connection: each
// node's own count of renew.lua calls then shows whole ticks, and the
// client carries none.
func TestRedisClusterRenewsInOneRoundTripPerNode(t *testing.T) {
	t.Parallel()
	addrs := redistest.StartCluster(t, 3)
	client := clusterClient(t, addrs)
	var mu sync.Mutex
	sentTo := map[string]*redisstat.Counter{}
	client.OnNewNode(func(node *redis.Client) {
		var counter redisstat.Counter
		node.AddHook(&counter)
		mu.Lock()
		defer mu.Unlock()
		sentTo[node.Options().Addr] = &counter
	})
	const lease = 600 * time.Millisecond
	r := newRegistry(t, client, WithExpireAfter(lease))
	locks := holdKeys(t, r, "order", 30)
	keysOn := map[string]int64{}
	for _, lock := range locks {
		node, err := client.MasterForKey(context.Background(), lock.keys().Lock())
		require.NoError(t, err)
		keysOn[node.Options().Addr]++
	}
	require.Len(t, keysOn, 3, "the keys live on every node")

	time.Sleep(lease / 2)     // the first tick loads the script on each node
	const renewal = "evalsha" // renew.lua, on the tracking connection whatever the server
	counts := func() map[string][2]int64 {
		mu.Lock()
		defer mu.Unlock()
		out := map[string][2]int64{}
		for addr, c := range sentTo {
			out[addr] = [2]int64{c.RoundTrips(), c.Commands()[renewal]}
		}
		return out
	}
	serverCalls := func() map[string]int64 {
		out := map[string]int64{}
		for addr := range keysOn {
			node := redis.NewClient(&redis.Options{Addr: addr})
			stats, err := redisstat.CommandStats(context.Background(), node)
			require.NoError(t, node.Close())
			require.NoError(t, err)
			out[addr] = stats[renewal]
		}
		return out
	}
	before, beforeOnServers := counts(), serverCalls()
	time.Sleep(lease) // about three ticks
	after, afterOnServers := counts(), serverCalls()
	for addr, keys := range keysOn {
		calls := afterOnServers[addr] - beforeOnServers[addr]
		require.Positive(t, calls, "node %s renewed", addr)
		require.Zero(t, calls%keys, "node %s: every tick renews its %d keys", addr, keys)
		require.Zero(t, after[addr][1]-before[addr][1], "node %s: renewed on the tracking connection", addr)
	}
	for _, lock := range locks {
		requireOpen(t, lock.Lost(), "renewed")
	}
}

// TestRedisClusterWaitsForReplicas runs WithWaitReplicas on a cluster whose
// three primaries have a replica each. The WAIT must go to the primary of
// each key's slot, on the connection that wrote the key: when LockContext
// returns, the key's replica has the key, whichever node serves it.
func TestRedisClusterWaitsForReplicas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	addrs := redistest.StartClusterWithReplicas(t, 3)
	client := clusterClient(t, addrs)
	r := newRegistry(t, client, WithWaitReplicas(1, 2*time.Second))
	var replicas []*redis.Client
	for _, addr := range addrs {
		node := redis.NewClient(&redis.Options{Addr: addr, OnConnect: func(ctx context.Context, cn *redis.Conn) error {
			return cn.ReadOnly(ctx).Err() // a replica answers reads of its primary's slots
		}})
		t.Cleanup(func() { _ = node.Close() })
		if info := node.Info(ctx, "replication").Val(); strings.Contains(info, "role:slave") {
			replicas = append(replicas, node)
		}
	}
	require.Len(t, replicas, 3)

	primaries := make(map[string]bool)
	for i := range 12 {
		lock := r.Obtain("order-" + strconv.Itoa(i))
		// A WAIT sent to a node that did not take the write counts no
		// replica, and the registry would retry until the deadline.
		lockCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		require.NoError(t, lock.LockContext(lockCtx))
		cancel()
		primary, err := client.MasterForKey(ctx, lock.keys().Lock())
		require.NoError(t, err)
		primaries[primary.Options().Addr] = true
		copies := 0
		for _, replica := range replicas {
			if replica.Get(ctx, lock.keys().Lock()).Val() == r.clientID {
				copies++
			}
		}
		require.Equal(t, 1, copies, "the replica of %s's primary has it when the lock returns", lock.Key())
		require.NoError(t, lock.UnlockContext(ctx))
	}
	require.Len(t, primaries, 3, "the keys spread over every primary")
	require.Zero(t, r.Stats().FailedAttempts, "every acquisition was acknowledged")
}

// TestWaitReplicasRecoversAfterASlotMove: with WithWaitReplicas on a
// Redis Cluster, an acquisition runs obtain.lua and WAIT in one pipeline on
// the node client that ClusterClient.MasterForKey names from its cached
// slot map (obtainReplicated). Once the key's slot has moved to another
// primary, that node answers MOVED, which a pipeline on a node client
// neither follows nor reports to the cluster client: the slot map stayed
// stale, and every acquisition of the key failed with ErrRedis until other
// traffic through the cluster client, or its reload every 60s, refreshed
// it (lockcheck -topology cluster -wait-replicas 1 found it). The failed
// attempt now reloads the map, and the next one takes the key, as a
// registry without WithWaitReplicas does at once.
func TestWaitReplicasRecoversAfterASlotMove(t *testing.T) {
	t.Parallel()
	addrs := redistest.StartClusterWithReplicas(t, 3)
	replicated := newRegistry(t, clusterClient(t, addrs), WithWaitReplicas(1, 100*time.Millisecond), WithRetryInterval(50*time.Millisecond))
	plain := newRegistry(t, clusterClient(t, addrs))
	lock := lockAndUnlock(t, replicated, plain)

	primaries := addrs[:3] // redis-cli --cluster create makes the first three primaries
	m := redistest.BeginSlotMigration(t, primaries, protocol.Slot(lock.keys().Lock()))
	m.Finish(t)
	t.Logf("slot %d moved from %s to %s", m.Slot, m.From, m.To)
	requireTakenWithin(t, plain, 3*time.Second, "without WithWaitReplicas")
	requireTakenWithin(t, replicated, 3*time.Second, "WithWaitReplicas")
}

// TestWaitReplicasLocksWorkDuringSlotMigration: with WithWaitReplicas,
// every attempt is obtain.lua with WAIT, whose four keys Redis refuses
// (TRYAGAIN) from the first step of a migration to the last; it runs on
// the lock's key alone then, as without WithWaitReplicas, on the node that
// has it (the target, by ASK, for a key not on the source).
func TestWaitReplicasLocksWorkDuringSlotMigration(t *testing.T) {
	t.Parallel()
	addrs := redistest.StartClusterWithReplicas(t, 3)
	replicated := newRegistry(t, clusterClient(t, addrs), WithWaitReplicas(1, time.Second), WithRetryInterval(50*time.Millisecond))
	plain := newRegistry(t, clusterClient(t, addrs))
	lock := lockAndUnlock(t, replicated, plain)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h, err := plain.Obtain("k").Acquire(ctx) // on the source
	require.NoError(t, err)
	m := redistest.BeginSlotMigration(t, addrs[:3], protocol.Slot(lock.keys().Lock()))
	taken := lockInBackground(ctx, lock)
	time.Sleep(200 * time.Millisecond) // attempts find the key held on the source
	require.NoError(t, h.Release(ctx))
	requireTaken(t, taken) // by ASK on the target, where the free key goes
	m.Finish(t)
}

// lockAndUnlock takes and gives back k with each registry, so that their
// clients know k's slot, and returns the first registry's lock.
func lockAndUnlock(t *testing.T, registries ...*Registry) *Lock {
	t.Helper()
	for _, r := range registries {
		lock := r.Obtain("k")
		require.NoError(t, lock.LockContext(context.Background()))
		require.NoError(t, lock.UnlockContext(context.Background()))
	}
	return registries[0].Obtain("k")
}

// requireTakenWithin checks that r takes k, which is free, within limit.
func requireTakenWithin(t *testing.T, r *Registry, limit time.Duration, msg string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	lock := r.Obtain("k")
	require.NoError(t, lock.LockContext(ctx), "%s: the key, free, is not taken within %v", msg, limit)
	require.NoError(t, lock.UnlockContext(context.Background()))
}

// TestWaitReplicasRecoversAfterAClusterFailover: the same after a failover:
// MasterForKey kept naming the killed primary, whose dials failed, so every
// acquisition failed with ErrRedis though the replica served the slot.
func TestWaitReplicasRecoversAfterAClusterFailover(t *testing.T) {
	t.Parallel()
	c := launchCluster(t, 1)
	replicated := newRegistry(t, clusterClient(t, c.Addrs()), WithWaitReplicas(1, 100*time.Millisecond), WithRetryInterval(50*time.Millisecond))
	plain := newRegistry(t, clusterClient(t, c.Addrs()))
	lock := lockAndUnlock(t, replicated, plain)

	slot := protocol.Slot(lock.keys().Lock())
	primary, replica, err := c.Shard(slot)
	require.NoError(t, err)
	primary.Crash()
	require.NoError(t, c.AwaitFailover(slot, replica, 30*time.Second))
	require.NoError(t, c.Rejoin(primary, 60*time.Second), "the slot has a replica again, for WAIT")
	t.Logf("%s took slot %d over from %s, which is back as its replica", replica.Addr(), slot, primary.Addr())
	requireTakenWithin(t, plain, 3*time.Second, "without WithWaitReplicas")
	requireTakenWithin(t, replicated, 3*time.Second, "WithWaitReplicas")
}

// TestRedisClusterPipelineRunsEachCallOnce sends, in one pipeline to one
// node, a call Redis refuses with TRYAGAIN (its slot is migrating and has
// only one of its two keys) ahead of an INCR in another slot of that node.
// go-redis's ClusterClient pipeline would send the node's whole batch again
// on the TRYAGAIN, running the INCR up to four times; a release sent twice
// reports a false loss. Each call must run once.
func TestRedisClusterPipelineRunsEachCallOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	addrs := redistest.StartCluster(t, 3)
	client := clusterClient(t, addrs)
	const present, absent = "{pipeline}a", "{pipeline}b"
	require.NoError(t, client.Set(ctx, present, "1", 0).Err())
	m := redistest.BeginSlotMigration(t, addrs, protocol.Slot(present))
	counter := ""
	for i := 0; counter == ""; i++ {
		key := "counter-" + strconv.Itoa(i)
		node, err := client.MasterForKey(ctx, key)
		require.NoError(t, err)
		if node.Options().Addr == m.From && protocol.Slot(key) != m.Slot {
			counter = key
		}
	}

	calls := []*protocol.Call{{Args: []any{"mget", present, absent}}, {Args: []any{"incr", counter}}}
	protocol.RunPipeline(ctx, client, calls)
	require.True(t, redis.HasErrorPrefix(calls[0].Cmd.Err(), "TRYAGAIN"), "the split slot refuses the MGET: %v", calls[0].Cmd.Err())
	require.Equal(t, int64(1), calls[1].Cmd.Val(), "the INCR's reply")
	require.Equal(t, "1", client.Get(ctx, counter).Val(), "the INCR ran once")
}

// TestNoTokenIsDrawnWhileTheKeysSlotMigrates: while the slot is split, the
// fence may live on the other node, and a token from the clock alone could
// fall below one it holds (a forced unlock raises it past the clock, local
// hand-offs past the last draw). Token refuses, as a Redis error to call
// again for, and draws a larger token once the slot has moved.
func TestNoTokenIsDrawnWhileTheKeysSlotMigrates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	addrs := redistest.StartCluster(t, 3)
	r := newRegistry(t, clusterClient(t, addrs))
	h, err := r.Obtain("migrating").Acquire(ctx)
	require.NoError(t, err)
	first := mustHoldToken(t, h)
	require.NoError(t, h.Release(ctx))
	h, err = r.Obtain("migrating").Acquire(ctx)
	require.NoError(t, err)
	m := redistest.BeginSlotMigration(t, addrs, protocol.Slot(h.redisKey()))
	_, moved := m.MoveKey(t) // the lock or its fence moved: a split slot
	require.True(t, moved)
	_, err = h.Token(ctx)
	require.ErrorIs(t, err, ErrRedis)
	require.ErrorIs(t, err, protocol.ErrFenceMoving)
	m.Finish(t)
	second, err := h.Token(ctx)
	require.NoError(t, err)
	require.Greater(t, second, first)
	require.NoError(t, h.Release(ctx))
}

// One stalled Cluster node must not cost the holds of the other nodes
// their leases: their own nodes answer.
func TestAStalledNodeDoesNotLoseTheHoldsOfTheOthers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := launchCluster(t, 0)
	client := clusterClient(t, c.Addrs())
	const lease = 900 * time.Millisecond
	r := newRegistry(t, client, WithExpireAfter(lease), WithRetryInterval(50*time.Millisecond))
	// A hold on node a, whose round will hang, and one on another node.
	var onB *Hold
	var a *redistest.Server
	for i := 0; onB == nil; i++ {
		h, err := r.Obtain(fmt.Sprint("k", i)).Acquire(ctx)
		require.NoError(t, err)
		primary, _, err := c.Shard(protocol.Slot(h.redisKey()))
		require.NoError(t, err)
		switch {
		case a == nil:
			a = primary
		case primary != a:
			onB = h
		default:
			require.NoError(t, h.Release(ctx))
		}
	}
	a.Pause(t)
	defer a.Resume(t)
	// The cluster marks the node failed after its node timeout, 2 s: until
	// then the other nodes serve their slots.
	for end := time.Now().Add(1600 * time.Millisecond); time.Now().Before(end); time.Sleep(lease / 10) {
		require.Positive(t, client.PTTL(ctx, onB.redisKey()).Val(), "its key expired")
		require.NoError(t, onB.Err(), "a hold whose key its node renews was signalled lost")
	}
}
