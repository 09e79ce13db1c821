package redistest

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// A Sentinel group fails over twice: each time the crashed primary comes
// back as a replica of the new one, in sync, and the next failover can
// promote it.
func TestSentinelGroupFailsOverAndRejoins(t *testing.T) {
	ctx := context.Background()
	g, stop, err := LaunchSentinelGroup(StableDownAfter)
	require.NoError(t, err)
	t.Cleanup(stop)
	primary, replica := g.Primary, g.Replica
	for round := range 2 {
		setAndWait(t, primary.Client(t), "k", round)
		crashed := time.Now()
		primary.Crash()
		promoted, err := g.AwaitFailover(primary, 20*time.Second)
		require.NoError(t, err)
		require.Same(t, replica, promoted)
		t.Logf("round %d: promoted %v after the crash", round, time.Since(crashed).Round(time.Millisecond))
		require.NoError(t, g.Rejoin(primary, promoted, 20*time.Second))
		require.Equal(t, "slave", primary.Role())
		require.Equal(t, int64(round), mustInt(t, primary.Client(t).Get(ctx, "k")), "the rejoined server synced the new primary's data")
		primary, replica = promoted, primary
	}
}

// A cluster with replicas fails a crashed primary over to its replica, and
// the crashed node comes back as a replica of it.
func TestClusterFailsOverAndRejoins(t *testing.T) {
	ctx := context.Background()
	c, stop, err := LaunchCluster(3, 1)
	require.NoError(t, err)
	t.Cleanup(stop)
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { _ = client.Close() })
	slot := int(client.ClusterKeySlot(ctx, "k").Val())
	primary, replica, err := c.Shard(slot)
	require.NoError(t, err)
	require.NotNil(t, replica)
	setAndWait(t, primary.Client(t), "k", "v")

	crashed := time.Now()
	primary.Crash()
	require.NoError(t, c.AwaitFailover(slot, replica, 30*time.Second))
	t.Logf("took over %v after the crash", time.Since(crashed).Round(time.Millisecond))
	now, _, err := c.Shard(slot)
	require.NoError(t, err)
	require.Same(t, replica, now)

	require.NoError(t, c.Rejoin(primary, 30*time.Second))
	require.Equal(t, "slave", primary.Role())
	_, again, err := c.Shard(slot)
	require.NoError(t, err)
	require.Same(t, primary, again, "the crashed node is the new primary's replica")
	require.Equal(t, "v", client.Get(ctx, "k").Val())
	primaries, err := c.Primaries()
	require.NoError(t, err)
	require.Len(t, primaries, 3)
	require.Contains(t, primaries, replica.Addr())
}

// setAndWait sets key on c and waits until the replica has it. WAIT waits
// for the writes of its own connection, so both go on c: on a connection of
// its own it would return at once. A replica that has just synced gets the
// primary's writes only once it acknowledged the sync, up to a second later.
func setAndWait(t *testing.T, c *redis.Client, key string, value any) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, c.Set(ctx, key, value, 0).Err())
	require.Equal(t, int64(1), c.Do(ctx, "WAIT", 1, 5000).Val(), "the replica acknowledged the write")
}

func mustInt(t *testing.T, cmd *redis.StringCmd) int64 {
	t.Helper()
	n, err := cmd.Int64()
	require.NoError(t, err)
	return n
}
