package lockreg

import (
	"context"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/lockreg/lockreg/internal/redistest"
)

// TestRedisCluster runs the registry on a real three-primary Redis Cluster:
// keys on every node, exclusion, renewal, tokens and pub/sub wake-ups
// across nodes.
func TestRedisCluster(t *testing.T) {
	ctx := context.Background()
	addrs := redistest.StartCluster(t, 3)
	newClient := func() *redis.ClusterClient {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	const lease = 600 * time.Millisecond
	a := newRegistry(t, newClient(), WithExpireAfter(lease), WithRetryInterval(5*lease/6))
	b := newRegistry(t, newClient(), WithExpireAfter(lease), WithRetryInterval(5*lease/6))

	// Keys spread over the slots of all three nodes.
	nodes := map[string]bool{}
	admin := newClient()
	var locks []*Lock
	for i := range 30 {
		lock := a.Obtain("order-" + strconv.Itoa(i))
		require.NoError(t, lock.LockContext(ctx))
		locks = append(locks, lock)
		node, err := admin.MasterForKey(ctx, lock.keys[0])
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
		require.Greater(t, lock.Token(), last)
		last = lock.Token()
		lock.Unlock()
	}
	for _, lock := range locks[6:] {
		require.NoError(t, lock.UnlockContext(ctx))
	}
}

// TestRedisClusterMutualExclusion is the stress test of the core, on a
// cluster, each registry with its own cluster client.
func TestRedisClusterMutualExclusion(t *testing.T) {
	addrs := redistest.StartCluster(t, 3)
	newClient := func() *redis.ClusterClient {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	var registries []*Registry
	for range 3 {
		registries = append(registries, newRegistry(t, newClient(), WithRetryInterval(5*time.Millisecond)))
	}
	requireExclusiveIncrements(t, registries, newClient(), "stress-counter", 4, 50)
}
