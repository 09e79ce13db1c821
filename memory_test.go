package lockreg

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/redis/go-redis/v9"

	"github.com/lockreg/lockreg/internal/redistest"
)

// A server at its memory limit with maxmemory-policy noeviction refuses
// the commands that may grow the data (SET, ZADD, HSET: -OOM), but not
// PEXPIRE, which renew.lua uses: a hold taken before the server filled
// keeps its key. The native renewal is a SET (IFEQ, on Valkey 8.1 and
// Redis 8.4), which the server refuses then: renewing by it alone would
// let the lease run out and lose a hold that Redis would have kept. make
// test runs this on Valkey 8.1, where the renewal is native.
func TestARenewalOnAFullServerKeepsTheHold(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	const lease = 300 * time.Millisecond
	// Untracked (an ACL without CLIENT), so that renewals go on the
	// registry's client, natively where the server can.
	r := newRegistry(t, aclClient(t, srv, "+@all", "-client"), WithExpireAfter(lease), WithRetryInterval(20*time.Millisecond))
	h, err := r.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	require.NoError(t, admin.ConfigSet(ctx, "maxmemory", "1").Err())
	t.Cleanup(func() { _ = admin.ConfigSet(ctx, "maxmemory", "0").Err() })
	require.ErrorContains(t, admin.Set(ctx, "probe", "x", 0).Err(), "OOM", "the server is full")

	time.Sleep(4 * lease)
	requireOpen(t, h.Lost(), "renewed though the server is full")
	require.Equal(t, r.clientID, admin.Get(ctx, h.redisKey()).Val(), "the key is still the registry's")
	require.NoError(t, h.Release(ctx), "the release deletes the key, which needs no memory")
	require.ErrorIs(t, admin.Get(ctx, h.redisKey()).Err(), redis.Nil)
}
