package lockreg

import (
	"context"
	"errors"
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
	ctx := context.Background()
	c, stop, err := redistest.LaunchCluster(3, 0)
	require.NoError(t, err)
	t.Cleanup(stop)
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
	c, stop, err := redistest.LaunchCluster(3, 1)
	require.NoError(t, err)
	t.Cleanup(stop)
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
