package lockreg

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/lockreg/lockreg/internal/protocol"
	"github.com/lockreg/lockreg/internal/redistest"
)

// TestAClientThatReadsFromReplicas: a Cluster client with ReadOnly sends
// reads to replicas, which may lag. The replica here lags by a paused
// replication stream (CLIENT PAUSE WRITE on the replica holds its
// primary's writes back, and serves reads).
func TestAClientThatReadsFromReplicas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := launchCluster(t, 1)
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), ReadOnly: true})
	t.Cleanup(func() { _ = client.Close() })
	r := newRegistry(t, client)
	l := r.Obtain("k")
	primary, replica, err := c.Shard(protocol.Slot(l.keys().Lock()))
	require.NoError(t, err)
	fence := l.keys().Fence()
	require.NoError(t, primary.Client(t).Set(ctx, fence, "1", 0).Err())
	acked, err := primary.Client(t).Do(ctx, "wait", 1, 5000).Int()
	require.NoError(t, err)
	require.Equal(t, 1, acked, "the replica has the first token")
	require.NoError(t, replica.Client(t).Do(ctx, "client", "pause", 5000, "write").Err())
	t.Cleanup(func() { _ = replica.Client(t).Do(ctx, "client", "unpause").Err() })
	require.NoError(t, primary.Client(t).Set(ctx, fence, "2", 0).Err())

	// The read that judges a grant behind a hold (grantIsLast: is the
	// key's last token still the grant's?) must see the primary's fence,
	// or a grant that went behind the holder's back is not told, and one
	// that did not is told.
	t.Run("JudgesGrantsOnThePrimary", func(t *testing.T) {
		require.True(t, r.grantIsLast(ctx, l, 2), "the primary's last token is the grant's")
		require.False(t, r.grantIsLast(ctx, l, 1), "the token the replica still has is not the last")
	})
	// An operator's look must not show a lock free that is held: the
	// pipeline's TIME, which is no read, sends it to the primary.
	t.Run("InspectsThePrimary", func(t *testing.T) {
		require.NoError(t, primary.Client(t).Set(ctx, l.keys().Lock(), "holder", time.Minute).Err())
		info, err := r.Inspect(ctx, "k")
		require.NoError(t, err)
		require.True(t, info.Held)
		require.Equal(t, "holder", info.OwnerID)
		require.EqualValues(t, 2, info.Token)
		n := 0
		for info, err := range r.Locks(ctx) {
			require.NoError(t, err)
			require.Equal(t, "holder", info.OwnerID)
			n++
		}
		require.Equal(t, 1, n)
	})
	// A read that a slot's migration redirected (ASK) is sent again
	// through the cluster client, which would send it to a replica of the
	// slot's old primary: that replica knows nothing of the migration, and
	// lags besides. It must follow the migration to the new primary.
	t.Run("FollowsAMigratingSlotToItsNewPrimary", func(t *testing.T) {
		primaries, err := c.Primaries()
		require.NoError(t, err)
		m := redistest.BeginSlotMigration(t, primaries, protocol.Slot(l.keys().Lock()))
		m.MoveThisKey(t, fence)
		require.True(t, r.grantIsLast(ctx, l, 2), "the new primary's last token is the grant's")
		require.False(t, r.grantIsLast(ctx, l, 1))
	})
}
