package lockreg

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/lockreg/lockreg/internal/protocol"
	"github.com/lockreg/lockreg/internal/redistest"
)

// A Cluster node restarted empty, faster than the cluster's node timeout
// (no failover: it comes back with its slots, from its nodes.conf), lost
// the keys it held: their holders must hear of it as a restart once it
// answers again, not at their next renewal.
func TestAHolderOnClusterLearnsAtOnceThatItsNodeRestartedEmpty(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := launchCluster(t, 0)
	// A long lease: no renewal in the test's time finds the loss instead.
	r := newRegistry(t, clusterClient(t, c.Addrs()), WithExpireAfter(3*time.Minute))
	reads := trackingReads(r)
	h, err := r.Obtain("restarted").Acquire(ctx)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return reads.Load() >= 1 }, 5*time.Second, time.Millisecond, "the key is armed")
	node, _, err := c.Shard(protocol.Slot(h.redisKey()))
	require.NoError(t, err)
	node.Restart(t)
	requireFires(t, h.Lost(), 5*time.Second, "the holder learns that its node restarted empty")
	requireCause(t, h, LossRestart)
}

// A Sentinel failover to a replica configured to evict (a maxmemory and
// an evicting policy, which a replica ignores until promoted) makes the
// registry's primary a server that may evict lock keys: it must be
// refused from the failover on, not from the next periodic look at the
// servers' policies.
func TestAFailoverToAnEvictingReplicaIsRefused(t *testing.T) {
	ctx := context.Background()
	g := redistest.StartSentinelGroup(t)
	client := g.FailoverClient(t)
	r := newRegistry(t, client)
	require.NoError(t, r.Do(ctx, "k", func(context.Context) error { return nil }))
	replica := g.Replica.Client(t)
	require.NoError(t, replica.ConfigSet(ctx, "maxmemory", "20mb").Err())
	require.NoError(t, replica.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err())
	g.Primary.Kill(t)
	g.WaitForFailover(t, g.Primary, 20*time.Second)
	requireRefusedAfterFailover(t, r, client)
}

// On a Cluster, a failover puts the replica at another address, which
// gets a tracker of its own: configured to evict, it must be refused from
// then on too.
func TestAClusterFailoverToAnEvictingReplicaIsRefused(t *testing.T) {
	ctx := context.Background()
	c := launchCluster(t, 1)
	client := clusterClient(t, c.Addrs())
	r := newRegistry(t, client)
	h, err := r.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	requireTracking(t, r)
	slot := protocol.Slot(h.redisKey())
	primary, replica, err := c.Shard(slot)
	require.NoError(t, err)
	admin := replica.Client(t)
	require.NoError(t, admin.ConfigSet(ctx, "maxmemory", "20mb").Err())
	require.NoError(t, admin.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err())
	primary.Crash()
	require.NoError(t, c.AwaitFailover(slot, replica, 30*time.Second))
	requireRefusedAfterFailover(t, r, client)
}

// requireRefusedAfterFailover waits until r, on client, refuses an
// acquisition as on a server that may evict, then closes both.
func requireRefusedAfterFailover(t *testing.T, r *Registry, client redis.UniversalClient) {
	t.Helper()
	require.Eventually(t, func() bool {
		err := r.Do(context.Background(), "after-failover", func(context.Context) error { return nil })
		return errors.Is(err, ErrServerEvicts)
	}, 10*time.Second, 50*time.Millisecond, "an acquisition is refused once the evicting replica is the primary")
	require.NoError(t, r.Close())
	require.NoError(t, client.Close())
	requireDialProbesEnd(t) // of the dead primary
}

// Close ends every connection a registry opened on a Cluster's nodes: its
// trackers' targets and tracking connections, and its subscription. The
// user's client, which it does not own, stays open.
func TestCloseOnClusterLeavesNoConnectionOfItsOwn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	addrs := redistest.StartCluster(t, 3)
	client := clusterClient(t, addrs)
	r, err := New(client, "lockreg-test:"+t.Name())
	require.NoError(t, err)
	holdKeys(t, r, "k", 12) // on every node, as a rule
	require.Eventually(t, func() bool {
		r.tracking.mu.Lock()
		defer r.tracking.mu.Unlock()
		up := 0
		for _, tr := range r.tracking.trackers {
			if tr.up.Load() {
				up++
			}
		}
		return up == len(addrs)
	}, 5*time.Second, 10*time.Millisecond, "a tracker on every node")
	require.NoError(t, r.Close())
	for _, addr := range addrs {
		node := redis.NewClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { _ = node.Close() })
		require.Eventually(t, func() bool {
			list, err := node.ClientList(ctx).Result()
			require.NoError(t, err)
			for line := range strings.SplitSeq(strings.TrimSpace(list), "\n") {
				if strings.Contains(line, " flags=t") || strings.Contains(line, " sub=") && !strings.Contains(line, " sub=0") {
					return false
				}
			}
			return true
		}, 5*time.Second, 10*time.Millisecond, "a tracking or subscribed connection stays open on %s", addr)
	}
}

// After a Sentinel failover the old primary may stay a primary for a
// while, still answering its clients: the Sentinels demote it only once
// they reach it again (a partition, here an ACL that refuses them
// REPLICAOF). The registry's client follows the Sentinels to the new
// primary at once; its holds must be renewed there, and exclude other
// registries there, not only on the old primary, which nobody else uses.
func TestAHoldIsRenewedOnTheNewPrimaryWhileTheOldOneLingers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g := redistest.StartSentinelGroup(t)
	const lease = 2 * time.Second
	r := newRegistry(t, g.FailoverClient(t), WithExpireAfter(lease))
	other := newRegistry(t, g.FailoverClient(t), WithExpireAfter(lease))
	h, err := r.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	requireTracking(t, r)
	old := g.Primary.Client(t)
	require.Equal(t, int64(1), old.Wait(ctx, 1, 5*time.Second).Val(), "the replica has the key")
	promoted := lingerAfterFailover(t, g)
	for end := time.Now().Add(3 * lease); time.Now().Before(end); time.Sleep(lease / 10) {
		lock := other.Obtain("k")
		if lock.TryLock() {
			lock.Unlock()
			require.Error(t, h.Err(), "another registry took a lock held, and renewed, through the old primary")
			break
		}
	}
	require.Equal(t, "master", g.Primary.Role(), "the old primary lingered")
	if h.Err() == nil {
		require.Positive(t, promoted.Client(t).PTTL(ctx, h.redisKey()).Val(), "the hold's key lives on the new primary")
	}
}

// A hold taken after such a failover, on the new primary, must not be
// armed, and found gone, on the lingering old one.
func TestAHoldTakenWhileTheOldPrimaryLingersIsNotLost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g := redistest.StartSentinelGroup(t)
	client := g.FailoverClient(t)
	r := newRegistry(t, client)
	require.NoError(t, r.Do(ctx, "before", func(context.Context) error { return nil }))
	requireTracking(t, r)
	promoted := lingerAfterFailover(t, g)
	// The client follows the Sentinels' news: the hold goes to the new
	// primary once it reads what only that one has.
	require.NoError(t, promoted.Client(t).Set(ctx, "marker", "new", 0).Err())
	require.Eventually(t, func() bool { return client.Get(ctx, "marker").Val() == "new" },
		10*time.Second, 10*time.Millisecond, "the client reaches the new primary")
	h, err := r.Obtain("after").Acquire(ctx)
	require.NoError(t, err)
	time.Sleep(time.Second) // its arming, and a tracker's checks, are over
	require.NoError(t, h.Err(), "a hold on the new primary was reported lost")
	require.NoError(t, h.Release(ctx))
}

// lingerAfterFailover fails g over to its replica, which it returns, while
// the old primary stays a primary: it refuses the Sentinels REPLICAOF, as
// a partition from them would keep it.
func lingerAfterFailover(t *testing.T, g *redistest.SentinelGroup) *redistest.Server {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, g.Primary.Client(t).Do(ctx, "ACL", "SETUSER", "default", "-replicaof", "-slaveof").Err())
	sentinel := redis.NewSentinelClient(&redis.Options{Addr: g.SentinelAddrs()[0]})
	t.Cleanup(func() { _ = sentinel.Close() })
	require.NoError(t, sentinel.Failover(ctx, redistest.SentinelMaster).Err())
	return g.WaitForFailover(t, g.Primary, 20*time.Second)
}

// A release while the lock's key already moved to the slot's target, its
// fence and marks not: the release goes through on the target, and a
// registry that waits meanwhile takes the lock.
func TestAReleaseAfterItsKeyMovedMidMigrationFreesItThere(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	addrs := redistest.StartCluster(t, 3)
	a := newRegistry(t, clusterClient(t, addrs))
	b := newRegistry(t, clusterClient(t, addrs), WithRetryInterval(100*time.Millisecond))
	lock := a.Obtain("order-42")
	require.NoError(t, lock.LockContext(ctx))
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	taken := lockInBackground(wctx, b.Obtain(lock.Key()))
	waitUntilWaiting(t, b)
	m := redistest.BeginSlotMigration(t, addrs, protocol.Slot(lock.keys().Lock()))
	for moved := ""; moved != lock.keys().Lock(); {
		key, ok := m.MoveKey(t)
		require.True(t, ok, "the lock's key never moved")
		moved = key
	}
	require.NoError(t, lock.UnlockContext(ctx), "the release goes through on the target")
	select {
	case _, ok := <-taken:
		require.True(t, ok, "the waiter got the lock")
	case <-wctx.Done():
		t.Fatal("the waiter never got the lock")
	}
	m.Finish(t)
}

// A Sentinel group whose primary changes twice in a row (to the replica,
// and back) keeps a holder told at once of a change to its key on the
// primary it ends on: the tracker follows both moves.
func TestAHolderOnSentinelStillLearnsAtOnceAfterTwoFailovers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g := redistest.StartSentinelGroup(t)
	// A long lease: no renewal in the test's time finds the change instead.
	r := newRegistry(t, g.FailoverClient(t), WithExpireAfter(3*time.Minute))
	h, err := r.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	requireTracking(t, r)
	require.Equal(t, int64(1), g.Primary.Client(t).Wait(ctx, 1, 5*time.Second).Val(), "the replica has the key")
	sentinel := redis.NewSentinelClient(&redis.Options{Addr: g.SentinelAddrs()[0]})
	t.Cleanup(func() { _ = sentinel.Close() })
	for _, from := range []*redistest.Server{g.Primary, g.Replica} {
		// The Sentinels accept a failover once they count the replica
		// healthy: the old primary, demoted, after its resync.
		require.Eventually(t, func() bool { return sentinel.Failover(ctx, redistest.SentinelMaster).Err() == nil },
			30*time.Second, 50*time.Millisecond, "Sentinel accepts a failover")
		g.WaitForFailover(t, from, 20*time.Second)
	}
	requireOpen(t, h.Lost(), "the key survived both failovers")
	require.NoError(t, g.Primary.Client(t).Del(ctx, h.redisKey()).Err())
	requireFires(t, h.Lost(), 5*time.Second, "the holder learns that its key was deleted after both failovers")
}
