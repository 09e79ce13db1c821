package lockreg

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/lockreg/lockreg/internal/protocol"
	"github.com/lockreg/lockreg/internal/redistest"
)

// evictingServer starts a server that may evict keys with a TTL.
func evictingServer(t *testing.T) *redistest.Server {
	t.Helper()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	ctx := context.Background()
	require.NoError(t, admin.ConfigSet(ctx, "maxmemory", "20mb").Err())
	require.NoError(t, admin.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err())
	return srv
}

func TestAnEvictingServerIsRefused(t *testing.T) {
	srv := evictingServer(t)
	r := newRegistry(t, srv.Client(t))
	err := r.Do(context.Background(), "k", func(context.Context) error {
		t.Error("fn ran on a server that may evict its key")
		return nil
	})
	require.ErrorIs(t, err, ErrServerEvicts)
	require.ErrorContains(t, err, "allkeys-lru")
}

func TestWithEvictionAllowedAnEvictionIsALoss(t *testing.T) {
	ctx := context.Background()
	srv := evictingServer(t)
	client := srv.Client(t)
	var logs syncBuffer
	r := newRegistry(t, client, WithEvictionAllowed(), WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	h, err := r.Obtain("evicted").Acquire(ctx)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "allkeys-lru") }, 5*time.Second, 10*time.Millisecond, "a warning names the policy")
	// Fill the server until it evicts the lock key.
	value := strings.Repeat("x", 64<<10)
	for i := 0; client.Exists(ctx, h.redisKey()).Val() == 1; i++ {
		require.Less(t, i, 10000, "the server never evicted the lock key")
		require.NoError(t, client.Set(ctx, "filler-"+strconv.Itoa(i), value, 0).Err())
	}
	requireFires(t, h.Lost(), blindLimit, "the holder learns of the eviction at once")
	requireCause(t, h, LossEvicted)
}

func TestAServerThatHidesItsPolicyIsUsedWithAWarning(t *testing.T) {
	ctx := context.Background()
	client := aclClient(t, redistest.Start(t), "+@all", "-info")
	var logs syncBuffer
	r := newRegistry(t, client, WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	require.NoError(t, r.Do(ctx, "k", func(context.Context) error { return nil }))
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "cannot read the servers' eviction policy") }, 5*time.Second, 10*time.Millisecond)
}

// A server whose INFO names no eviction policy (a proxy, a Redis-like
// server that keeps other fields) cannot be judged either: it is used with
// one warning, as one whose INFO the ACL forbids, not asked again every
// retry interval without a word.
func TestAServerWhoseInfoNamesNoPolicyIsUsedWithAWarning(t *testing.T) {
	ctx := context.Background()
	client := redistest.Start(t).Client(t, redistest.Hook{Process: func(next redis.ProcessHook) redis.ProcessHook {
		return func(ctx context.Context, cmd redis.Cmder) error {
			err := next(ctx, cmd)
			if info, ok := cmd.(*redis.StringCmd); ok && cmd.Name() == "info" && err == nil {
				info.SetVal("# Server\r\nredis_version:7.0.0\r\n")
			}
			return err
		}
	}})
	var logs syncBuffer
	r := newRegistry(t, client, WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	require.NoError(t, r.Do(ctx, "k", func(context.Context) error { return nil }))
	warning := "cannot read the servers' eviction policy"
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), warning) }, 5*time.Second, 10*time.Millisecond)
	require.Contains(t, logs.String(), "maxmemory_policy", "the warning says what is missing")
	time.Sleep(300 * time.Millisecond) // three retry intervals
	require.Equal(t, 1, strings.Count(logs.String(), warning), "one warning")
}

// A policy can change while a registry runs (CONFIG SET, a failover to a
// server configured otherwise): a server that now may evict is refused,
// and used again once fixed, as ErrServerEvicts advises.
func TestAServersPolicyIsLookedAtAgain(t *testing.T) {
	ctx := context.Background()
	recheck := policyRecheck
	policyRecheck = 50 * time.Millisecond
	t.Cleanup(func() { policyRecheck = recheck }) // after the registry's Close
	srv := redistest.Start(t)
	admin := srv.Client(t)
	r := newRegistry(t, srv.Client(t))
	do := func() error { return r.Do(ctx, "k", func(context.Context) error { return nil }) }
	require.NoError(t, do())

	require.NoError(t, admin.ConfigSet(ctx, "maxmemory", "20mb").Err())
	require.NoError(t, admin.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err())
	require.Eventually(t, func() bool { return errors.Is(do(), ErrServerEvicts) }, 5*time.Second, 10*time.Millisecond, "refused once it may evict")

	require.NoError(t, admin.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err())
	require.Eventually(t, func() bool { return do() == nil }, 5*time.Second, 10*time.Millisecond, "used again once fixed")
}

// The count of evicted keys that tells an eviction from a deletion is
// read once by the looks at the policy, then by the tracker alone: a look
// between an eviction and the tracker's read of the key would hide it.
func TestALookAtThePolicyHidesNoEviction(t *testing.T) {
	ctx := context.Background()
	srv := evictingServer(t)
	client := srv.Client(t)
	r := newRegistry(t, client, WithEvictionAllowed())
	value := strings.Repeat("x", 64<<10)
	for i := 0; protocol.EvictedKeys(client.Info(ctx, "stats").Val()) == 0; i++ {
		require.Less(t, i, 10000, "the server never evicted")
		require.NoError(t, client.Set(ctx, "filler-"+strconv.Itoa(i), value, 0).Err())
	}
	require.NoError(t, r.readEvictionPolicies(ctx)) // a look at the policy, after the eviction
	require.True(t, r.evictedSince(ctx, srv.Addr(), client), "the tracker still finds the eviction")
}

// On a Cluster, a primary whose policy cannot be read does not hide
// another's that may evict: every primary is judged.
func TestAnEvictingPrimaryIsRefusedBesideOneThatHidesItsPolicy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	addrs := redistest.StartCluster(t, 3)
	for i, addr := range addrs {
		node := redis.NewClient(&redis.Options{Addr: addr})
		defer node.Close()
		rules := []any{"ACL", "SETUSER", "locker", "on", ">pw", "~*", "&*", "+@all"}
		if i == 0 {
			rules = append(rules, "-info")
		}
		require.NoError(t, node.Do(ctx, rules...).Err())
		if i == 1 {
			require.NoError(t, node.ConfigSet(ctx, "maxmemory", "20mb").Err())
			require.NoError(t, node.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err())
		}
	}
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, Username: "locker", Password: "pw"})
	t.Cleanup(func() { _ = client.Close() })
	r := newRegistry(t, client)
	err := r.Do(ctx, "k", func(context.Context) error {
		t.Error("fn ran while a primary may evict lock keys")
		return nil
	})
	require.ErrorIs(t, err, ErrServerEvicts)
	require.ErrorContains(t, err, addrs[1])
}

// Without tracking (a redis.Ring, which the registry cannot clone), a
// registry allowed an evicting server finds an evicted key at its next
// renewal: that loss names the eviction too, as a tracker's read would.
func TestAnUntrackedHolderNamesAnEviction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := evictingServer(t)
	client := srv.Client(t)
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"only": srv.Addr()}})
	t.Cleanup(func() { _ = ring.Close() })
	const lease = 600 * time.Millisecond
	r := newRegistry(t, ring, WithEvictionAllowed(), WithExpireAfter(lease))
	h, err := r.Obtain("evicted").Acquire(ctx)
	require.NoError(t, err)
	value := strings.Repeat("x", 64<<10)
	for i := 0; client.Exists(ctx, h.redisKey()).Val() == 1; i++ {
		require.Less(t, i, 10000, "the server never evicted the lock key")
		require.NoError(t, client.Set(ctx, "filler-"+strconv.Itoa(i), value, 0).Err())
	}
	requireFires(t, h.Lost(), lease/3+blindLimit, "the renewal finds the key gone")
	requireCause(t, h, LossEvicted)
}
