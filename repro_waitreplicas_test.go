package lockreg

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockreg/lockreg/internal/redistest"
)

// TestReproWaitReplicasAfterSlotMigration: with WithWaitReplicas on a
// Redis Cluster, an acquisition runs obtain.lua and WAIT in one pipeline on
// the node client that ClusterClient.MasterForKey names from its cached
// slot map (obtainReplicated). Once the key's slot has moved to another
// primary, that node answers MOVED, which a pipeline on a node client
// neither follows nor reports to the cluster client: the slot map stays
// stale, and every acquisition of the key fails with ErrRedis until other
// traffic through the cluster client, or its reload every 60s, refreshes
// it. A registry without WithWaitReplicas takes the key at once.
func TestReproWaitReplicasAfterSlotMigration(t *testing.T) {
	addrs := redistest.StartClusterWithReplicas(t, 3)
	replicated := newRegistry(t, clusterClient(t, addrs), WithWaitReplicas(1, 100*time.Millisecond), WithRetryInterval(50*time.Millisecond))
	plain := newRegistry(t, clusterClient(t, addrs))
	lock := lockAndUnlock(t, replicated, plain)

	primaries := addrs[:3] // redis-cli --cluster create makes the first three primaries
	m := redistest.BeginSlotMigration(t, primaries, clusterSlot(lock.keys[0]))
	m.Finish(t)
	t.Logf("slot %d moved from %s to %s", m.Slot, m.From, m.To)
	requireTakenWithin(t, plain, 3*time.Second, "without WithWaitReplicas")
	requireTakenWithin(t, replicated, 3*time.Second, "WithWaitReplicas")
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

// TestReproWaitReplicasAfterClusterFailover: the same after a failover.
// MasterForKey keeps naming the killed primary, whose dials fail, so every
// acquisition fails with ErrRedis though the replica serves the slot.
func TestReproWaitReplicasAfterClusterFailover(t *testing.T) {
	c, stop, err := redistest.LaunchCluster(3, 1)
	require.NoError(t, err)
	t.Cleanup(stop)
	replicated := newRegistry(t, clusterClient(t, c.Addrs()), WithWaitReplicas(1, 100*time.Millisecond), WithRetryInterval(50*time.Millisecond))
	plain := newRegistry(t, clusterClient(t, c.Addrs()))
	lock := lockAndUnlock(t, replicated, plain)

	slot := clusterSlot(lock.keys[0])
	primary, replica, err := c.Shard(slot)
	require.NoError(t, err)
	primary.Crash()
	require.NoError(t, c.AwaitFailover(slot, replica, 30*time.Second))
	require.NoError(t, c.Rejoin(primary, 60*time.Second), "the slot has a replica again, for WAIT")
	t.Logf("%s took slot %d over from %s, which is back as its replica", replica.Addr(), slot, primary.Addr())
	requireTakenWithin(t, plain, 3*time.Second, "without WithWaitReplicas")
	requireTakenWithin(t, replicated, 3*time.Second, "WithWaitReplicas")
}
